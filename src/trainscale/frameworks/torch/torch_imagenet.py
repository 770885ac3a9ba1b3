"""ImageNet's JPEG tree through a torch DataLoader: worker processes decode
with Pillow (as torchvision's ImageFolder does: open, to RGB), crop a
random 8-100 % of the area at 3:4 to 4:3, resize it to the model's side and
flip it (torchvision's RandomResizedCrop and RandomHorizontalFlip, the
reference ResNet-50 training), in pinned memory when a GPU takes it.

Not torchvision itself: PyPI's build of the release that pairs with this
torch is built against CUDA torch, and with the CPU one its import fails
(tools/install-torch-env.sh). The TFRecord shards are TensorFlow's layout:
the torch frameworks read the JPEG tree.
"""

from __future__ import annotations

import contextlib
import math
import tempfile

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from trainscale.core.data_error import DataError
from trainscale.core.imagenet import (
    CENTRAL_FRACTION,
    ImageFiles,
    Pipeline,
    check_worker_sockets_fit,
)
from trainscale.harness.data import shard_indices

SCALE, RATIO, ATTEMPTS = (0.08, 1.0), (3 / 4, 4 / 3), 10


def random_resized_box(width: int, height: int, rng: np.random.Generator) -> tuple:
    """torchvision's RandomResizedCrop.get_params: (left, top, right, bottom)."""
    area = width * height
    log_ratio = (math.log(RATIO[0]), math.log(RATIO[1]))
    for _ in range(ATTEMPTS):
        target = area * rng.uniform(*SCALE)
        aspect = math.exp(rng.uniform(*log_ratio))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            left, top = int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1))
            return left, top, left + w, top + h
    # Fallback: the whole image's central crop at the nearest allowed ratio.
    ratio = width / height
    w, h = (width, height)
    if ratio < RATIO[0]:
        h = round(width / RATIO[0])
    elif ratio > RATIO[1]:
        w = round(height * RATIO[1])
    left, top = (width - w) // 2, (height - h) // 2
    return left, top, left + w, top + h


def central_box(width: int, height: int) -> tuple:
    w, h = round(width * CENTRAL_FRACTION), round(height * CENTRAL_FRACTION)
    left, top = (width - w) // 2, (height - h) // 2
    return left, top, left + w, top + h


class JpegFiles(Dataset):
    """Example i of a shard: (uint8 HWC image at image_size, label). The
    crop and flip are drawn from (seed, epoch, file index), whichever worker
    decodes it."""

    def __init__(self, files: ImageFiles, indices, image_size: int, seed: int, augment: bool):
        self.files, self.indices = files, np.asarray(indices)
        self.image_size, self.seed, self.augment = image_size, seed, augment

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, position: int):
        from PIL import Image, UnidentifiedImageError

        index = int(self.indices[position % len(self.indices)])
        path = self.files.paths[index]
        try:
            with open(path, "rb") as handle:
                picture = Image.open(handle)
                picture.load()  # decoded here, where a bad file is named
        except (UnidentifiedImageError, OSError, SyntaxError) as err:
            why = str(err)  # which names the file too, by its handle or its name
            for named in (f" <_io.BufferedReader name={path!r}>", f" {path!r}"):
                why = why.replace(named, "")
            raise DataError(f"{path}: not a readable JPEG ({why})") from None
        if picture.mode != "RGB":  # an RGB JPEG's convert("RGB") is a copy of it
            picture = picture.convert("RGB")
        rng = np.random.default_rng([self.seed, position // len(self.indices), index])
        if self.augment:
            box, flip = random_resized_box(*picture.size, rng), rng.random() < 0.5
        else:
            box, flip = central_box(*picture.size), False
        # Cropped, then resized: resize(box=...) would read past the box's
        # edges (Pillow clamps its filter to the image, not the box). Flipped
        # after, as torchvision's RandomHorizontalFlip follows its crop.
        picture = picture.crop(box).resize((self.image_size,) * 2, Image.BILINEAR)
        if flip:
            picture = picture.transpose(Image.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.asarray(picture).copy()), int(self.files.labels[index])


def jpeg_loader(
    files: ImageFiles, pipeline: Pipeline, pin_memory: bool, epochs: int = 1_000_000
) -> DataLoader:
    """Batches of (uint8 NHWC images, int64 labels) from this shard, in
    harness.data's shard order, epoch after epoch; each batch whole."""
    if files.layout != "jpeg":
        raise DataError(
            "the torch frameworks read ImageNet's JPEG tree (--dataset imagenet-jpeg); "
            "TFRecord shards are TensorFlow's"
        )
    p = pipeline
    if p.workers:
        check_worker_sockets_fit(tempfile.gettempdir())
    indices = shard_indices(len(files), p.shard_index, p.num_shards, p.seed)
    dataset = JpegFiles(files, indices, p.image_size, p.seed, p.augment)
    # An epoch is the shard once; positions past it are the next epochs.
    positions = range(len(indices) * epochs)
    return DataLoader(
        torch.utils.data.Subset(dataset, positions),
        batch_size=p.batch_size,
        drop_last=True,
        num_workers=p.workers,
        pin_memory=pin_memory,
        persistent_workers=p.workers > 0,
        prefetch_factor=2 if p.workers else None,
    )


def batches_of(loader: DataLoader):
    """The loader's batches; a worker's DataError raised again as its own one
    line (the DataLoader re-raises it under a line naming the worker). Its
    workers end with it (closed, exhausted or failed: stop_workers)."""
    try:
        yield from loader
    except DataError as err:
        lines = str(err).strip().splitlines()
        raise DataError(lines[-1].split("DataError: ", 1)[-1]) from None
    finally:
        stop_workers(loader)


def batches_on(loader: DataLoader, device, prepare_images):
    """The loader's batches copied to `device` and laid out for the model
    (prepare_images); closing it closes the loader's (batches_of)."""
    with contextlib.closing(batches_of(loader)) as decoded:
        for images, labels in decoded:
            on_device = images.to(device, non_blocking=True)
            yield prepare_images(on_device), labels.to(device, non_blocking=True)


def stop_workers(loader: DataLoader) -> None:
    """End the loader's worker processes now, each through its own exit,
    which removes the folder multiprocessing made it in the temp folder
    (pymp-*). A rank that ends with os._exit (trainscale.core.process_exit)
    takes live workers down with it, and their folders stayed behind. torch
    has no public call for it: a loader with persistent workers keeps its
    one iterator, and this is that iterator's own shutdown."""
    iterator = getattr(loader, "_iterator", None)
    if hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
