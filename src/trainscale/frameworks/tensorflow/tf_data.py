"""The TensorFlow frameworks' input pipeline: tf.data over the shards
trainscale.harness.data cuts (the same examples, in the same order, as the
torch frameworks' NumPy batches), the synthetic batch as a dataset, and the
images' scaling and normalisation on the replica's device."""

from __future__ import annotations

import numpy as np

from trainscale.core.datasets import DATASETS
from trainscale.harness.data import batchable_shard, synthetic_example_batch


def image_dataset(
    images: np.ndarray,
    labels: np.ndarray,
    *,
    shard_index: int,
    num_shards: int,
    batch_size: int,
    seed: int,
    augment: bool,
):
    """Batches of (uint8 NHWC images, int32 labels) from one shard, repeated forever.

    Images stay uint8 at their native size here: normalising and resizing to
    the model's input size happen inside the training step (prepare_images),
    on the accelerator, where they are cheapest and do not starve the input
    pipeline. `augment` is the data set's crop-and-flip (callers pass False
    for a data set without one).
    """
    import tensorflow as tf

    indices = batchable_shard(len(images), shard_index, num_shards, batch_size, seed)
    dataset = tf.data.Dataset.from_tensor_slices(
        (images[indices], labels[indices], indices.astype(np.int64))
    )
    dataset = dataset.cache().repeat()
    if augment:
        side, channels = images.shape[1], images.shape[3]

        def augment_example(image, label, index):
            key = tf.stack([tf.constant(seed, tf.int64), index])
            padded = tf.image.pad_to_bounding_box(image, 4, 4, side + 8, side + 8)
            image = tf.image.stateless_random_crop(padded, [side, side, channels], seed=key)
            image = tf.image.stateless_random_flip_left_right(image, seed=key + 1)
            return image, label

        dataset = dataset.map(augment_example, num_parallel_calls=tf.data.AUTOTUNE)
    else:
        dataset = dataset.map(lambda image, label, index: (image, label))
    dataset = dataset.batch(batch_size, drop_remainder=True)
    return dataset.prefetch(tf.data.AUTOTUNE)


def synthetic_dataset(settings, shard_indices, batch_size: int):
    """One random batch per replica, repeated (Horovod's synthetic benchmark).

    An input pipeline feeding several replicas (MirroredStrategy's one
    pipeline) yields their batches in turn, which tf.distribute hands out
    round-robin: replica r of the run trains on synthetic_batch(shard_index=r)
    whichever framework runs it, as the examples' synthetic data does.
    """
    import tensorflow as tf

    batches = [synthetic_example_batch(settings, index, batch_size) for index in shard_indices]
    images, labels = (np.stack(parts) for parts in zip(*batches))
    return tf.data.Dataset.from_tensor_slices((images, labels)).repeat()


def prepare_images(images, image_size: int, compute_dtype: str, dataset: str):
    """Turn a batch from either pipeline into model input: float, normalised, resized.

    Decided at trace time from static shapes, so a synthetic batch that is
    already float at the right size costs nothing here.
    """
    import tensorflow as tf

    if images.dtype == tf.uint8:
        spec = DATASETS[dataset]
        images = tf.cast(images, tf.float32) / 255.0
        images = (images - tf.constant(spec.mean)) / tf.constant(spec.std)
    if images.shape[1] != image_size or images.shape[2] != image_size:
        images = tf.image.resize(images, [image_size, image_size], method="bilinear")
    return tf.cast(images, compute_dtype)
