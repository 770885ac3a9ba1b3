"""ImageNet (ILSVRC2012) in its two real layouts, listed and checked, and
small files generated in both; the decoding pipelines are each ecosystem's
(frameworks/tensorflow/tf_imagenet.py, frameworks/torch/torch_imagenet.py).

- imagenet-jpeg: the folder tree torchvision's ImageFolder reads,
  `train/<wnid>/*.JPEG`, and `val/` as the same tree (after the usual
  valprep.sh) or flat `val/*.JPEG` with Kaggle's `LOC_val_solution.csv`
  (`ImageId,PredictionString`, the string's first word the wnid). A class's
  label is its wnid's place among the sorted `train/` folders.
- imagenet-tfrecord: the shards `build_imagenet_data.py` writes for
  tf_cnn_benchmarks and the TF models garden, `train-00000-of-01024` and
  `validation-00000-of-00128`, each record a tf.train.Example with
  `image/encoded` (JPEG bytes) and `image/class/label` (1..1000: 0 is the
  background class those scripts reserve, so the readers subtract one).

Unlike the other data sets, nothing is read into memory: a split is its
files, decoded while training. What can be checked when the files are
listed is checked here, in one line naming the file (DataError): an image
outside a class folder, a validation image without a label, a missing
shard. A file found bad while decoding is named by the pipeline.
"""

from __future__ import annotations

import csv
import os
import re
from dataclasses import dataclass

import numpy as np

from trainscale.core.data_error import DataError
from trainscale.core.tfrecord import example, write_records

JPEG_SUFFIXES = (".jpeg", ".jpg")
# Evaluation's crop in both ecosystems: the central 87.5 % (224 of 256), as
# ResNet's reference does.
CENTRAL_FRACTION = 0.875
SPLIT_FOLDERS = {"train": "train", "test": "val"}
SHARD_PREFIXES = {"train": "train", "test": "validation"}
_SHARD = re.compile(r"^(?P<prefix>train|validation)-(?P<index>\d{5})-of-(?P<total>\d{5})$")
# The first classes of ILSVRC2012, by WordNet id: tench, goldfish, great white
# shark, tiger shark, hammerhead, electric ray, stingray, cock.
WNIDS = ("n01440764", "n01443537", "n01484850", "n01491361",
         "n01494475", "n01496331", "n01498041", "n01514668")  # fmt: skip


@dataclass(frozen=True)
class ImageFiles:
    """A split of JPEG files and their labels (0-based), or of TFRecord
    shards (`labels` None: each record holds its own)."""

    paths: tuple[str, ...]
    labels: np.ndarray | None
    layout: str  # "jpeg" or "tfrecord"

    def __len__(self) -> int:
        return len(self.paths)


def _is_jpeg(name: str) -> bool:
    return name.lower().endswith(JPEG_SUFFIXES)


def _class_folders(root: str) -> list[str]:
    return sorted(e.name for e in os.scandir(root) if e.is_dir())


def _folder_tree(root: str, classes: list[str]) -> tuple[list[str], list[int]]:
    """Every JPEG under root/<wnid>/, labelled by its wnid's place in `classes`."""
    paths, labels = [], []
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.is_file() and _is_jpeg(entry.name):
            raise DataError(f"{entry.path}: an image outside a class folder (<wnid>/) has no label")
        if not entry.is_dir():
            continue
        if entry.name not in classes:
            raise DataError(f"{entry.path}: class {entry.name} is not one of train/'s classes")
        names = sorted(n for n in os.listdir(entry.path) if _is_jpeg(n))
        paths += [os.path.join(entry.path, n) for n in names]
        labels += [classes.index(entry.name)] * len(names)
    return paths, labels


def _flat_validation(root: str, solution: str, classes: list[str]) -> tuple[list, list]:
    """val/*.JPEG labelled by LOC_val_solution.csv."""
    with open(solution, newline="") as handle:
        rows = csv.DictReader(handle)
        wnid_of = {row["ImageId"]: row["PredictionString"].split()[0] for row in rows}
    paths, labels = [], []
    for name in sorted(n for n in os.listdir(root) if _is_jpeg(n)):
        image_id = os.path.splitext(name)[0]
        if image_id not in wnid_of:
            raise DataError(f"{os.path.join(root, name)}: no label in {solution}")
        if wnid_of[image_id] not in classes:
            raise DataError(f"{solution}: {image_id}'s class {wnid_of[image_id]} is not in train/")
        paths.append(os.path.join(root, name))
        labels.append(classes.index(wnid_of[image_id]))
    return paths, labels


def jpeg_files(data_dir: str, split: str) -> ImageFiles:
    """The split's JPEGs (train/ or val/ under data_dir) and their labels."""
    train = os.path.join(data_dir, "train")
    if not os.path.isdir(train):
        raise DataError(f"--data-dir {data_dir!r} holds no ImageNet train/<wnid>/ folders")
    classes = _class_folders(train)
    root = os.path.join(data_dir, SPLIT_FOLDERS[split])
    solution = os.path.join(data_dir, "LOC_val_solution.csv")
    if split == "test" and os.path.isfile(solution) and not _class_folders(root):
        paths, labels = _flat_validation(root, solution, classes)
    else:
        paths, labels = _folder_tree(root, classes)
    if not paths:
        raise DataError(f"{root}: no JPEG images (*.JPEG) in its class folders")
    return ImageFiles(tuple(paths), np.asarray(labels, np.int32), "jpeg")


def tfrecord_files(data_dir: str, split: str) -> ImageFiles:
    """The split's shards, every one of `-of-N` present."""
    prefix = SHARD_PREFIXES[split]
    found = {}
    for name in os.listdir(data_dir) if os.path.isdir(data_dir) else ():
        match = _SHARD.match(name)
        if match and match["prefix"] == prefix:
            found[int(match["index"])] = (name, int(match["total"]))
    if not found:
        raise DataError(f"--data-dir {data_dir!r} holds no {prefix}-NNNNN-of-NNNNN TFRecord shards")
    total = next(iter(found.values()))[1]
    for index in range(total):
        if index not in found:
            missing = f"{prefix}-{index:05d}-of-{total:05d}"
            where = os.path.join(data_dir, missing)
            raise DataError(f"{where}: shard missing ({len(found)} of {total} there)")
    paths = tuple(os.path.join(data_dir, found[i][0]) for i in range(total))
    return ImageFiles(paths, None, "tfrecord")


@dataclass(frozen=True)
class Pipeline:
    """What one process's input pipeline decodes, in either ecosystem."""

    shard_index: int  # this pipeline's shard of the files ...
    num_shards: int  # ... of this many
    batch_size: int
    seed: int  # the shard order's and the crops'
    image_size: int  # the side each crop is resized to
    augment: bool  # a random-resized crop and flip; else the central crop
    workers: int  # decoding processes (torch) or parallel calls (tf.data; 0: autotuned)


# A torch DataLoader's worker hands each batch to its rank over a Unix socket
# in the temp folder (multiprocessing's resource sharer:
# TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX). Past the 107 bytes of a socket's
# path (Linux), its bind fails in the worker's queue thread, the batch never
# comes, and the rank waited for it until its watchdog (a 76-character
# TMPDIR here; 75 trained).
SOCKET_PATH_LIMIT = 107
WORKER_SOCKET_SUFFIX = len("/pymp-XXXXXXXX/listener-XXXXXXXX")


def check_worker_sockets_fit(temp: str) -> None:
    """Refuse, in one line, a temp folder whose path leaves a worker's socket
    no room (WORKER_SOCKET_SUFFIX)."""
    room, length = SOCKET_PATH_LIMIT - WORKER_SOCKET_SUFFIX, len(os.fsencode(temp))
    if length > room:
        raise DataError(
            f"the temp folder {temp} is {length} bytes long; the decoding "
            f"workers' sockets need one of at most {room}: set TMPDIR to a shorter one, "
            "or --loader-workers 0"
        )


def decode_only_rate(batches, count: int) -> float:
    """Images per second an iterator of (images, labels) batches yields
    alone, over `count` batches after a first one (its workers' start)."""
    import time

    size = len(next(batches)[1])
    start = time.perf_counter()
    for _ in range(count):
        next(batches)
    return count * size / (time.perf_counter() - start)


def pipeline(settings, shard_index: int, num_shards: int, batch_size: int) -> Pipeline:
    """A run's pipeline for one shard, from its settings (RunSettings)."""
    augment = settings.augmentation != "none"
    return Pipeline(shard_index, num_shards, batch_size, settings.seed, settings.image_size,
                    augment, settings.loader_workers)  # fmt: skip


@dataclass(frozen=True)
class ImageNetRelease:
    layout: str  # "jpeg" or "tfrecord"

    def find(self, data_dir: str, dataset: str) -> str:
        if not os.path.isdir(data_dir):
            raise DataError(f"--data-dir {data_dir!r} does not exist: {dataset}'s files go there")
        return data_dir

    def read(self, path: str, split: str, num_classes: int) -> ImageFiles:
        return (jpeg_files if self.layout == "jpeg" else tfrecord_files)(path, split)


# --------------------------------------------------------------------------
# Small files in the real formats
# --------------------------------------------------------------------------


# ILSVRC2012's training images average about 400 x 350 pixels.
IMAGENET_LIKE_SIDES = (250, 500)


def _image(rng: np.random.Generator, label: int, sides: tuple[int, int]):
    """A random RGB picture of a random size, tinted by its class: smooth
    shapes under pixel noise, so that its JPEG holds about as many bytes a
    pixel as a photograph's (ImageNet's: about 110 KB at 400 x 350), and
    decoding it costs what decoding one does."""
    from PIL import Image

    height, width = (int(side) for side in rng.integers(sides[0], sides[1] + 1, size=2))
    coarse = rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
    coarse[..., label % 3] = np.maximum(coarse[..., label % 3], 160)
    smooth = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC))
    noise = rng.normal(0, 24, size=smooth.shape)
    return Image.fromarray(np.clip(smooth + noise, 0, 255).astype(np.uint8))


def _jpeg_bytes(picture) -> bytes:
    import io

    buffer = io.BytesIO()
    picture.save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def generate_imagenet(
    data_dir: str,
    classes: int = 4,
    per_class: int = 8,
    shards: int = 2,
    seed: int = 0,
    sides: tuple[int, int] = (40, 96),
) -> str:
    """Write both layouts of a small ImageNet into data_dir: train/ and val/
    trees of JPEGs (val a quarter the size), and the same JPEG bytes as
    `shards` TFRecord shards per split with build_imagenet_data.py's fields.
    Each image's sides are drawn from `sides` (IMAGENET_LIKE_SIDES: what
    decoding costs on ImageNet's; the tests' default: small and quick)."""
    rng = np.random.default_rng(seed)
    for split, count in (("train", per_class), ("test", max(1, per_class // 4))):
        records = []
        for label, wnid in enumerate(WNIDS[:classes]):
            folder = os.path.join(data_dir, SPLIT_FOLDERS[split], wnid)
            os.makedirs(folder, exist_ok=True)
            for index in range(count):
                picture = _image(rng, label, sides)
                encoded = _jpeg_bytes(picture)
                name = f"{wnid}_{index}.JPEG"
                with open(os.path.join(folder, name), "wb") as handle:
                    handle.write(encoded)
                records.append(example({
                    "image/encoded": encoded, "image/format": b"JPEG",
                    "image/class/label": label + 1, "image/class/synset": wnid.encode(),
                    "image/height": picture.height, "image/width": picture.width,
                    "image/colorspace": b"RGB", "image/channels": 3,
                    "image/filename": name.encode(),
                }))  # fmt: skip
        order = rng.permutation(len(records))  # build_imagenet_data.py shuffles too
        prefix = SHARD_PREFIXES[split]
        for shard in range(shards):
            path = os.path.join(data_dir, f"{prefix}-{shard:05d}-of-{shards:05d}")
            write_records(path, (records[i] for i in order[shard::shards]))
    return data_dir


def generated_marker(data_dir: str, shards: int = 2) -> str:
    """The file generate_imagenet writes last: a workflow's train jobs wait for it."""
    return os.path.join(data_dir, f"validation-{shards - 1:05d}-of-{shards:05d}")
