"""VGG-16 on CIFAR-100, a custom training loop, parameter servers: ParameterServerStrategy.

tf_single.py changed as TensorFlow's "Parameter server training with
ParameterServerStrategy" tutorial teaches its custom training loop: workers
and parameter servers run a tf.distribute.Server; the chief (the
coordinator) creates the model in the strategy's scope, its variables
partitioned over the servers, gives every worker a dataset of its own, and
schedules functions of several steps on whichever worker is free.
ASYNCHRONOUS: each worker's step is an update of its own, applied on the
servers without waiting for the other workers. Every process is told the
cluster and its role in TF_CONFIG:

    # on each process: T is chief, ps or worker, I its index among them
    TF_CONFIG='{"cluster": {"chief": ["node1:2222"], "ps": ["node1:2223"],
                            "worker": ["node2:2222", "node2:2223"]},
                "task": {"type": "T", "index": I}}' python tf_ps.py --data-dir DIR

concepts: cluster set-up, parameter servers, strategy scope, distributed dataset,
data sharding, global-batch loss scaling, replicated step
"""

import argparse
import os
import pickle
import tarfile
import time

import numpy as np
import tensorflow as tf

os.environ["GRPC_FAIL_FAST"] = "use_caller"  # a lost server fails the coordinator's call

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
    parser.add_argument("--steps-per-function", type=int, default=4)
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
    cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if cluster_resolver.task_type in ("worker", "ps"):
        server = tf.distribute.Server(
            cluster_resolver.cluster_spec(),
            job_name=cluster_resolver.task_type,
            task_index=cluster_resolver.task_id,
            protocol="grpc",
            start=True,
        )
        server.join()  # serves until the launcher ends it
    servers = cluster_resolver.cluster_spec().num_tasks("ps")
    variable_partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=256 << 10, max_shards=servers
    )
    strategy = tf.distribute.ParameterServerStrategy(
        cluster_resolver, variable_partitioner=variable_partitioner
    )
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    tf.keras.utils.set_random_seed(args.seed)
    with strategy.scope():
        model = tf.keras.applications.VGG16(
            weights=None, input_shape=(32, 32, 3), classes=NUM_CLASSES, classifier_activation=None
        )
        optimizer = make_optimizer(args)

    @tf.function
    def per_worker_dataset_fn():
        return strategy.distribute_datasets_from_function(lambda context: make_dataset(args))

    per_worker_iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=tf.keras.losses.Reduction.NONE
    )

    def train_step(images, labels):
        with tf.GradientTape() as tape:
            per_example_loss = loss_fn(labels, model(images, training=True))
            loss = tf.nn.compute_average_loss(per_example_loss)  # over this worker's batch
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    @tf.function
    def train_steps(iterator, count):
        losses = tf.TensorArray(tf.float32, size=count)
        for i in tf.range(count):
            losses = losses.write(i, strategy.run(train_step, args=next(iterator)))
        return losses.stack()

    # The tutorial's loop: schedule every function, then wait for them all.
    steps = range(0, args.steps, args.steps_per_function)
    counts = [min(args.steps_per_function, args.steps - step) for step in steps]
    start = time.perf_counter()
    scheduled = [coordinator.schedule(train_steps, args=(per_worker_iterator, n)) for n in counts]
    coordinator.join()
    seconds = time.perf_counter() - start
    losses = [float(loss) for result in scheduled for loss in result.fetch()]
    for step, loss in enumerate(losses, start=1):
        print(f"step {step}/{args.steps}: loss {loss:.6f}", flush=True)
    print(f"images/sec: {args.steps * args.batch_size / seconds:.1f} (tracing included)")


if __name__ == "__main__":
    main()
