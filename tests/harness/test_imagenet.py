"""ImageNet through tf.data (trainscale.frameworks.tensorflow.tf_imagenet):
the JPEG tree and the TFRecord shards decoded, cropped and flipped; a bad
file named; and one decoded-input run. The files' own checks are
tests/workflow/test_imagenet_files.py."""

import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from runs import assert_trains_on_decoded_imagenet

from trainscale.core.imagenet import Pipeline, generate_imagenet, jpeg_files, tfrecord_files
from trainscale.core.tfrecord import example, read_records, write_records
from trainscale.frameworks.tensorflow.tf_imagenet import imagenet_dataset, named_data_error


@pytest.fixture()
def imagenet(tmp_path):
    return generate_imagenet(str(tmp_path / "imagenet"), classes=4, per_class=8, shards=2)


def batches(files, *, shard=0, shards=1, batch=4, seed=1, augment=True):
    return imagenet_dataset(files, Pipeline(shard, shards, batch, seed, 24, augment, workers=2))


def first_batch(files, **kwargs):
    images, labels = next(iter(batches(files, **kwargs)))
    return images.numpy(), labels.numpy()


def test_the_shards_parse_as_tensorflows_examples_with_the_trees_labels(imagenet):
    tree, shards = jpeg_files(imagenet, "train"), tfrecord_files(imagenet, "train")
    spec = {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
        "image/class/synset": tf.io.FixedLenFeature([], tf.string),
    }
    label_of = {}
    for path, label in zip(tree.paths, tree.labels):
        with open(path, "rb") as handle:
            label_of[handle.read()] = label
    parsed = [
        tf.io.parse_single_example(record, spec)
        for record in tf.data.TFRecordDataset(list(shards.paths))
    ]
    assert len(parsed) == 32
    for features in parsed:
        label = int(features["image/class/label"]) - 1  # 0 is the background class
        assert label_of[features["image/encoded"].numpy()] == label
        folder = os.path.dirname(tree.paths[list(tree.labels).index(label)])
        assert features["image/class/synset"].numpy().decode() == os.path.basename(folder)


@pytest.mark.parametrize("layout", ["jpeg", "tfrecord"])
def test_each_layout_yields_cropped_uint8_batches_of_its_shard(imagenet, layout):
    files = (jpeg_files if layout == "jpeg" else tfrecord_files)(imagenet, "train")
    # A shard is every 2nd file (or shard file): one batch of 16 is its epoch.
    seen = Counter()
    for shard in range(2):
        images, labels = first_batch(files, shard=shard, shards=2, batch=16)
        assert images.dtype == np.uint8 and images.shape == (16, 24, 24, 3)
        seen.update(labels.tolist())
    assert seen == Counter({label: 8 for label in range(4)})  # every image once
    # Seeded: the same crops again; another seed, other crops.
    again, _ = first_batch(files, seed=1)
    assert np.array_equal(first_batch(files, seed=1)[0], again)
    assert not np.array_equal(first_batch(files, seed=2)[0], again)


def test_a_cut_jpeg_is_named_before_it_is_decoded(imagenet):
    files = jpeg_files(imagenet, "train")
    cut = files.paths[5]
    with open(cut, "rb") as handle:
        data = handle.read()
    with open(cut, "wb") as handle:
        handle.write(data[: len(data) // 2])
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        for _ in batches(files, batch=32).take(1):
            pass
    named = named_data_error(caught.value, files)
    assert str(named) == f"{cut}: not a whole JPEG (no start or end marker)"
    # Files too short to hold the markers: Substr's own error, which names none.
    for short in (b"", data[:1]):
        with open(cut, "wb") as handle:
            handle.write(short)
        with pytest.raises((tf.errors.InvalidArgumentError, UnicodeDecodeError)) as caught:
            for _ in batches(files, batch=32).take(1):
                pass
        named = named_data_error(caught.value, files)
        assert str(named) == f"{cut}: not a whole JPEG (no start or end marker)"


def test_a_corrupt_shard_and_a_record_without_a_label_are_named(imagenet):
    files = tfrecord_files(imagenet, "train")
    bad = files.paths[1]
    blob = bytearray(Path(bad).read_bytes())
    blob[40] ^= 0xFF  # inside the first record's data: its CRC no longer matches
    Path(bad).write_bytes(bytes(blob))
    with pytest.raises(tf.errors.DataLossError) as caught:
        for _ in batches(files, batch=32).take(1):
            pass
    assert str(named_data_error(caught.value, files)).startswith(f"{bad}: a corrupt TFRecord (")
    # A shard whose record has no image/class/label.
    records = list(read_records(files.paths[0]))
    unlabelled = example({"image/encoded": b"\xff\xd8\xff\xd9"})
    write_records(bad, [unlabelled, *records])
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        for _ in batches(files, batch=32).take(1):
            pass
    assert str(named_data_error(caught.value, files)) == (
        f"{bad}: a record without image/class/label (1..1000)"
    )
    # A labelled record whose image is one byte: Substr's own error, a shard named.
    write_records(bad, [example({"image/encoded": b"\xff", "image/class/label": 1}), *records])
    with pytest.raises((tf.errors.InvalidArgumentError, UnicodeDecodeError)) as caught:
        for _ in batches(files, batch=32).take(1):
            pass
    assert str(named_data_error(caught.value, files)) == (
        f"{bad}: not a whole JPEG (no start or end marker)"
    )


@pytest.mark.slow
def test_mirrored_trains_on_tfrecord_shards_and_records_the_pipelines_rate(tmp_path):
    # One process: the cheapest of TensorFlow's 2-replica runs (the shards a
    # process reads are the tests above).
    assert_trains_on_decoded_imagenet(tmp_path, "tf-mirrored", "imagenet-tfrecord")
