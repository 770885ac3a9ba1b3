"""ImageNet through tf.data: the JPEG tree (file names and labels) or the
TFRecord shards (trainscale.core.imagenet), decoded, cropped and flipped as
the TF models garden's ResNet-50 preprocessing does, in parallel, prefetched.

A file TensorFlow cannot take is named. An in-graph check stops the
pipeline before decoding an image that does not start and end as a JPEG
(SOI and EOI markers) or a record with no label; TensorFlow's own decode
and CRC errors name no file. A JPEG file's element is its name, so its
check names it. A record does not carry its shard's name (a string per
record through the reads and the shuffle, one of the pieces that together
cost some 3 % of the decode-only rate, bench/README.md): on a shard's
error, `named_data_error` reads the shards again until one fails.

The per-image function keeps to the ops that do its work (parse, check,
draw, decode, flip, resize): each op costs microseconds to run, and the
old function's 20 ops more were percents of a decode (bench/README.md).
"""

from __future__ import annotations

import os

from trainscale.core.imagenet import CENTRAL_FRACTION, ImageFiles, Pipeline

# models garden imagenet_preprocessing: a crop covering 5-100 % of the
# image, at aspect ratios 3:4 to 4:3, found in at most 100 tries.
AREA_RANGE, ASPECT_RANGE, MAX_ATTEMPTS = (0.05, 1.0), (3 / 4, 4 / 3), 100
START, END = b"\xff\xd8\xff", b"\xff\xd9"  # a JPEG's SOI marker and the next 0xff; EOI
NOT_WHOLE = "not a whole JPEG (no start or end marker)"
NO_LABEL = "a record without image/class/label (1..1000)"
SHARD_CHECK = "DataError in a shard"  # not "DataError: ", which names its file


def has_jpeg_markers(encoded):
    """A tensor: whether `encoded` starts and ends as a JPEG does (both ends
    in one substr; under 2 bytes, Substr's own error, see named_data_error)."""
    import tensorflow as tf

    return tf.reduce_all(tf.strings.substr(encoded, [0, -2], [3, 2]) == [START, END])


def bytes_have_jpeg_markers(data: bytes) -> bool:
    """has_jpeg_markers in Python, of bytes."""
    return data[:3] == START and data[-2:] == END


def once_checked(encoded, ok, message: list):
    """`encoded` once `ok` holds; else an InvalidArgumentError carrying `message`."""
    import tensorflow as tf

    with tf.control_dependencies([tf.debugging.Assert(ok, message)]):
        return tf.identity(encoded)


def decode_train(encoded, image_size: int, crop_seed, flip_seed, augment: bool):
    """A random-resized crop, flipped, as uint8 image_size x image_size x 3,
    drawn from two stateless seeds (a run's crops repeat)."""
    import tensorflow as tf

    if not augment:
        return decode_eval(encoded, image_size)
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.image.extract_jpeg_shape(encoded), tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
        seed=crop_seed, min_object_covered=0.1, aspect_ratio_range=ASPECT_RANGE,
        area_range=AREA_RANGE, max_attempts=MAX_ATTEMPTS, use_image_if_no_bounding_boxes=True,
    )  # fmt: skip
    window = tf.concat([begin[:2], size[:2]], axis=0)
    image = tf.image.decode_and_crop_jpeg(encoded, window, channels=3)
    # Not tf.image's flip (a shape check a decoded crop needs not) nor
    # tf.random's draw (two ops more, to make a key and scale): the one op.
    uniform = tf.raw_ops.StatelessRandomUniform(shape=[], seed=flip_seed, dtype=tf.float32)
    flip = uniform < 0.5
    image = tf.cond(flip, lambda: tf.reverse(image, axis=[1]), lambda: image)
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


def _parsed(record):
    """(JPEG bytes, 0-based label, whether the record is whole) of one tf.train.Example."""
    import tensorflow as tf

    features = tf.io.parse_single_example(record, {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64, default_value=0),
    })  # fmt: skip
    encoded, label = features["image/encoded"], features["image/class/label"]
    whole = tf.logical_and(label >= 1, has_jpeg_markers(encoded))
    return encoded, tf.cast(label - 1, tf.int32), whole


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
    else:  # up to four shards read at once, by TFRecordDataset's own parallel reads
        names = names.shuffle(len(files), seed=seed)
        records = tf.data.TFRecordDataset(names, num_parallel_reads=max(1, min(len(files), 4)))
        examples = records.shuffle(1024, seed=seed)
    examples = examples.repeat().enumerate()  # the index: each example's seeds

    # Read or parsed where it is decoded: one parallel map (4 % more images/sec).
    def decoded(index, element):
        if files.layout == "jpeg":
            source, label = element
            encoded = tf.io.read_file(source)
            ok, message = has_jpeg_markers(encoded), [f"DataError: {NOT_WHOLE}:", source]
            encoded = once_checked(encoded, ok, message)
        else:
            encoded, label, whole = _parsed(element)
            encoded = once_checked(encoded, whole, [f"{SHARD_CHECK}: a label or a marker"])
        crop_seed, flip_seed = tf.stack([seed, index]), tf.stack([seed + 1, index])
        image = decode_train(encoded, pipeline.image_size, crop_seed, flip_seed, pipeline.augment)
        return image, label

    batches = examples.map(decoded, num_parallel_calls=calls, deterministic=True)
    return batches.batch(pipeline.batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def named_data_error(err: BaseException, files: ImageFiles):
    """The DataError naming the file behind a pipeline's error, or None: a
    JPEG file's in-graph check carries its name; a shard's (the in-graph
    check's, a CRC's) names none, so each shard is read again until one
    fails; so is each file when Substr found one too short to hold the markers."""
    import re

    import tensorflow as tf

    from trainscale.core.data_error import DataError

    text = str(err) if isinstance(err, tf.errors.InvalidArgumentError) else ""
    found = re.search(r"\[DataError: ([^\]]*)\] \[([^\]]*)\]", text)
    if found:
        return DataError(f"{found[2]}: {found[1].rstrip(':')}")
    # Substr's error quotes the string, so a file of one 0xff byte makes
    # TensorFlow's message itself undecodable: a UnicodeDecodeError.
    quoted = err.object if isinstance(err, UnicodeDecodeError) else text.encode()
    too_short = b"out of range for string" in quoted
    if files.layout == "jpeg" and too_short:
        short = next((path for path in files.paths if os.path.getsize(path) < 3), None)
        return DataError(f"{short}: {NOT_WHOLE}") if short else None
    corrupt = isinstance(err, tf.errors.DataLossError)
    if files.layout == "tfrecord" and (SHARD_CHECK in text or too_short or corrupt):
        return _first_bad_shard(files)
    return None


def _first_bad_shard(files: ImageFiles):
    """The DataError of the first shard with a corrupt frame, a record that
    is not a tf.train.Example or has no label, or an image without a JPEG's
    markers; None if all are good."""
    import tensorflow as tf
    from google.protobuf.message import DecodeError

    from trainscale.core.data_error import DataError

    for shard in files.paths:
        try:
            for record in tf.compat.v1.io.tf_record_iterator(shard):
                features = tf.train.Example.FromString(record).features.feature
                labels = features["image/class/label"].int64_list.value
                if not labels or labels[0] < 1:
                    return DataError(f"{shard}: {NO_LABEL}")
                encoded = b"".join(features["image/encoded"].bytes_list.value)
                if not bytes_have_jpeg_markers(encoded):
                    return DataError(f"{shard}: {NOT_WHOLE}")
        except tf.errors.DataLossError as bad:
            return DataError(f"{shard}: a corrupt TFRecord ({bad.message.strip()})")
        except DecodeError:
            return DataError(f"{shard}: a record that is not a tf.train.Example")
    return None
