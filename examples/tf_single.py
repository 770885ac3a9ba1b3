"""VGG-16 on CIFAR-100, a custom training loop, one GPU (or the CPU).

The base of trainscale's TensorFlow examples: tf_horovod.py, tf_mirrored.py
and tf_multiworker.py are this script changed as little as each framework
allows, and `trainscale refactoring` measures those changes. Copy it and run:

    python tf_single.py --data-dir DIR    # DIR holds cifar-100-python.tar.gz

concepts: none
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
    parser = argparse.ArgumentParser(description="VGG-16 on CIFAR-100, custom training loop")
    parser.add_argument("--data-dir", help="folder holding cifar-100-python.tar.gz")
    parser.add_argument("--synthetic", action="store_true", help="random batches, no data set")
    parser.add_argument("--batch-size", type=int, default=64, help="images per GPU per step")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    parser.add_argument("--learning-rate", type=float, default=0.001)
    parser.add_argument("--seed", type=int, default=0)
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


def make_dataset(args):
    if args.synthetic:
        batch = synthetic_batch(0, args.batch_size, args.seed)
        return tf.data.Dataset.from_tensors(batch).repeat()
    images, labels = load_cifar100(args.data_dir)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels))
    dataset = dataset.shuffle(len(images), seed=args.seed).repeat()
    dataset = dataset.map(augment, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.batch(args.batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def make_optimizer(args):
    if args.optimizer == "sgd":
        return tf.keras.optimizers.SGD(args.learning_rate)
    return tf.keras.optimizers.Adam(args.learning_rate)


def main():
    args = parse_args()
    tf.keras.utils.set_random_seed(args.seed)
    model = tf.keras.applications.VGG16(
        weights=None, input_shape=(32, 32, 3), classes=NUM_CLASSES, classifier_activation=None
    )
    optimizer = make_optimizer(args)
    dataset = make_dataset(args)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(autograph=False)  # no Python branch on a tensor: nothing to convert
    def train_step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    for step, (images, labels) in enumerate(dataset.take(args.steps), start=1):
        loss = train_step(images, labels)
        print(f"step {step}/{args.steps}: loss {float(loss):.6f}", flush=True)
        if step == 1:
            start = time.perf_counter()  # the first step traces train_step: not timed
    if args.steps > 1:
        images_per_sec = (args.steps - 1) * args.batch_size / (time.perf_counter() - start)
        print(f"images/sec: {images_per_sec:.1f}")


if __name__ == "__main__":
    main()
