"""Training data: the real CIFAR-100 reader and the tf.data pipelines.

CIFAR-100 comes as the standard `cifar-100-python` release: a folder (or the
`cifar-100-python.tar.gz` archive holding it) whose `train` file is a Python
pickle of a dict with `data` (N x 3072 uint8, the R, G and B planes of each
32x32 image in turn) and `fine_labels` (N ints in 0..99). Pickle can run code,
so the reader admits only the few types that file needs (see _SafeUnpickler).

Sharding: every replica reads a different shard. The example order is one
fixed random permutation of the training set (seeded); shard k of n takes
every n-th example of it from k. So the first global batch is the same set of
examples whatever the number of replicas, which is what lets the gradient
equivalence test compare a 2-replica step with a 1-replica step.

Augmentation (pad-and-crop, horizontal flip) is stateless and seeded by the
example's index, for the same reason: it does not depend on the sharding.

Two pipelines read the same shards: tf.data for the TensorFlow frameworks,
plain NumPy batches for the torch ones (numpy_batches). Both crop and flip
the same way, but draw their offsets from different generators (TensorFlow's
stateless RNG; a SplitMix64 hash of seed and index here), so the two
ecosystems see equally random, not identical, augmented images. The
synthetic batch is identical in both (synthetic_batch).
"""

from __future__ import annotations

import io
import os
import pickle
import tarfile

import numpy as np

CIFAR100_FOLDER = "cifar-100-python"
CIFAR100_ARCHIVE = "cifar-100-python.tar.gz"
CIFAR_IMAGE_SIZE = 32
# Per-channel mean and std of the CIFAR-100 training set, used to normalise.
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)


class DataError(ValueError):
    """The data set is missing, truncated or not in the expected format."""


# --------------------------------------------------------------------------
# Reading the archive
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
            f"refusing to load {module}.{name} from the CIFAR-100 file: "
            "only NumPy arrays, bytes, lists and dicts are allowed"
        )


def _unpickle(blob: bytes, where: str) -> dict:
    try:
        obj = _SafeUnpickler(io.BytesIO(blob), encoding="bytes").load()
    except DataError as err:
        raise DataError(f"{where}: {err}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as err:
        raise DataError(f"{where}: not a readable CIFAR-100 pickle ({err})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a dict, found {type(obj).__name__}")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in obj.items()}


def find_cifar100(data_dir: str) -> str:
    """Return the path of the CIFAR-100 folder or archive inside `data_dir`."""
    candidates = [
        os.path.join(data_dir, CIFAR100_FOLDER),
        os.path.join(data_dir, CIFAR100_ARCHIVE),
    ]
    if os.path.basename(os.path.normpath(data_dir)) == CIFAR100_FOLDER:
        candidates.insert(0, data_dir)
    for path in candidates:
        if os.path.isdir(path) and os.path.isfile(os.path.join(path, "train")):
            return path
        if os.path.isfile(path):
            return path
    raise DataError(
        f"--data-dir {data_dir!r} holds no CIFAR-100 ({CIFAR100_FOLDER}/train or "
        f"{CIFAR100_ARCHIVE}); download it there or use --dataset synthetic"
    )


def _read_member(path: str, member: str) -> bytes:
    if os.path.isdir(path):
        with open(os.path.join(path, member), "rb") as handle:
            return handle.read()
    try:
        with tarfile.open(path, "r:*") as archive:
            handle = archive.extractfile(f"{CIFAR100_FOLDER}/{member}")
            if handle is None:
                raise DataError(f"{path}: {CIFAR100_FOLDER}/{member} is not a file")
            return handle.read()
    except KeyError:
        raise DataError(f"{path}: no {CIFAR100_FOLDER}/{member} in the archive") from None
    except (tarfile.TarError, EOFError, OSError) as err:
        raise DataError(f"{path}: truncated or unreadable archive ({err})") from None


def load_cifar100(data_dir: str, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """Read a CIFAR-100 split: images (N, 32, 32, 3) uint8 and fine labels (N,) int32."""
    path = find_cifar100(data_dir)
    where = f"{path}:{split}"
    entry = _unpickle(_read_member(path, split), where)
    try:
        data = np.asarray(entry["data"])
        labels = np.asarray(entry["fine_labels"], dtype=np.int64)
    except KeyError as err:
        raise DataError(f"{where}: missing key {err}") from None
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DataError(f"{where}: data must be N x 3072 uint8, found {data.shape} {data.dtype}")
    if labels.shape != (data.shape[0],):
        raise DataError(f"{where}: {labels.shape[0]} labels for {data.shape[0]} images")
    if labels.size and (labels.min() < 0 or labels.max() >= 100):
        raise DataError(f"{where}: fine labels must lie in 0..99")
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), labels.astype(np.int32)


def write_cifar100(
    data_dir: str, images: np.ndarray, labels: np.ndarray, *, archive: bool = False
) -> str:
    """Write images/labels in the exact `cifar-100-python` format (for tests and demos).

    The real archive is a Python 2 pickle; protocol 2 with the same keys keeps
    the byte layout a reader meets in the wild.
    """
    images = np.asarray(images, dtype=np.uint8)
    entry = {
        b"filenames": [f"synthetic_{i}.png".encode() for i in range(len(images))],
        b"batch_label": b"training batch 1 of 1",
        b"fine_labels": [int(x) for x in labels],
        b"coarse_labels": [int(x) // 5 for x in labels],
        b"data": images.transpose(0, 3, 1, 2).reshape(len(images), -1),
    }
    blob = pickle.dumps(entry, protocol=2)
    meta = pickle.dumps(
        {b"fine_label_names": [f"class_{i}".encode() for i in range(100)]}, protocol=2
    )
    os.makedirs(data_dir, exist_ok=True)
    if archive:
        path = os.path.join(data_dir, CIFAR100_ARCHIVE)
        with tarfile.open(path, "w:gz") as tar:
            for name, payload in (("train", blob), ("meta", meta)):
                info = tarfile.TarInfo(f"{CIFAR100_FOLDER}/{name}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
        return path
    folder = os.path.join(data_dir, CIFAR100_FOLDER)
    os.makedirs(folder, exist_ok=True)
    for name, payload in (("train", blob), ("meta", meta)):
        with open(os.path.join(folder, name), "wb") as handle:
            handle.write(payload)
    return folder


def generate_cifar100(data_dir: str, num_images: int, seed: int = 0, **kwargs) -> str:
    """Write a small random data set in the CIFAR-100 format."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(num_images, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 100, size=num_images)
    return write_cifar100(data_dir, images, labels, **kwargs)


# --------------------------------------------------------------------------
# Sharding and the tf.data pipelines
# --------------------------------------------------------------------------


def shard_indices(num_examples: int, shard_index: int, num_shards: int, seed: int) -> np.ndarray:
    """Indices of the examples shard `shard_index` of `num_shards` reads, in order."""
    if not 0 <= shard_index < num_shards:
        raise ValueError(f"shard {shard_index} of {num_shards} does not exist")
    order = np.random.default_rng(seed).permutation(num_examples)
    return order[shard_index::num_shards]


def _batchable_shard(
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


def cifar100_dataset(
    images: np.ndarray,
    labels: np.ndarray,
    *,
    shard_index: int,
    num_shards: int,
    batch_size: int,
    seed: int,
    augment: bool,
):
    """Batches of (uint8 32x32x3 images, int32 labels) from one shard, repeated forever.

    Images stay uint8 at 32x32 here: normalising and resizing to the model's
    input size happen inside the training step (prepare_images), on the
    accelerator, where they are cheapest and do not starve the input pipeline.
    """
    import tensorflow as tf

    indices = _batchable_shard(len(images), shard_index, num_shards, batch_size, seed)
    dataset = tf.data.Dataset.from_tensor_slices(
        (images[indices], labels[indices], indices.astype(np.int64))
    )
    dataset = dataset.cache().repeat()
    if augment:

        def augment_example(image, label, index):
            key = tf.stack([tf.constant(seed, tf.int64), index])
            padded = tf.image.pad_to_bounding_box(image, 4, 4, 40, 40)
            image = tf.image.stateless_random_crop(padded, [32, 32, 3], seed=key)
            image = tf.image.stateless_random_flip_left_right(image, seed=key + 1)
            return image, label

        dataset = dataset.map(augment_example, num_parallel_calls=tf.data.AUTOTUNE)
    else:
        dataset = dataset.map(lambda image, label, index: (image, label))
    dataset = dataset.batch(batch_size, drop_remainder=True)
    return dataset.prefetch(tf.data.AUTOTUNE)


def synthetic_batch(
    *, shard_index: int, batch_size: int, image_size: int, num_classes: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """One replica's random batch: float32 NHWC images and int32 labels."""
    rng = np.random.default_rng([seed, shard_index])
    images = rng.standard_normal((batch_size, image_size, image_size, 3), dtype=np.float32)
    labels = rng.integers(0, num_classes, size=batch_size).astype(np.int32)
    return images, labels


def synthetic_dataset(*, shard_indices, **batch):
    """One random batch per replica, repeated (Horovod's synthetic benchmark).

    An input pipeline feeding several replicas (MirroredStrategy's one
    pipeline) yields their batches in turn, which tf.distribute hands out
    round-robin: replica r of the run trains on synthetic_batch(shard_index=r)
    whichever framework runs it, as the examples' synthetic data does.
    """
    import tensorflow as tf

    batches = [synthetic_batch(shard_index=index, **batch) for index in shard_indices]
    images, labels = (np.stack(parts) for parts in zip(*batches))
    return tf.data.Dataset.from_tensor_slices((images, labels)).repeat()


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
    """Pad by 4, crop back to 32x32 and maybe flip, each example keyed by (seed, index)."""
    words = _splitmix64(indices.astype(np.uint64) ^ _splitmix64(np.array([seed]))[0])
    rows, cols = (words % 9).astype(np.intp), ((words >> np.uint64(8)) % 9).astype(np.intp)
    flip = ((words >> np.uint64(16)) & np.uint64(1)).astype(bool)
    padded = np.pad(images, ((0, 0), (4, 4), (4, 4), (0, 0)))
    side = np.arange(CIFAR_IMAGE_SIZE)
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
    """cifar100_dataset's batches as NumPy arrays, for ever: (uint8 NHWC images, int64 labels)."""
    indices = _batchable_shard(len(images), shard_index, num_shards, batch_size, seed)
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


def prepare_images(images, image_size: int, compute_dtype: str):
    """Turn a batch from either pipeline into model input: float, normalised, resized.

    Decided at trace time from static shapes, so a synthetic batch that is
    already float at the right size costs nothing here.
    """
    import tensorflow as tf

    if images.dtype == tf.uint8:
        images = tf.cast(images, tf.float32) / 255.0
        images = (images - tf.constant(CIFAR100_MEAN)) / tf.constant(CIFAR100_STD)
    if images.shape[1] != image_size or images.shape[2] != image_size:
        images = tf.image.resize(images, [image_size, image_size], method="bilinear")
    return tf.cast(images, compute_dtype)
