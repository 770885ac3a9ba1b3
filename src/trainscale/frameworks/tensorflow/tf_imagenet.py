"""ImageNet through tf.data: the JPEG tree (file names and labels) or the
TFRecord shards (trainscale.core.imagenet), decoded, cropped and flipped as
the TF models garden's ResNet-50 preprocessing does, in parallel, prefetched.

A file TensorFlow cannot take is named: each element carries its file's
name, and an in-graph check stops the pipeline before decoding an image
that does not start and end as a JPEG (SOI and EOI markers) or a record
with no label, with the file's name in the error (TensorFlow's own decode
and CRC errors name none).
"""

from __future__ import annotations

from trainscale.core.imagenet import CENTRAL_FRACTION, ImageFiles, Pipeline

# models garden imagenet_preprocessing: a crop covering 5-100 % of the
# image, at aspect ratios 3:4 to 4:3, found in at most 100 tries.
AREA_RANGE, ASPECT_RANGE, MAX_ATTEMPTS = (0.05, 1.0), (3 / 4, 4 / 3), 100


def checked_jpeg(encoded, source):
    """`encoded`, once it starts and ends as a JPEG does; else an error naming `source`."""
    import tensorflow as tf

    ends = tf.strings.substr(encoded, tf.strings.length(encoded) - 2, 2) == b"\xff\xd9"
    check = tf.debugging.Assert(
        tf.logical_and(tf.io.is_jpeg(encoded), ends),
        ["DataError: not a whole JPEG (no start or end marker):", source],
    )
    with tf.control_dependencies([check]):
        return tf.identity(encoded)


def decode_train(encoded, image_size: int, seed, augment: bool):
    """A random-resized crop, flipped, as uint8 image_size x image_size x 3."""
    import tensorflow as tf

    if not augment:
        return decode_eval(encoded, image_size)
    shape = tf.image.extract_jpeg_shape(encoded)
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape, tf.constant([[[0.0, 0.0, 1.0, 1.0]]]), seed=seed,
        min_object_covered=0.1, aspect_ratio_range=ASPECT_RANGE, area_range=AREA_RANGE,
        max_attempts=MAX_ATTEMPTS, use_image_if_no_bounding_boxes=True,
    )  # fmt: skip
    window = tf.stack([begin[0], begin[1], size[0], size[1]])
    image = tf.image.decode_and_crop_jpeg(encoded, window, channels=3)
    image = tf.image.stateless_random_flip_left_right(image, seed=seed + 1)
    return _resized(image, image_size)


def decode_eval(encoded, image_size: int):
    import tensorflow as tf

    image = tf.image.decode_jpeg(encoded, channels=3)
    return _resized(tf.image.central_crop(image, CENTRAL_FRACTION), image_size)


def _resized(image, image_size: int):
    import tensorflow as tf

    # Bilinear: each pixel a mix of the uint8 ones around it, so within 0..255.
    image = tf.image.resize(image, [image_size, image_size], method="bilinear")
    return tf.cast(image + 0.5, tf.uint8)  # rounded


def _parsed(record, shard):
    """(JPEG bytes, 0-based label) of one tf.train.Example; no label: an error naming the shard."""
    import tensorflow as tf

    features = tf.io.parse_single_example(record, {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64, default_value=0),
    })  # fmt: skip
    label = features["image/class/label"]
    check = tf.debugging.Assert(
        label >= 1, ["DataError: a record without image/class/label (1..1000):", shard]
    )
    with tf.control_dependencies([check]):
        return features["image/encoded"], tf.cast(label - 1, tf.int32)


def imagenet_dataset(files: ImageFiles, pipeline: Pipeline):
    """Batches of (uint8 NHWC images, int32 labels) from this shard of the
    files, shuffled and repeated forever. A shard of the JPEG tree is every
    num_shards-th file; of the TFRecords, every num_shards-th shard file
    (tf_cnn_benchmarks' split), so there must be at least as many files."""
    import tensorflow as tf

    shard_index, num_shards, seed = pipeline.shard_index, pipeline.num_shards, pipeline.seed
    calls = pipeline.workers or tf.data.AUTOTUNE
    if len(files) < num_shards:
        raise ValueError(f"{len(files)} files cannot feed {num_shards} input pipelines")
    names = tf.data.Dataset.from_tensor_slices(list(files.paths)).shard(num_shards, shard_index)
    if files.layout == "jpeg":
        labels = tf.data.Dataset.from_tensor_slices(files.labels).shard(num_shards, shard_index)
        examples = tf.data.Dataset.zip((names, labels)).shuffle(len(files), seed=seed)
    else:
        records = names.shuffle(len(files), seed=seed).interleave(
            lambda shard: tf.data.TFRecordDataset(shard).map(lambda r: (r, shard)),
            cycle_length=max(1, min(len(files), 4)), num_parallel_calls=calls,
        )  # fmt: skip
        examples = records.shuffle(1024, seed=seed)
    examples = examples.repeat().enumerate()

    # Read or parsed where it is decoded: one parallel map (4 % more images/sec).
    def decoded(index, element):
        if files.layout == "jpeg":
            source, label = element
            encoded = tf.io.read_file(source)
        else:
            record, source = element
            encoded, label = _parsed(record, source)
        example_seed = tf.stack([tf.constant(seed, tf.int64), index])
        encoded = checked_jpeg(encoded, source)
        return decode_train(encoded, pipeline.image_size, example_seed, pipeline.augment), label

    batches = examples.map(decoded, num_parallel_calls=calls, deterministic=True)
    return batches.batch(pipeline.batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def named_data_error(err: BaseException, files: ImageFiles):
    """The DataError naming the file behind a pipeline's error, or None: an
    in-graph check's (checked_jpeg, _parsed) carries the name; TensorFlow's
    CRC error names no shard, so each is read again until one fails."""
    import re

    import tensorflow as tf

    from trainscale.core.data_error import DataError

    text = str(err)
    found = re.search(r"\[DataError: ([^\]]*)\] \[([^\]]*)\]", text)
    if isinstance(err, tf.errors.InvalidArgumentError) and found:
        return DataError(f"{found[2]}: {found[1].rstrip(':')}")
    if isinstance(err, tf.errors.DataLossError) and files.layout == "tfrecord":
        for shard in files.paths:
            try:
                for _ in tf.compat.v1.io.tf_record_iterator(shard):
                    pass
            except tf.errors.DataLossError as bad:
                return DataError(f"{shard}: a corrupt TFRecord ({bad.message.strip()})")
    return None
