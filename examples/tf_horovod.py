"""VGG-16 on CIFAR-100, a custom training loop, every GPU of every node: Horovod.

tf_single.py changed as Horovod's TensorFlow 2 guide teaches: initialise,
pin one GPU per process, shard the data, wrap the tape, broadcast the
initial state from rank 0. One process per GPU; on one node or many:

    horovodrun -np 4 python tf_horovod.py --data-dir DIR
    horovodrun -np 8 -H node1:4,node2:4 python tf_horovod.py --data-dir DIR

The learning rate is the base's (Horovod's guide scales it by hvd.size()):
trainscale compares frameworks at equal hyper-parameters.

concepts: process group, rank and size, device pinning, data sharding,
gradient all-reduce, variable broadcast, cross-replica reduction
"""

import argparse
import os
import pickle
import tarfile
import time

import horovod.tensorflow as hvd
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
        batch = synthetic_batch(hvd.rank(), args.batch_size, args.seed)
        return tf.data.Dataset.from_tensors(batch).repeat()
    images, labels = load_cifar100(args.data_dir)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).shard(hvd.size(), hvd.rank())
    dataset = dataset.shuffle(len(images), seed=args.seed).repeat()
    dataset = dataset.map(augment, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.batch(args.batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def make_optimizer(args):
    if args.optimizer == "sgd":
        return tf.keras.optimizers.SGD(args.learning_rate)
    return tf.keras.optimizers.Adam(args.learning_rate)


def main():
    args = parse_args()
    hvd.init()
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
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
        tape = hvd.DistributedGradientTape(tape)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    for step, (images, labels) in enumerate(dataset.take(args.steps), start=1):
        loss = hvd.allreduce(train_step(images, labels))
        if hvd.rank() == 0:
            print(f"step {step}/{args.steps}: loss {float(loss):.6f}", flush=True)
        if step == 1:
            # After the first step, when the optimizer has made its state.
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(optimizer.variables(), root_rank=0)
            start = time.perf_counter()  # the first step traces train_step: not timed
    if args.steps > 1:
        images_per_sec = (args.steps - 1) * args.batch_size / (time.perf_counter() - start)
        images_per_sec = hvd.allreduce(tf.constant(images_per_sec), op=hvd.Sum)
        if hvd.rank() == 0:
            print(f"images/sec: {float(images_per_sec):.1f}")


if __name__ == "__main__":
    main()
