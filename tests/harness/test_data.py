"""The input pipelines (tf.data and NumPy) over a data set's images: sharding,
augmentation, preparing a batch for the model. The readers of the data sets'
files are tests/workflow/test_datasets.py."""

import numpy as np
import pytest
from runs import assert_classifies_the_sky_survey

from trainscale.core.datasets import DATASETS
from trainscale.frameworks.tensorflow.tf_data import image_dataset, prepare_images
from trainscale.harness.data import numpy_batches, shard_indices


@pytest.fixture()
def known_images():
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, size=(40, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 100, size=40)
    return images, labels


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
        dataset = image_dataset(
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


def test_grayscale_batches_keep_one_channel_and_meet_a_one_channel_stem():
    import tensorflow as tf

    rng = np.random.default_rng(4)
    images = rng.integers(0, 256, size=(16, 28, 28, 1), dtype=np.uint8)
    labels = rng.integers(0, 10, size=16)
    tf_batch = next(
        iter(
            image_dataset(
                images, labels, shard_index=0, num_shards=1, batch_size=8, seed=1, augment=False
            )
        )
    )
    np_batch = next(
        numpy_batches(
            images, labels, shard_index=0, num_shards=1, batch_size=8, seed=1, augment=False
        )
    )
    assert tf_batch[0].shape == (8, 28, 28, 1)
    np.testing.assert_array_equal(tf_batch[0].numpy(), np_batch[0])  # the same examples
    prepared = prepare_images(tf_batch[0], 32, "float32", "mnist")
    assert prepared.shape == (8, 32, 32, 1)  # resized, not replicated to three channels
    # Normalised with MNIST's own statistics: a white pixel is (1 - mean) / std.
    white = prepare_images(
        tf.fill([1, 28, 28, 1], tf.constant(255, tf.uint8)), 28, "float32", "mnist"
    )
    mnist = DATASETS["mnist"]
    assert float(white[0, 0, 0, 0]) == pytest.approx((1 - mnist.mean[0]) / mnist.std[0])


@pytest.mark.slow
def test_horovod_trains_the_mlp_on_the_sky_survey_table(tmp_path):
    """Seed 004's third data set, SDSS DR17's table, in seed 004's Horovod."""
    assert_classifies_the_sky_survey(tmp_path, "horovod")
