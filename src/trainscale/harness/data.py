"""Training data: the shards and batches both ecosystems feed their replicas.

What each data set is, and the readers of its files, are trainscale.core.datasets.

Sharding: every replica reads a different shard. The example order is one
fixed random permutation of the training set (seeded); shard k of n takes
every n-th example of it from k. So the first global batch is the same set of
examples whatever the number of replicas, which is what lets the gradient
equivalence test compare a 2-replica step with a 1-replica step.

Augmentation (the data set's own: pad-and-crop and horizontal flip for CIFAR,
none for the MNIST family, whose digits a flip would change) is stateless and
seeded by the example's index, for the same reason: it does not depend on the
sharding.

Two pipelines read the same shards: tf.data for the TensorFlow frameworks
(trainscale.frameworks.tensorflow.tf_data), plain NumPy batches for the
torch ones (numpy_batches). Both crop and flip
the same way, but draw their offsets from different generators (TensorFlow's
stateless RNG; a SplitMix64 hash of seed and index here), so the two
ecosystems see equally random, not identical, augmented images. The
synthetic batch is identical in both (synthetic_batch).
"""

from __future__ import annotations

import numpy as np

from trainscale.core.datasets import DataError

# --------------------------------------------------------------------------
# Sharding
# --------------------------------------------------------------------------


def shard_indices(num_examples: int, shard_index: int, num_shards: int, seed: int) -> np.ndarray:
    """Indices of the examples shard `shard_index` of `num_shards` reads, in order."""
    if not 0 <= shard_index < num_shards:
        raise ValueError(f"shard {shard_index} of {num_shards} does not exist")
    order = np.random.default_rng(seed).permutation(num_examples)
    return order[shard_index::num_shards]


def batchable_shard(
    num_examples: int, shard_index: int, num_shards: int, batch_size: int, seed: int
) -> np.ndarray:
    """shard_indices, refused when the shard does not fill one batch."""
    indices = shard_indices(num_examples, shard_index, num_shards, seed)
    if len(indices) < batch_size:
        raise DataError(
            f"shard {shard_index} of {num_shards} holds {len(indices)} images, "
            f"fewer than one batch of {batch_size}"
        )
    return indices


def synthetic_batch(
    *, shard_index: int, batch_size: int, image_size: int, num_classes: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """One replica's random batch: float32 NHWC images and int32 labels."""
    rng = np.random.default_rng([seed, shard_index])
    images = rng.standard_normal((batch_size, image_size, image_size, 3), dtype=np.float32)
    labels = rng.integers(0, num_classes, size=batch_size).astype(np.int32)
    return images, labels


def synthetic_tokens(
    *, shard_index: int, batch_size: int, seq_len: int, vocab_size: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Replica `shard_index`'s random token batch for a text model: int32
    (batch, seq_len) inputs and their targets, the same sequences one token
    on. Each sequence is drawn from its place in the global batch, so the
    global batch is the same however it is split: a model-parallel
    framework's whole batch is the data-parallel replicas' batches together,
    and torch-single's on the global batch (the equivalence tests)."""
    first = shard_index * batch_size
    tokens = np.stack([
        np.random.default_rng([seed, example]).integers(0, vocab_size, size=seq_len + 1)
        for example in range(first, first + batch_size)
    ]).astype(np.int32)  # fmt: skip
    return tokens[:, :-1], tokens[:, 1:]


def synthetic_example_batch(settings, shard_index: int, batch_size: int):
    """The synthetic batch of replica `shard_index`: images, or a text model's tokens."""
    s = settings
    batch = dict(shard_index=shard_index, batch_size=batch_size, seed=s.seed)
    if s.is_text:
        return synthetic_tokens(seq_len=s.seq_len, vocab_size=s.vocab_size, **batch)
    return synthetic_batch(image_size=s.image_size, num_classes=s.num_classes, **batch)


# --------------------------------------------------------------------------
# NumPy batches (the torch frameworks)
# --------------------------------------------------------------------------


def _splitmix64(values: np.ndarray) -> np.ndarray:
    """SplitMix64's output function: well-mixed 64-bit words from a counter, vectorised."""
    with np.errstate(over="ignore"):
        z = values.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def augment_batch(images: np.ndarray, indices: np.ndarray, seed: int) -> np.ndarray:
    """Pad by 4, crop back to size and maybe flip, each example keyed by (seed, index)."""
    words = _splitmix64(indices.astype(np.uint64) ^ _splitmix64(np.array([seed]))[0])
    rows, cols = (words % 9).astype(np.intp), ((words >> np.uint64(8)) % 9).astype(np.intp)
    flip = ((words >> np.uint64(16)) & np.uint64(1)).astype(bool)
    padded = np.pad(images, ((0, 0), (4, 4), (4, 4), (0, 0)))
    side = np.arange(images.shape[1])
    crop_rows = (rows[:, None] + side)[:, :, None]
    crop_cols = (cols[:, None] + np.where(flip[:, None], side[::-1], side))[:, None, :]
    return padded[np.arange(len(images))[:, None, None], crop_rows, crop_cols]


def numpy_batches(
    images: np.ndarray,
    labels: np.ndarray,
    *,
    shard_index: int,
    num_shards: int,
    batch_size: int,
    seed: int,
    augment: bool,
):
    """tf_data.image_dataset's batches as NumPy arrays, for ever: (uint8 NHWC
    images, int64 labels)."""
    indices = batchable_shard(len(images), shard_index, num_shards, batch_size, seed)
    # As tf.data's repeat().batch(drop_remainder=True): batches run on across
    # the end of the shard into its next pass.
    position = 0
    while True:
        chosen = indices[(position + np.arange(batch_size)) % len(indices)]
        position = (position + batch_size) % len(indices)
        batch = images[chosen]
        if augment:
            batch = augment_batch(batch, chosen, seed)
        yield batch, labels[chosen].astype(np.int64)
