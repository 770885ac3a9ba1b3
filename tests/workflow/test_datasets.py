"""The data-set readers, on small files the tests write in each release's real format.

Every data set with files (trainscale.core.datasets.DATASETS) is read back in both
of its forms and both splits; each kind of bad file is refused in one line
naming the file. NumPy only: these run in the analysis environment.
"""

import gzip
import os
import pickle
import struct
import tarfile

import numpy as np
import pytest

from trainscale.core.datasets import (
    DATASETS,
    DataError,
    load_dataset,
    write_dataset,
    write_digits,
)
from trainscale.core.idx import read_idx

# The image data sets read whole (the text ones: test_text_data.py; the
# tables: test_sdss.py; ImageNet's files, decoded as a run trains:
# test_imagenet_files.py).
WITH_FILES = [
    name
    for name, d in DATASETS.items()
    if d.release is not None and not (d.is_text or d.is_table or d.streams)
]
CIFAR = [name for name in WITH_FILES if DATASETS[name].channels == 3]
IDX = [name for name in WITH_FILES if DATASETS[name].channels == 1]


def known_splits(name: str, seed: int = 3) -> dict:
    dataset = DATASETS[name]
    rng = np.random.default_rng(seed)
    side, channels = dataset.native_size, dataset.channels
    splits = {}
    for split, count in (("train", 40), ("test", 12)):
        images = rng.integers(0, 256, size=(count, side, side, channels), dtype=np.uint8)
        splits[split] = images, rng.integers(0, dataset.num_classes, size=count)
    return splits


@pytest.mark.parametrize("archive", [False, True], ids=["plain", "archived"])
@pytest.mark.parametrize("name", WITH_FILES)
def test_both_splits_round_trip_in_the_real_format(tmp_path, name, archive):
    splits = known_splits(name)
    write_dataset(name, str(tmp_path), splits, archive=archive)
    dataset = DATASETS[name]
    for split, (images, labels) in splits.items():
        read_images, read_labels = load_dataset(name, str(tmp_path), split)
        side = dataset.native_size
        assert read_images.shape == (len(images), side, side, dataset.channels)
        assert read_images.dtype == np.uint8 and read_labels.dtype == np.int32
        np.testing.assert_array_equal(read_images, images)
        np.testing.assert_array_equal(read_labels, labels)


def test_cifar_pixel_layout_is_channel_planes(tmp_path):
    # The format stores the 1024 red values, then green, then blue, row-major.
    # A hand-made entry checks the reader's transpose, independent of our writer.
    data = np.zeros((1, 3072), dtype=np.uint8)
    data[0, 0] = 11  # red of pixel (0, 0)
    data[0, 1024 + 33] = 22  # green of pixel (1, 1)
    data[0, 2048 + 31] = 33  # blue of pixel (0, 31)
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    entry = {b"data": data, b"fine_labels": [42], b"coarse_labels": [8]}
    (folder / "train").write_bytes(pickle.dumps(entry, protocol=2))
    images, labels = load_dataset("cifar100", str(tmp_path))
    assert images[0, 0, 0, 0] == 11 and images[0, 1, 1, 1] == 22 and images[0, 0, 31, 2] == 33
    assert labels.tolist() == [42]


def test_cifar10_reads_its_five_training_batches_in_order(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for i in range(1, 6):
        data = np.full((2, 3072), i, dtype=np.uint8)
        entry = {b"data": data, b"labels": [i, i + 1]}
        (folder / f"data_batch_{i}").write_bytes(pickle.dumps(entry, protocol=2))
    images, labels = load_dataset("cifar10", str(tmp_path))
    assert labels.tolist() == [1, 2, 2, 3, 3, 4, 4, 5, 5, 6]
    assert images[:, 0, 0, 0].tolist() == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]


def test_idx_layout_as_the_mnist_page_gives_it(tmp_path):
    # Written by hand from the format's description, not by our writer:
    # magic 0x00000803, then 2 images of 2 rows x 3 columns, row-major.
    header = struct.pack(">IIII", 0x803, 2, 2, 3)
    (tmp_path / "train-images-idx3-ubyte").write_bytes(header + bytes(range(12)))
    labels = struct.pack(">II", 0x801, 2) + bytes([7, 9])
    (tmp_path / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(labels))
    images, read_labels = load_dataset("mnist", str(tmp_path))
    assert images.shape == (2, 2, 3, 1)
    assert images[1, 0, 2, 0] == 8 and images[0, 1, 0, 0] == 3
    assert read_labels.tolist() == [7, 9]


def test_the_data_set_may_sit_in_a_folder_named_after_it(tmp_path):
    write_dataset("fashion-mnist", str(tmp_path / "fashion-mnist"), known_splits("fashion-mnist"))
    images, _ = load_dataset("fashion-mnist", str(tmp_path))
    assert len(images) == 40


@pytest.mark.parametrize("name", WITH_FILES)
def test_missing_data_names_the_option(tmp_path, name):
    with pytest.raises(DataError, match=f"--data-dir .* holds no {name}"):
        load_dataset(name, str(tmp_path / "nowhere"))


# --------------------------------------------------------------------------
# Bad files: one line, naming the file
# --------------------------------------------------------------------------


def _one_line_naming(err: pytest.ExceptionInfo, path) -> None:
    message = str(err.value)
    assert "\n" not in message and str(path) in message, message


@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gzip"])
def test_a_truncated_idx_file_is_refused(tmp_path, gz):
    write_dataset("mnist", str(tmp_path), known_splits("mnist"), archive=gz)
    path = tmp_path / ("train-images-idx3-ubyte" + (".gz" if gz else ""))
    blob = path.read_bytes()
    path.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(DataError, match="truncated") as err:
        load_dataset("mnist", str(tmp_path))
    _one_line_naming(err, path)


def test_a_wrong_magic_number_is_refused(tmp_path):
    write_dataset("mnist", str(tmp_path), known_splits("mnist"))
    # A labels file where the images belong: a real mix-up, and magic 0x801.
    images = tmp_path / "train-images-idx3-ubyte"
    images.write_bytes((tmp_path / "train-labels-idx1-ubyte").read_bytes())
    with pytest.raises(DataError, match="magic number 00000801, expected 00000803") as err:
        load_dataset("mnist", str(tmp_path))
    _one_line_naming(err, images)
    with pytest.raises(DataError, match="magic number"):
        images.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
        read_idx(str(images), 0x803)


@pytest.mark.parametrize("name", ["mnist", *CIFAR])
def test_a_label_out_of_range_is_refused(tmp_path, name):
    splits = known_splits(name)
    images, labels = splits["test"]
    labels[3] = DATASETS[name].num_classes  # one past the last class
    write_dataset(name, str(tmp_path), splits)
    with pytest.raises(DataError, match=f"labels must lie in 0..{labels[3] - 1}") as err:
        load_dataset(name, str(tmp_path), "test")
    found = DATASETS[name].find(str(tmp_path))
    _one_line_naming(err, found)


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


@pytest.mark.parametrize("name", CIFAR)
def test_a_crafted_pickle_is_refused_and_not_executed(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    release = DATASETS[name].release
    folder = tmp_path / release.folder
    folder.mkdir()
    member = release.members["train"][0]
    (folder / member).write_bytes(pickle.dumps({b"data": _RunsCode()}, protocol=2))
    with pytest.raises(DataError, match="refusing to load posix.system") as err:
        load_dataset(name, str(tmp_path))
    _one_line_naming(err, folder)
    assert not (tmp_path / "PWNED").exists()


def test_a_truncated_cifar_archive_is_refused(tmp_path):
    path = write_dataset("cifar10", str(tmp_path), known_splits("cifar10"), archive=True)
    with open(path, "rb") as handle:
        blob = handle.read()
    with open(path, "wb") as handle:
        handle.write(blob[: len(blob) // 2])
    with pytest.raises(DataError, match="truncated or unreadable archive") as err:
        load_dataset("cifar10", str(tmp_path))
    _one_line_naming(err, path)


def test_a_truncated_cifar_pickle_is_refused(tmp_path):
    folder = write_dataset("cifar100", str(tmp_path), known_splits("cifar100"))
    train = os.path.join(folder, "train")
    with open(train, "rb") as handle:
        blob = handle.read()
    with open(train, "wb") as handle:
        handle.write(blob[:1000])
    with pytest.raises(DataError, match="not a readable CIFAR pickle") as err:
        load_dataset("cifar100", str(tmp_path))
    _one_line_naming(err, train)


def test_a_cifar_entry_of_the_wrong_shape_is_refused(tmp_path):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    entry = {b"data": np.zeros((2, 100), np.uint8), b"fine_labels": [1, 2]}
    (folder / "train").write_bytes(pickle.dumps(entry, protocol=2))
    with pytest.raises(DataError, match="N x 3072 uint8"):
        load_dataset("cifar100", str(tmp_path))


def test_an_archive_without_the_split_is_refused(tmp_path):
    path = tmp_path / "cifar-100-python.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.addfile(tarfile.TarInfo("cifar-100-python/meta"))
    with pytest.raises(DataError, match="no cifar-100-python/train"):
        load_dataset("cifar100", str(tmp_path))


# --------------------------------------------------------------------------
# The digits: a small real data set, in MNIST's format
# --------------------------------------------------------------------------


def test_the_digits_are_written_as_idx_and_read_back_by_the_idx_reader(tmp_path):
    from sklearn.datasets import load_digits

    write_digits(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == [
        "t10k-images-idx3-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz",
        "train-images-idx3-ubyte.gz",
        "train-labels-idx1-ubyte.gz",
    ]
    train, test = (load_dataset("digits", str(tmp_path), s) for s in ("train", "test"))
    assert train[0].shape == (1497, 8, 8, 1) and test[0].shape == (300, 8, 8, 1)
    # Every real image, once: the two splits are the 1,797 digits, scaled 0..16 -> 0..255.
    original = load_digits()
    scaled = np.rint(original.images * (255 / 16)).astype(np.uint8)
    both = np.concatenate([train[0][..., 0], test[0][..., 0]]).reshape(1797, -1)
    assert sorted(map(bytes, both)) == sorted(map(bytes, scaled.reshape(1797, -1)))
    assert np.bincount(test[1], minlength=10).min() >= 20  # every class in the test split
    # The normalisation statistics declared for it are its training images'.
    pixels = train[0] / 255.0
    assert DATASETS["digits"].mean[0] == pytest.approx(pixels.mean(), abs=5e-4)
    assert DATASETS["digits"].std[0] == pytest.approx(pixels.std(), abs=5e-4)


# CIFAR-10's names as its batches.meta gives them (label_names, in label order).
CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer",
                 "dog", "frog", "horse", "ship", "truck"]  # fmt: skip


def test_class_names_come_from_the_release_and_a_wrong_list_is_refused(tmp_path):
    # Accuracy mode records them beside each class's accuracy (seed 003's
    # "car 74 %, cat 36 %"): CIFAR's from its meta pickle, as bytes in the
    # real release; IDX files name no class, so a digit is its own name.
    folder = write_dataset("cifar10", str(tmp_path), known_splits("cifar10"))
    meta = os.path.join(folder, "batches.meta")
    with open(meta, "wb") as handle:
        names = [name.encode() for name in CIFAR10_NAMES]
        pickle.dump({b"label_names": names, b"num_vis": 3072}, handle, protocol=2)
    assert DATASETS["cifar10"].class_names(str(tmp_path)) == CIFAR10_NAMES
    assert DATASETS["digits"].class_names(str(tmp_path)) == [str(d) for d in range(10)]
    with open(meta, "wb") as handle:
        pickle.dump({b"label_names": names[:9]}, handle, protocol=2)
    with pytest.raises(DataError, match="label_names must list the 10 class names") as err:
        DATASETS["cifar10"].class_names(str(tmp_path))
    _one_line_naming(err, meta)
