"""The CIFAR-100 reader and pipelines, on small archives in the real format."""

import io
import os
import pickle
import tarfile

import numpy as np
import pytest

from trainscale.data import (
    DataError,
    cifar100_dataset,
    find_cifar100,
    load_cifar100,
    shard_indices,
    write_cifar100,
)


@pytest.fixture()
def known_images():
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, size=(40, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 100, size=40)
    return images, labels


@pytest.mark.parametrize("archive", [False, True], ids=["folder", "tar.gz"])
def test_round_trip_in_the_real_format(tmp_path, known_images, archive):
    images, labels = known_images
    write_cifar100(str(tmp_path), images, labels, archive=archive)
    read_images, read_labels = load_cifar100(str(tmp_path))
    assert read_images.shape == (40, 32, 32, 3) and read_images.dtype == np.uint8
    assert read_labels.dtype == np.int32
    np.testing.assert_array_equal(read_images, images)
    np.testing.assert_array_equal(read_labels, labels)


def test_pixel_layout_is_channel_planes(tmp_path):
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
    images, labels = load_cifar100(str(tmp_path))
    assert images[0, 0, 0, 0] == 11 and images[0, 1, 1, 1] == 22 and images[0, 0, 31, 2] == 33
    assert labels.tolist() == [42]


def test_shards_are_disjoint_and_cover_the_data():
    shards = [shard_indices(103, k, 4, seed=5) for k in range(4)]
    joined = np.concatenate(shards)
    assert sorted(joined.tolist()) == list(range(103))
    assert shard_indices(103, 1, 4, seed=5).tolist() == shards[1].tolist()  # deterministic
    assert shards[0].tolist() != shard_indices(103, 0, 4, seed=6).tolist()  # seeded


def test_pipelines_feed_each_replica_a_different_shard(tmp_path, known_images):
    images, labels = known_images
    # Label each image by its index so we can tell which examples a shard yields.
    labels = np.arange(40)
    seen = []
    for shard in range(2):
        dataset = cifar100_dataset(
            images,
            labels % 100,
            shard_index=shard,
            num_shards=2,
            batch_size=4,
            seed=1,
            augment=False,
        )
        batches = list(dataset.take(5))  # exactly one pass over 20 examples
        shard_labels = np.concatenate([b[1].numpy() for b in batches])
        for image_batch, label_batch in batches:
            assert image_batch.shape == (4, 32, 32, 3) and image_batch.dtype.name == "uint8"
            for image, label in zip(image_batch.numpy(), label_batch.numpy(), strict=True):
                np.testing.assert_array_equal(image, images[label])
        seen.append(set(shard_labels.tolist()))
    assert seen[0].isdisjoint(seen[1])
    assert seen[0] | seen[1] == set(range(40))


def test_missing_data_dir_names_the_option(tmp_path):
    with pytest.raises(DataError, match="--data-dir"):
        find_cifar100(str(tmp_path / "nowhere"))


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_crafted_pickle_is_refused_and_not_executed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    (folder / "train").write_bytes(pickle.dumps({b"data": _RunsCode()}, protocol=2))
    with pytest.raises(DataError, match="refusing to load posix.system"):
        load_cifar100(str(tmp_path))
    assert not (tmp_path / "PWNED").exists()


def test_truncated_archive_gives_a_clear_error(tmp_path, known_images):
    path = write_cifar100(str(tmp_path), *known_images, archive=True)
    with open(path, "rb") as handle:
        blob = handle.read()
    with open(path, "wb") as handle:
        handle.write(blob[: len(blob) // 2])
    with pytest.raises(DataError, match="truncated or unreadable archive"):
        load_cifar100(str(tmp_path))


def test_truncated_pickle_gives_a_clear_error(tmp_path, known_images):
    folder = write_cifar100(str(tmp_path), *known_images)
    train = os.path.join(folder, "train")
    with open(train, "rb") as handle:
        blob = handle.read()
    with open(train, "wb") as handle:
        handle.write(blob[:1000])
    with pytest.raises(DataError, match="not a readable CIFAR-100 pickle"):
        load_cifar100(str(tmp_path))


def test_wrong_shape_is_refused(tmp_path):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    entry = {b"data": np.zeros((2, 100), np.uint8), b"fine_labels": [1, 2]}
    (folder / "train").write_bytes(pickle.dumps(entry, protocol=2))
    with pytest.raises(DataError, match="N x 3072 uint8"):
        load_cifar100(str(tmp_path))


def test_archive_without_train_member(tmp_path):
    path = tmp_path / "cifar-100-python.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("cifar-100-python/meta")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"abc"))
    with pytest.raises(DataError, match="no cifar-100-python/train"):
        load_cifar100(str(tmp_path))
