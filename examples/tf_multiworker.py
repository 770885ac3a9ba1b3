"""VGG-16 on CIFAR-100, a custom training loop, every GPU of every node: MultiWorkerMirrored.

tf_mirrored.py with the strategy reassigned, as TensorFlow's "Custom training
loop with Keras and MultiWorkerMirroredStrategy" tutorial teaches, and only
the chief printing. One process (worker) per node, driving its GPUs; each is
told the cluster and its place in it by TF_CONFIG, which the strategy reads:

    python tf_multiworker.py --data-dir DIR      # one node: no TF_CONFIG
    # two nodes: on node1 (index 0) and node2 (index 1)
    TF_CONFIG='{"cluster": {"worker": ["node1:12345", "node2:12345"]},
                "task": {"type": "worker", "index": 0}}' python tf_multiworker.py --data-dir DIR

concepts: distributed dataset, strategy scope, global-batch loss scaling,
replicated step, cross-replica reduction, cluster set-up
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


def main():
    args = parse_args()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    chief = strategy.cluster_resolver.task_id in (None, 0)
    tf.keras.utils.set_random_seed(args.seed)
    with strategy.scope():
        model = tf.keras.applications.VGG16(
            weights=None, input_shape=(32, 32, 3), classes=NUM_CLASSES, classifier_activation=None
        )
        optimizer = make_optimizer(args)
    dataset = make_dataset(args, strategy.num_replicas_in_sync)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=tf.keras.losses.Reduction.NONE
    )

    def train_step(images, labels):
        with tf.GradientTape() as tape:
            per_example_loss = loss_fn(labels, model(images, training=True))
            loss = tf.nn.compute_average_loss(per_example_loss)  # over the GLOBAL batch
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    @tf.function(autograph=False)  # no Python branch on a tensor: nothing to convert
    def distributed_train_step(images, labels):
        per_replica_losses = strategy.run(train_step, args=(images, labels))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

    dataset = strategy.experimental_distribute_dataset(dataset.take(args.steps))
    for step, (images, labels) in enumerate(dataset, start=1):
        loss = distributed_train_step(images, labels)
        if chief:
            print(f"step {step}/{args.steps}: loss {float(loss):.6f}", flush=True)
        if step == 1:
            start = time.perf_counter()  # the first step traces train_step: not timed
    if args.steps > 1:
        global_batch_size = args.batch_size * strategy.num_replicas_in_sync
        images_per_sec = (args.steps - 1) * global_batch_size / (time.perf_counter() - start)
        if chief:
            print(f"images/sec: {images_per_sec:.1f}")


if __name__ == "__main__":
    main()
