"""Data sets by name, and safe readers of their real release formats.

Each data set is one `Dataset` entry in DATASETS: its classes, channels,
native side, the per-channel statistics its images are normalised with, its
standard augmentation, and the release format its files come in:

- cifar100, cifar10: the `cifar-100-python` and `cifar-10-python` releases, a
  folder (or the `.tar.gz` archive holding it) of Python pickles, each a dict
  with `data` (N x 3072 uint8: the R, G and B planes of each 32x32 image in
  turn) and the labels (`fine_labels`; CIFAR-10's `labels`). Pickle can run
  code, so the reader admits only the few types those files need
  (_SafeUnpickler).
- mnist, fashion-mnist, digits: the IDX files of LeCun's MNIST release
  (`train-images-idx3-ubyte`, `train-labels-idx1-ubyte`, `t10k-…` for the
  test split), gzipped (`.gz`) or not. `digits` is scikit-learn's copy of the
  UCI handwritten digits (1,797 real 8x8 images), written out in that format
  by write_digits, so that the real IDX reader is what reads it.
- wikitext-103, wikitext-2, python-docs: text, for the text models
  (trainscale.core.text_data: WikiText's raw format, byte-level tokens).
- sdss17: SDSS DR17's stellar classification table (star, galaxy, quasar),
  one CSV (trainscale.core.sdss): each row's 8 standardised features as a
  1x1 image of 8 channels.
- imagenet-jpeg, imagenet-tfrecord: ILSVRC2012 as its folder tree of JPEGs
  or as TFRecord shards (trainscale.core.imagenet): files listed, not
  loaded, and decoded while training (`streams`).
- synthetic: no files; random batches (trainscale.harness.data.synthetic_batch),
  or random tokens for a text model.

A bad file is refused in one line naming it (DataError): truncated, a wrong
magic number or shape, a label out of range, a pickle that asks for anything
but arrays. Nothing is run and no record is written.

Grayscale data sets (channels 1) meet the models with a one-channel stem: the
first layer takes one channel and nothing is replicated. That is seed 003's
small CNN on MNIST as published (21,840 parameters); the record says it
(`input_channels`).
"""

from __future__ import annotations

import io
import os
import pickle
import tarfile
from dataclasses import dataclass

import numpy as np

from trainscale.core.data_error import DataError, check_labels
from trainscale.core.idx import IdxRelease
from trainscale.core.imagenet import ImageNetRelease
from trainscale.core.sdss import CLASSES, FEATURES, SdssRelease
from trainscale.core.text_data import BYTE_VOCABULARY, PYTHON_DOCS, WikiTextRelease

SPLITS = ("train", "test")


# --------------------------------------------------------------------------
# The CIFAR releases: pickles, read by a restricted unpickler
# --------------------------------------------------------------------------

# What a NumPy array inside a pickle needs, and nothing else: no os.system, no
# builtins.eval, no arbitrary class. Anything outside this list is refused.
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("_codecs", "encode"),  # how Python 3 pickles bytes at protocol < 3
}


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise DataError(
            f"refusing to load {module}.{name} from a CIFAR file: "
            "only NumPy arrays, bytes, lists and dicts are allowed"
        )


def _unpickle(blob: bytes, where: str) -> dict:
    try:
        obj = _SafeUnpickler(io.BytesIO(blob), encoding="bytes").load()
    except DataError as err:
        raise DataError(f"{where}: {err}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as err:
        raise DataError(f"{where}: not a readable CIFAR pickle ({err})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a dict, found {type(obj).__name__}")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in obj.items()}


@dataclass(frozen=True)
class CifarRelease:
    folder: str  # the folder inside the archive
    archive: str
    members: dict  # split -> the pickles that hold it, in order
    label_key: str
    meta: tuple  # (member, key of the class names)

    def find(self, data_dir: str, dataset: str) -> str:
        """The release's folder or archive inside `data_dir`."""
        candidates = [os.path.join(data_dir, self.folder), os.path.join(data_dir, self.archive)]
        if os.path.basename(os.path.normpath(data_dir)) == self.folder:
            candidates.insert(0, data_dir)
        for path in candidates:
            first = self.members["train"][0]
            if os.path.isdir(path) and os.path.isfile(os.path.join(path, first)):
                return path
            if os.path.isfile(path):
                return path
        raise DataError(
            f"--data-dir {data_dir!r} holds no {dataset} ({self.folder}/ or {self.archive}); "
            "download it there or use --dataset synthetic"
        )

    def _member(self, path: str, member: str) -> bytes:
        if os.path.isdir(path):
            try:
                with open(os.path.join(path, member), "rb") as handle:
                    return handle.read()
            except FileNotFoundError:
                raise DataError(f"{path}: no {member}") from None
        try:
            with tarfile.open(path, "r:*") as archive:
                handle = archive.extractfile(f"{self.folder}/{member}")
                if handle is None:
                    raise DataError(f"{path}: {self.folder}/{member} is not a file")
                return handle.read()
        except KeyError:
            raise DataError(f"{path}: no {self.folder}/{member} in the archive") from None
        except (tarfile.TarError, EOFError, OSError) as err:
            raise DataError(f"{path}: truncated or unreadable archive ({err})") from None

    def class_names(self, path: str, num_classes: int) -> list[str]:
        """The names its meta pickle gives the labels (CIFAR-10's "automobile", "cat"...)."""
        member, key = self.meta
        where = os.path.join(path, member) if os.path.isdir(path) else f"{path}:{member}"
        names = _unpickle(self._member(path, member), where).get(key)
        if not isinstance(names, list) or len(names) != num_classes:
            raise DataError(f"{where}: {key} must list the {num_classes} class names")
        return [name.decode() if isinstance(name, bytes) else str(name) for name in names]

    def read(self, path: str, split: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
        parts = [self._read_member(path, m, num_classes) for m in self.members[split]]
        return tuple(np.concatenate(columns) for columns in zip(*parts))

    def _read_member(self, path: str, member: str, num_classes: int):
        # The file a user would open: the pickle, or the archive and its member.
        where = os.path.join(path, member) if os.path.isdir(path) else f"{path}:{member}"
        entry = _unpickle(self._member(path, member), where)
        try:
            data = np.asarray(entry["data"])
            labels = np.asarray(entry[self.label_key], dtype=np.int64)
        except KeyError as err:
            raise DataError(f"{where}: missing key {err}") from None
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
            raise DataError(
                f"{where}: data must be N x 3072 uint8, found {data.shape} {data.dtype}"
            )
        if labels.shape != (data.shape[0],):
            raise DataError(f"{where}: {labels.shape[0]} labels for {data.shape[0]} images")
        check_labels(labels, num_classes, where)
        images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        return np.ascontiguousarray(images), labels.astype(np.int32)

    def write(self, data_dir: str, splits: dict, num_classes: int, archive: bool) -> str:
        """Write {split: (images, labels)} in this release's exact format (tests, demos)."""
        payloads = {}
        for split, (images, labels) in splits.items():
            members = self.members[split]
            chunks = np.array_split(np.arange(len(images)), len(members))
            for member, chunk in zip(members, chunks):  # equal lengths: array_split
                payloads[member] = _cifar_pickle(images[chunk], labels[chunk], self.label_key)
        member, key = self.meta
        names = [f"class_{i}".encode() for i in range(num_classes)]
        payloads[member] = pickle.dumps({key.encode(): names}, protocol=2)
        os.makedirs(data_dir, exist_ok=True)
        if archive:
            path = os.path.join(data_dir, self.archive)
            with tarfile.open(path, "w:gz") as tar:
                for name, payload in payloads.items():
                    info = tarfile.TarInfo(f"{self.folder}/{name}")
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
            return path
        folder = os.path.join(data_dir, self.folder)
        os.makedirs(folder, exist_ok=True)
        for name, payload in payloads.items():
            with open(os.path.join(folder, name), "wb") as handle:
                handle.write(payload)
        return folder


def _cifar_pickle(images: np.ndarray, labels: np.ndarray, label_key: str) -> bytes:
    # The real releases are Python 2 pickles; protocol 2 with the same keys
    # keeps the byte layout a reader meets in the wild.
    images = np.asarray(images, dtype=np.uint8)
    entry = {
        b"filenames": [f"image_{i}.png".encode() for i in range(len(images))],
        b"batch_label": b"batch 1 of 1",
        label_key.encode(): [int(x) for x in labels],
        b"data": images.transpose(0, 3, 1, 2).reshape(len(images), -1),
    }
    if label_key == "fine_labels":
        entry[b"coarse_labels"] = [int(x) // 5 for x in labels]
    return pickle.dumps(entry, protocol=2)


# --------------------------------------------------------------------------
# The data sets
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Dataset:
    name: str
    num_classes: int  # a text data set's: its tokenizer's vocabulary
    channels: int  # 1: grayscale, fed to a one-channel stem
    native_size: int  # side of the images as released
    mean: tuple  # per channel, of the training images scaled to 0..1
    std: tuple
    augmentation: str  # "crop-and-flip": pad 4, random crop, flip; or "none"
    release: CifarRelease | IdxRelease | WikiTextRelease | SdssRelease | ImageNetRelease | None
    # What the text models read (trainscale.core.text_data); images otherwise.
    is_text: bool = False
    # A table: each row's features as a 1x1 input of `channels` (trainscale.core.sdss).
    is_table: bool = False

    def find(self, data_dir: str) -> str:
        return self.release.find(data_dir, self.name)

    @property
    def streams(self) -> bool:
        """Its files are decoded while training (core.imagenet.ImageFiles), not loaded first."""
        return isinstance(self.release, ImageNetRelease)

    def class_names(self, data_dir: str) -> list[str]:
        """Each label's name: CIFAR's meta file's, SDSS's classes; elsewhere
        the label (IDX names none)."""
        if isinstance(self.release, (CifarRelease, SdssRelease)):
            return self.release.class_names(self.find(data_dir), self.num_classes)
        return [str(label) for label in range(self.num_classes)]

    def load(self, data_dir: str, split: str = "train"):
        """A split as (N, side, side, channels) uint8 images and (N,) int32
        labels; a text data set's as its tokens (text_data.token_windows
        cuts them into examples)."""
        return self.release.read(self.find(data_dir), split, self.num_classes)


_CIFAR = dict(channels=3, native_size=32, augmentation="crop-and-flip")
_GRAY = dict(channels=1, native_size=28, augmentation="none", release=IdxRelease())
_TEXT = dict(channels=0, native_size=0, mean=(), std=(), augmentation="none", is_text=True)
DATASETS = {
    d.name: d
    for d in (
        Dataset("cifar100", 100, mean=(0.5071, 0.4865, 0.4409), std=(0.2673, 0.2564, 0.2762),
                release=CifarRelease("cifar-100-python", "cifar-100-python.tar.gz",
                                     {"train": ("train",), "test": ("test",)}, "fine_labels",
                                     ("meta", "fine_label_names")), **_CIFAR),
        Dataset("cifar10", 10, mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616),
                release=CifarRelease("cifar-10-batches-py", "cifar-10-python.tar.gz",
                                     {"train": tuple(f"data_batch_{i}" for i in range(1, 6)),
                                      "test": ("test_batch",)}, "labels",
                                     ("batches.meta", "label_names")), **_CIFAR),
        Dataset("mnist", 10, mean=(0.1307,), std=(0.3081,), **_GRAY),
        Dataset("fashion-mnist", 10, mean=(0.2860,), std=(0.3530,), **_GRAY),
        Dataset("digits", 10, mean=(0.3055,), std=(0.3760,),
                **{**_GRAY, "native_size": 8}),
        # Text: bytes for tokens; WikiText's raw releases, and Python's own
        # reference written in their format (text_data.write_python_docs).
        Dataset("wikitext-103", BYTE_VOCABULARY, **_TEXT,
                release=WikiTextRelease("wikitext-103-raw", "wikitext-103-raw-v1.zip")),
        Dataset("wikitext-2", BYTE_VOCABULARY, **_TEXT,
                release=WikiTextRelease("wikitext-2-raw", "wikitext-2-raw-v1.zip")),
        Dataset("python-docs", BYTE_VOCABULARY, **_TEXT, release=PYTHON_DOCS),
        # Tabular: float features, standardised by the reader (no statistics here).
        Dataset("sdss17", len(CLASSES), channels=len(FEATURES), native_size=1, mean=(0.0,),
                std=(1.0,), augmentation="none", release=SdssRelease(), is_table=True),
        # ImageNet: ResNet-50's reference training crops a random 8-100 %
        # of each image's area, at 3:4 to 4:3, resizes it and flips it.
        *(Dataset(f"imagenet-{layout}", 1000, channels=3, native_size=224,
                  mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225),
                  augmentation="random-resized-crop-and-flip", release=ImageNetRelease(layout))
          for layout in ("jpeg", "tfrecord")),
        # Random float images, already normalised: no statistics to apply.
        Dataset("synthetic", 100, channels=3, native_size=224, mean=(0.0,), std=(1.0,),
                augmentation="none", release=None),
    )
}  # fmt: skip


def load_dataset(name: str, data_dir: str, split: str = "train"):
    return DATASETS[name].load(data_dir, split)


def write_dataset(name: str, data_dir: str, splits: dict, *, archive: bool = False) -> str:
    """Write {split: (images NHWC uint8, labels)} as data set `name`'s release
    does; `archive`: the CIFAR `.tar.gz`, or gzipped IDX files."""
    dataset = DATASETS[name]
    return dataset.release.write(data_dir, splits, dataset.num_classes, archive)


def generate_cifar100(data_dir: str, num_images: int, seed: int = 0, **kwargs) -> str:
    """Write a small random CIFAR-100 (train, and a test split a fifth its size)."""
    rng = np.random.default_rng(seed)
    splits = {}
    for split, count in (("train", num_images), ("test", max(1, num_images // 5))):
        images = rng.integers(0, 256, size=(count, 32, 32, 3), dtype=np.uint8)
        splits[split] = images, rng.integers(0, 100, size=count)
    return write_dataset("cifar100", data_dir, splits, **kwargs)


def write_digits(data_dir: str, test_every: int = 6) -> str:
    """scikit-learn's UCI digits as gzipped IDX files: every `test_every`-th image
    of a fixed shuffle is the test split (300 of 1,797), the rest train; their
    0..16 grey levels scaled to MNIST's 0..255."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.rint(digits.images * (255 / 16)).astype(np.uint8)[..., None]
    order = np.random.default_rng(0).permutation(len(images))
    test = np.sort(order[::test_every])
    train = np.setdiff1d(np.arange(len(images)), test)
    splits = {s: (images[i], digits.target[i]) for s, i in (("train", train), ("test", test))}
    return write_dataset("digits", data_dir, splits, archive=True)
