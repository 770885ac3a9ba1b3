"""VGG-16 on CIFAR-100, Keras's compile and fit, every GPU of one node: MirroredStrategy.

tf_single_fit.py changed as TensorFlow's "Distributed training with Keras"
tutorial teaches: the model built and compiled in the strategy's scope, fit
given batches of the global batch size, which it splits over the replicas.
One process drives every GPU of the node; one node only:

    python tf_mirrored_fit.py --data-dir DIR

concepts: strategy scope
"""

import argparse
import os
import pickle
import tarfile
import time

import numpy as np
import tensorflow as tf

NUM_CLASSES = 100
# Per-channel mean and standard deviation of the CIFAR-100 training images.
MEAN = (0.5071, 0.4865, 0.4409)
STD = (0.2673, 0.2564, 0.2762)


def parse_args():
    parser = argparse.ArgumentParser(description="VGG-16 on CIFAR-100, Keras fit")
    parser.add_argument("--data-dir", help="folder holding cifar-100-python.tar.gz")
    parser.add_argument("--synthetic", action="store_true", help="random batches, no data set")
    parser.add_argument("--batch-size", type=int, default=64, help="images per GPU per step")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    parser.add_argument("--learning-rate", type=float, default=0.001)
    parser.add_argument("--seed", type=int, default=0)
    # >>> CPU stand-in
    parser.add_argument("--cpu-replicas", type=int, default=0, help="with no GPU: replicas")
    # <<< CPU stand-in
    return parser.parse_args()


def load_cifar100(data_dir):
    """Training images (N x 32 x 32 x 3, uint8) and fine labels of CIFAR-100's python version."""
    archive = os.path.join(data_dir, "cifar-100-python.tar.gz")
    if os.path.exists(archive):
        with tarfile.open(archive) as tar:
            train = pickle.load(tar.extractfile("cifar-100-python/train"), encoding="bytes")
    else:  # the archive, extracted
        with open(os.path.join(data_dir, "cifar-100-python", "train"), "rb") as handle:
            train = pickle.load(handle, encoding="bytes")
    images = train[b"data"].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return images, np.array(train[b"fine_labels"], dtype=np.int32)


def augment(image, label):
    """Pad-and-crop and a horizontal flip, then normalise: the usual CIFAR recipe."""
    image = tf.image.resize_with_crop_or_pad(image, 40, 40)
    image = tf.image.random_crop(image, [32, 32, 3])
    image = tf.image.random_flip_left_right(image)
    image = (tf.cast(image, tf.float32) / 255.0 - MEAN) / STD
    return image, label


def synthetic_batch(replica, batch_size, seed):
    """Replica `replica`'s random batch, the same every step (Horovod's synthetic benchmark)."""
    rng = np.random.default_rng([seed, replica])
    images = rng.standard_normal((batch_size, 32, 32, 3), dtype=np.float32)
    return images, rng.integers(0, NUM_CLASSES, size=batch_size).astype(np.int32)


def make_dataset(args, replicas):
    if args.synthetic:
        parts = [synthetic_batch(r, args.batch_size, args.seed) for r in range(replicas)]
        batch = tuple(np.concatenate(part) for part in zip(*parts))
        return tf.data.Dataset.from_tensors(batch).repeat()
    images, labels = load_cifar100(args.data_dir)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels))
    dataset = dataset.shuffle(len(images), seed=args.seed).repeat()
    dataset = dataset.map(augment, num_parallel_calls=tf.data.AUTOTUNE)
    global_batch_size = args.batch_size * replicas
    return dataset.batch(global_batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def make_optimizer(args):
    if args.optimizer == "sgd":
        return tf.keras.optimizers.SGD(args.learning_rate)
    return tf.keras.optimizers.Adam(args.learning_rate)


class StepLogger(tf.keras.callbacks.Callback):
    """Each step's loss as fit reports it (the mean over the epoch so far),
    and images/sec from the end of the first step, which traces fit's step."""

    def __init__(self, steps, images_per_step):
        super().__init__()
        self.steps, self.images_per_step = steps, images_per_step

    def on_train_batch_end(self, batch, logs=None):
        print(f"step {batch + 1}/{self.steps}: loss {logs['loss']:.6f}", flush=True)
        if batch == 0:
            self.start = time.perf_counter()

    def on_train_end(self, logs=None):
        if self.steps > 1:
            seconds = time.perf_counter() - self.start
            print(f"images/sec: {(self.steps - 1) * self.images_per_step / seconds:.1f}")


def main():
    args = parse_args()
    # >>> CPU stand-in: with no GPU, logical CPU devices play the GPUs, so the
    # script runs anywhere (trainscale's tests); not counted as refactoring.
    devices = None
    if args.cpu_replicas and not tf.config.list_physical_devices("GPU"):
        cpu = tf.config.list_physical_devices("CPU")[0]
        logical = [tf.config.LogicalDeviceConfiguration()] * args.cpu_replicas
        tf.config.set_logical_device_configuration(cpu, logical)
        devices = [device.name for device in tf.config.list_logical_devices("CPU")]
    # <<< CPU stand-in
    strategy = tf.distribute.MirroredStrategy(devices)
    tf.keras.utils.set_random_seed(args.seed)
    with strategy.scope():
        model = tf.keras.applications.VGG16(
            weights=None, input_shape=(32, 32, 3), classes=NUM_CLASSES, classifier_activation=None
        )
        model.compile(
            optimizer=make_optimizer(args),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    replicas = strategy.num_replicas_in_sync
    logger = StepLogger(args.steps, args.batch_size * replicas)
    model.fit(
        make_dataset(args, replicas),
        epochs=1,
        steps_per_epoch=args.steps,
        callbacks=[logger],
        verbose=0,
    )


if __name__ == "__main__":
    main()
