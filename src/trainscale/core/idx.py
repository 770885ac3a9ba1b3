"""MNIST's release format: IDX files (`train-images-idx3-ubyte`,
`train-labels-idx1-ubyte`, `t10k-…` for the test split), gzipped (`.gz`) or
not, as LeCun's MNIST page gives it; Fashion-MNIST and the digits use it too
(trainscale.core.datasets). A truncated file or a wrong magic number is
refused in one line naming the file."""

from __future__ import annotations

import gzip
import math
import os
import struct
from dataclasses import dataclass

import numpy as np

from trainscale.core.data_error import DataError, check_labels

# An IDX file starts with two zero bytes, a type code (0x08: unsigned bytes)
# and the number of dimensions; then each dimension as a big-endian uint32.
IDX_IMAGES, IDX_LABELS = 0x00000803, 0x00000801


def read_idx(path: str, magic: int) -> np.ndarray:
    """The array in IDX file `path` (gzipped or not), which must carry `magic`."""
    with open(path, "rb") as handle:
        raw = handle.read()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as err:
            raise DataError(f"{path}: truncated or unreadable gzip ({err})") from None
    if len(raw) < 4 or struct.unpack(">I", raw[:4])[0] != magic:
        found = raw[:4].hex() if len(raw) >= 4 else f"{len(raw)} bytes"
        raise DataError(f"{path}: magic number {found}, expected {magic:08x}: not this IDX file")
    header = 4 + 4 * (magic & 0xFF)
    if len(raw) < header:
        raise DataError(f"{path}: truncated in its header")
    shape = struct.unpack(f">{magic & 0xFF}I", raw[4:header])
    if len(raw) - header != math.prod(shape):
        raise DataError(
            f"{path}: holds {len(raw) - header} bytes of data where its header says "
            f"{' x '.join(map(str, shape))} = {math.prod(shape)}: truncated or padded"
        )
    return np.frombuffer(raw, np.uint8, offset=header).reshape(shape)


def write_idx(path: str, array: np.ndarray) -> None:
    """Write a uint8 array as an IDX file (gzipped when `path` ends in .gz)."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    blob = struct.pack(f">I{array.ndim}I", 0x0800 | array.ndim, *array.shape) + array.tobytes()
    with open(path, "wb") as handle:
        handle.write(gzip.compress(blob, mtime=0) if path.endswith(".gz") else blob)


@dataclass(frozen=True)
class IdxRelease:
    prefix = {"train": "train", "test": "t10k"}

    def files(self, split: str) -> tuple[str, str]:
        return f"{self.prefix[split]}-images-idx3-ubyte", f"{self.prefix[split]}-labels-idx1-ubyte"

    def find(self, data_dir: str, dataset: str) -> str:
        """The folder holding the IDX files: `data_dir` or `data_dir`/<dataset>."""
        images = self.files("train")[0]
        for folder in (data_dir, os.path.join(data_dir, dataset)):
            if any(os.path.isfile(os.path.join(folder, images + gz)) for gz in ("", ".gz")):
                return folder
        raise DataError(
            f"--data-dir {data_dir!r} holds no {dataset} ({images}[.gz] and the other IDX "
            f"files, there or in {dataset}/); put them there or use --dataset synthetic"
        )

    def _path(self, folder: str, name: str) -> str:
        for candidate in (name, name + ".gz"):
            if os.path.isfile(os.path.join(folder, candidate)):
                return os.path.join(folder, candidate)
        raise DataError(f"{folder}: no {name} (or {name}.gz)")

    def read(self, folder: str, split: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
        image_file, label_file = (self._path(folder, name) for name in self.files(split))
        images = read_idx(image_file, IDX_IMAGES)
        labels = read_idx(label_file, IDX_LABELS).astype(np.int32)
        if len(labels) != len(images):
            raise DataError(f"{label_file}: {len(labels)} labels for {len(images)} images")
        check_labels(labels, num_classes, label_file)
        return images[..., None], labels  # NHWC, one channel

    def write(self, data_dir: str, splits: dict, num_classes: int, gz: bool) -> str:
        os.makedirs(data_dir, exist_ok=True)
        suffix = ".gz" if gz else ""
        for split, (images, labels) in splits.items():
            image_file, label_file = self.files(split)
            write_idx(os.path.join(data_dir, image_file + suffix), np.asarray(images)[..., 0])
            write_idx(os.path.join(data_dir, label_file + suffix), np.asarray(labels))
        return data_dir
