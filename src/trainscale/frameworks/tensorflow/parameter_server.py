"""tf-ps: tf.distribute.ParameterServerStrategy driven by a ClusterCoordinator,
as TensorFlow's parameter-server tutorial teaches it, and what its parameter
servers and workers run.

The run's processes have roles (trainscale.catalogue.parameter_server_kind.ParameterServers):
the chief is the coordinator and runs the harness's loop; the parameter
servers hold the variables, partitioned over them; each worker trains one
replica. Training is ASYNCHRONOUS: the coordinator schedules functions of
several steps each on whichever worker is free, and a worker reads the
variables from the servers, computes its batch's gradient and sends it back,
where it is applied on its own, with no wait for the other workers.

One step of the loop is one step's worth on every worker (W worker steps,
scheduled as functions of `ps_steps_per_function` steps), so a block's
images are counted as for the synchronous frameworks; reading the loss joins
the coordinator, which waits for every scheduled function: the throughput is
of steps that completed.
"""

from __future__ import annotations

import os
import socket
import sys
import time

from trainscale.catalogue.options import RunOptions
from trainscale.catalogue.registry import framework_spec
from trainscale.catalogue.settings import RunSettings
from trainscale.core.process_exit import exit_now
from trainscale.core.slurm import slurm_port_base
from trainscale.frameworks.tensorflow.strategies import (
    Distribution,
    configure_host,
    on_this_network,
)
from trainscale.harness.backend import DeviceError

# Variables smaller than this stay whole on one server (the tutorial's choice).
MIN_SHARD_BYTES = 256 << 10
# Each worker's batches, shuffled in windows of this many.
SHUFFLED_BATCHES = 64


def cluster_resolver(settings: RunSettings):
    """This task's place in the cluster: TF_CONFIG here, its srun step under SLURM."""
    import tensorflow as tf

    resolvers = tf.distribute.cluster_resolver
    if "TF_CONFIG" in os.environ:
        return resolvers.TFConfigClusterResolver()
    if "SLURM_STEP_ID" not in os.environ:
        raise DeviceError("tf-ps needs TF_CONFIG (set by `trainscale run`) or a SLURM job step")
    # The resolver fills its jobs in sorted name order (chief, ps, worker),
    # the order of the launch kind's roles, node by node.
    jobs = role_counts(settings)
    per_node = settings.processes_per_node()
    slurm = resolvers.SlurmClusterResolver(
        jobs=jobs,
        port_base=slurm_port_base(os.environ["SLURM_JOB_ID"]),
        gpus_per_node=per_node,
        gpus_per_task=1,
        auto_set_gpu=False,
    )
    cluster = on_this_network(slurm.cluster_spec().as_dict())  # sets task_type, task_id
    return resolvers.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster),
        task_type=slurm.task_type,
        task_id=slurm.task_id,
        num_accelerators={},
    )


def role_counts(settings: RunSettings) -> dict[str, int]:
    """The run's roles and their counts, as its launch kind declares them."""
    return {
        role.name: role.count for role in framework_spec(settings.framework).launch.roles(settings)
    }


def processes_here(cluster: dict, address: str) -> int:
    """How many of the cluster's tasks run on the host of `address`."""
    host = address.rsplit(":", 1)[0]
    return sum(a.rsplit(":", 1)[0] == host for tasks in cluster.values() for a in tasks)


def serve(settings: RunSettings, options: RunOptions) -> None:
    """A parameter server's or a worker's whole run: a tf.distribute.Server
    for its task, until the chief ends.

    A server joins for ever (tf.distribute.Server.join); the one sign of the
    chief's end that reaches another node is its address no longer taking
    connections, so that is watched, and the process then ends itself. (Here
    `trainscale run` ends it too: run_plan.)"""
    import tensorflow as tf

    resolver = cluster_resolver(settings)
    cluster = resolver.cluster_spec()
    address = cluster.task_address(resolver.task_type, resolver.task_id)
    configure_host(settings, processes_here(cluster.as_dict(), address))
    tf.distribute.Server(
        cluster, job_name=resolver.task_type, task_index=resolver.task_id, start=True
    )
    role = f"{resolver.task_type} {resolver.task_id}"
    print(f"[trainscale] tf-ps {role} serving at {address}", file=sys.stderr, flush=True)
    wait_for_chief(cluster.task_address("chief", 0), options.collective_timeout or 600)
    exit_now(0)  # the server's threads never end by themselves


def wait_for_chief(address: str, start_within: float) -> None:
    """Return once the chief at `address` has taken connections and stopped;
    raise if it never took one within `start_within` seconds."""
    host, port = address.rsplit(":", 1)
    deadline, seen = time.monotonic() + start_within, False
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
            seen = True
        except OSError:
            if seen:
                return
            if time.monotonic() > deadline:
                raise DeviceError(f"tf-ps: the chief at {address} never started") from None
        time.sleep(0.5)


class ParameterServer(Distribution):
    """The chief's side: the strategy, the coordinator, and the loop's steps
    scheduled on the workers."""

    name = "tf-ps"

    def setup(self) -> None:
        import tensorflow as tf

        s = self.settings
        resolver = cluster_resolver(s)
        cluster = resolver.cluster_spec()
        found = {job: cluster.num_tasks(job) for job in cluster.jobs}
        if found != role_counts(s):
            raise DeviceError(f"tf-ps has the tasks {found} but the run asks for {role_counts(s)}")
        self.workers, servers = found["worker"], found["ps"]
        configure_host(s, processes_here(cluster.as_dict(), cluster.task_address("chief", 0)))
        # The coordinator waits on a closure per worker at once: with no more
        # inter-op threads than workers they wait on each other (TF's
        # parameter-server tutorial), so it gets one more.
        tf.config.threading.set_inter_op_parallelism_threads(self.workers + 1)
        partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=MIN_SHARD_BYTES, max_shards=servers
        )
        self.strategy = tf.distribute.ParameterServerStrategy(
            resolver, variable_partitioner=partitioner
        )
        self.coordinator = tf.distribute.coordinator.ClusterCoordinator(self.strategy)
        self.cluster = cluster.as_dict()
        # One process runs the loop and counts every worker's images.
        self.topology.replicas_in_process = self.workers
        kind = "GPU" if s.device == "gpu" else "CPU"
        self.topology.devices = [
            f"/job:worker/replica:0/task:{i}/device:{kind}:0" for i in range(self.workers)
        ]
        self.pending, self.scheduled, self.worker_steps_completed = 0, [], 0

    def scope(self):
        return self.strategy.scope()

    def loss_batch_size(self) -> int:
        return self.settings.batch_size  # each worker's step is an update of its own

    def make_iterator(self, dataset_fn):
        import tensorflow as tf

        batch, workers = self.settings.batch_size, self.workers

        def per_worker(context):
            # Every worker builds the same pipeline (the strategy gives each
            # input pipeline 0 of 1): each shuffles its batches its own way.
            dataset = dataset_fn(0, 1, batch)
            if workers == 1:  # the harness's one device's batches
                return dataset
            return dataset.shuffle(SHUFFLED_BATCHES, seed=_seed_of_this_worker())

        @tf.function
        def per_worker_dataset():
            return self.strategy.distribute_datasets_from_function(per_worker)

        return iter(self.coordinator.create_per_worker_dataset(per_worker_dataset))

    def compile_step(self, replica_step):
        import tensorflow as tf

        strategy = self.strategy

        @tf.function
        def worker_steps(iterator, count):
            loss = tf.constant(0.0)
            for _ in tf.range(count):
                loss = strategy.run(replica_step, args=next(iterator))
            return loss

        self.worker_steps = worker_steps
        return self.schedule

    def schedule(self, iterator):
        """One step of the loop: W worker steps, scheduled in functions of K
        steps; until the first loss is read (the warm-up) in functions of one,
        so that every worker runs (and instantiates) the function before the clock."""
        self.iterator = iterator
        self.pending += self.workers
        per_function = self.settings.ps_steps_per_function if self.worker_steps_completed else 1
        while self.pending >= per_function:
            self._schedule(per_function)
        return self

    def _schedule(self, count: int) -> None:
        import tensorflow as tf

        args = (self.iterator, tf.constant(count))
        self.scheduled.append((count, self.coordinator.schedule(self.worker_steps, args=args)))
        self.pending -= count

    def read_loss(self, loss) -> float:
        """Schedule what is pending, wait for every function (join), and count
        the worker steps that completed; the loss of the last one."""
        if self.pending:
            self._schedule(self.pending)
        self.coordinator.join()
        self.worker_steps_completed += sum(count for count, _ in self.scheduled)
        value = float(self.scheduled[-1][1].fetch())
        self.scheduled = []
        return value

    def config(self) -> dict:
        return {
            "asynchronous": True,
            "cluster": self.cluster,
            "steps_per_function": self.settings.ps_steps_per_function,
            "min_shard_bytes": MIN_SHARD_BYTES,
            "worker_steps_completed": self.worker_steps_completed,
        }


def _seed_of_this_worker():
    """A seed the kernel draws itself (seeds 0, 0 ask it to): the graph is
    the same on every worker, its value is not."""
    import tensorflow as tf

    return tf.raw_ops.RandomUniformInt(
        shape=tf.constant([], tf.int32),
        minval=tf.constant(1, tf.int64),
        maxval=tf.constant(1 << 62, tf.int64),
    )
