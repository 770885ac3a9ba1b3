"""The input pipeline's decode-only rate against a plain script's, same files,
same workers, blocks interleaved (issue 45's goal: >= 0.95 of each).

    .venv-torch/bin/python bench/input_pipeline_bench.py --ecosystem torch
    .venv-train/bin/python bench/input_pipeline_bench.py --ecosystem tensorflow

torch: trainscale's DataLoader over the JPEG tree (torch_imagenet.jpeg_loader)
against the script a PyTorch user writes for torchvision's ImageFolder
(os.walk for the classes, Pillow's open and convert, a random-resized crop
and flip, a resize, to a tensor; torchvision itself cannot be imported
beside the CPU torch here: tools/install-torch-env.sh). TensorFlow:
trainscale's tf.data over the TFRecord shards (tf_imagenet.imagenet_dataset)
against tf_cnn_benchmarks' plain pipeline (TFRecordDataset, parse, decode
and crop, flip, resize, batch, prefetch). Both sides decode the same
generated ImageNet of ImageNet-sized JPEGs. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import interleaved_blocks, median, ratio_interval  # noqa: E402

from trainscale.core.imagenet import (  # noqa: E402
    IMAGENET_LIKE_SIDES,
    Pipeline,
    generate_imagenet,
    jpeg_files,
    tfrecord_files,
)


def block_of(make, batches: int, batch_size: int):
    """A timed block on a pipeline of its own, made for it and dropped after
    it: a pipeline kept between blocks would decode ahead into its buffers
    while the other side's block runs (against it), and serve its next block
    from them. Two batches first, untimed: the workers' start and fill."""

    def block() -> float:
        iterator = make()
        for _ in range(2):
            next(iterator)
        start = time.perf_counter()
        for _ in range(batches):
            next(iterator)
        rate = batches * batch_size / (time.perf_counter() - start)
        del iterator  # its workers end here, not during the next block
        return rate

    return block


def plain_torch(data_dir: str, batch: int, side: int, workers: int):
    """What a user writes for ImageFolder + DataLoader, torchvision's steps by hand."""
    import numpy as np
    import torch
    from PIL import Image

    root = os.path.join(data_dir, "train")
    classes = sorted(os.listdir(root))
    samples = [
        (os.path.join(root, c, name), i)
        for i, c in enumerate(classes)
        for name in sorted(os.listdir(os.path.join(root, c)))
    ]

    class Folder(torch.utils.data.Dataset):
        def __len__(self):
            return len(samples)

        def __getitem__(self, index):
            path, label = samples[index]
            with open(path, "rb") as handle:
                image = Image.open(handle).convert("RGB")
            width, height = image.size
            scale, ratio = random.uniform(0.08, 1.0), random.uniform(3 / 4, 4 / 3)
            w = min(width, round((scale * width * height * ratio) ** 0.5))
            h = min(height, round((scale * width * height / ratio) ** 0.5))
            left, top = random.randint(0, width - w), random.randint(0, height - h)
            # Bilinear, as torchvision's RandomResizedCrop resizes by default.
            image = image.crop((left, top, left + w, top + h)).resize((side, side), Image.BILINEAR)
            if random.random() < 0.5:
                image = image.transpose(Image.FLIP_LEFT_RIGHT)
            return torch.from_numpy(np.asarray(image).copy()), label

    # Epochs as one long pass (a shuffle of each in turn), as trainscale's
    # loader runs them: an epoch's start here would cost the workers' refill
    # every 8 batches of this small set, where ImageNet's are 40,000.
    sampler = torch.utils.data.RandomSampler(range(len(samples)), num_samples=len(samples) * 1000)
    loader = torch.utils.data.DataLoader(
        Folder(), batch_size=batch, sampler=sampler, drop_last=True, num_workers=workers,
        persistent_workers=workers > 0,
    )  # fmt: skip
    return iter(loader)


def plain_tensorflow(data_dir: str, batch: int, side: int, workers: int):
    """tf_cnn_benchmarks' pipeline over the shards, as a plain script."""
    import tensorflow as tf

    def parse(record):
        features = tf.io.parse_single_example(record, {
            "image/encoded": tf.io.FixedLenFeature([], tf.string),
            "image/class/label": tf.io.FixedLenFeature([], tf.int64),
        })  # fmt: skip
        encoded = features["image/encoded"]
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            tf.image.extract_jpeg_shape(encoded), tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
            min_object_covered=0.1, aspect_ratio_range=[0.75, 1.33], area_range=[0.05, 1.0],
            max_attempts=100, use_image_if_no_bounding_boxes=True,
        )  # fmt: skip
        window = tf.stack([begin[0], begin[1], size[0], size[1]])
        image = tf.image.decode_and_crop_jpeg(encoded, window, channels=3)
        image = tf.image.random_flip_left_right(image)
        image = tf.cast(tf.image.resize(image, [side, side]), tf.uint8)
        return image, features["image/class/label"] - 1

    shards = list(tfrecord_files(data_dir, "train").paths)
    dataset = tf.data.TFRecordDataset(shards, num_parallel_reads=len(shards))
    dataset = dataset.shuffle(1024).repeat().map(parse, num_parallel_calls=workers)
    return iter(dataset.batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE))


def ours(ecosystem: str, data_dir: str, pipeline: Pipeline):
    if ecosystem == "torch":
        from trainscale.frameworks.torch.torch_imagenet import batches_of, jpeg_loader

        files = jpeg_files(data_dir, "train")
        return iter(batches_of(jpeg_loader(files, pipeline, pin_memory=False)))
    from trainscale.frameworks.tensorflow.tf_imagenet import imagenet_dataset

    return iter(imagenet_dataset(tfrecord_files(data_dir, "train"), pipeline))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ecosystem", choices=("torch", "tensorflow"), required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--per-class", type=int, default=32, help="images of each of 8 classes")
    parser.add_argument("--batches", type=int, default=8, help="batches a timed block")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    data_dir = generate_imagenet(
        tempfile.mkdtemp(prefix="trainscale-bench-imagenet-"), classes=8,
        per_class=args.per_class, shards=4, sides=IMAGENET_LIKE_SIDES,
    )  # fmt: skip
    pipeline = Pipeline(0, 1, args.batch_size, 0, args.image_size, True, args.workers)
    plain = plain_torch if args.ecosystem == "torch" else plain_tensorflow
    # A seed of its own for each of trainscale's blocks: its order and crops
    # are drawn from the seed, so one seed would decode the same images and
    # windows every block (a window's mean area varies by some 5 % from seed
    # to seed), where the plain side draws new ones each block.
    seeds = itertools.count()
    sides = {
        "trainscale": lambda: ours(
            args.ecosystem, data_dir, dataclasses.replace(pipeline, seed=next(seeds))
        ),
        "plain": lambda: plain(data_dir, args.batch_size, args.image_size, args.workers),
    }
    blocks = {name: block_of(make, args.batches, args.batch_size) for name, make in sides.items()}
    rates = interleaved_blocks(blocks, args.rounds)
    result = {
        "ecosystem": args.ecosystem,
        "workers": args.workers,
        "batch_size": args.batch_size,
        "image_size": args.image_size,
        "images": 8 * args.per_class,
        "trainscale_images_per_sec": median(rates["trainscale"]),
        "plain_images_per_sec": median(rates["plain"]),
        "ratio": median(rates["trainscale"]) / median(rates["plain"]),
        "ratio_interval_95": ratio_interval(rates["trainscale"], rates["plain"]),
        "block_rates": rates,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
