"""How each framework distributes the one training step: the Distribution seam,
tf-single and the synchronous tf.distribute strategies (Horovod's is
tf_horovod.py, the parameter server's parameter_server.py).

A framework adds exactly three things to the shared step in tf_backend.py:
- how processes find each other and which devices each one drives (setup),
- how data is sharded over replicas (make_dataset),
- how gradients are reduced (wrap_tape for Horovod; the strategy's optimizer
  all-reduce for tf.distribute) and how a step is run on every replica (run;
  compile_step where steps are scheduled, not run).
It also offers one collective the harness needs, gather_rows, to add up the
measured rates of every process.

Loss convention of the synchronous frameworks: every replica computes
sum(per-example loss) / GLOBAL batch size, and gradients are SUMMED over
replicas. The sum is then the gradient of the mean loss over the global batch,
exactly what tf-single computes on the whole batch. (A parameter server's
worker divides by its own batch: its update is its own.)
"""

from __future__ import annotations

import contextlib
import os

import numpy as np

from trainscale.catalogue.options import RunOptions
from trainscale.catalogue.settings import RunSettings
from trainscale.core.cpus import cpu_share
from trainscale.core.slurm import slurm_port_base
from trainscale.harness.backend import DeviceError, Topology


class Distribution:
    name = ""
    # Whether the loss a step returns is already the global mean (strategies
    # reduce it over replicas) or only this process's share (Horovod).
    loss_is_global = True

    def __init__(self, settings: RunSettings, options: RunOptions, topology: Topology):
        self.settings = settings
        self.options = options
        # The backend's own: what setup() finds out is written there.
        self.topology = topology

    def scope(self):
        return contextlib.nullcontext()

    def make_dataset(self, dataset_fn):
        """This process's input, from dataset_fn(shard_index, num_shards,
        per_replica_batch) -> tf.data.Dataset: what the step's iterator draws
        from and what Keras's fit is given (trainscale.frameworks.tensorflow.keras_fit)."""
        return dataset_fn(0, 1, self.settings.batch_size)

    def make_iterator(self, dataset_fn):
        return iter(self.make_dataset(dataset_fn))

    def wrap_tape(self, tape):
        return tape

    def run(self, replica_step, batch):
        return replica_step(*batch)

    def compile_step(self, replica_step):
        """The loop's step: one step on every replica, compiled. It takes the
        iterator and draws its batch inside the compiled function, as Keras's
        train function does: no Python-side next() and no argument conversion
        per step (10% of a small model's step on a CPU)."""
        import tensorflow as tf

        # No AutoGraph: the step branches on settings (Python values) only,
        # and converting it and every Keras layer it calls cost 2 CPU-s of
        # each process's start (VGG-16: 15.2 -> 13.2 CPU-s, the same loss).
        @tf.function(autograph=False)
        def train_step(iterator):
            return self.run(replica_step, next(iterator))

        return train_step

    def read_loss(self, loss) -> float:
        return float(loss)

    def loss_batch_size(self) -> int:
        """What a replica's summed loss is divided by: the global batch (the
        replicas' gradients are summed into one update)."""
        return self.settings.global_batch_size

    def config(self) -> dict:
        """What the framework was configured with beyond the settings (the record's)."""
        return {}

    def after_first_step(self, model, optimizer) -> None:
        pass

    def gather_rows(self, row: np.ndarray) -> np.ndarray:
        """Stack a 1-D float row from every process: shape (num_processes, len(row))."""
        return np.asarray(row, dtype=np.float64)[None, :]


# --------------------------------------------------------------------------
# Devices
# --------------------------------------------------------------------------


def configure_host(settings: RunSettings, processes_on_node: int) -> None:
    """Threads and device visibility; must run before TensorFlow creates its context."""
    import tensorflow as tf

    if settings.device == "cpu":
        # Hide any GPU: a CPU record must never be helped by an accelerator.
        tf.config.set_visible_devices([], "GPU")
        # Each process gets its share of the cores; oversubscribing two ranks
        # onto two cores with two threads each would measure contention.
        threads = cpu_share(processes_on_node)
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(max(2, threads))
    else:
        for gpu in tf.config.list_physical_devices("GPU"):
            tf.config.experimental.set_memory_growth(gpu, True)


def require_gpus(count: int, who: str) -> list:
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) < count:
        cuda = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
        raise DeviceError(
            f"{who} needs {count} GPU(s) but this process sees {len(gpus)} "
            f"(CUDA_VISIBLE_DEVICES={cuda}); refusing to report a smaller run"
        )
    return gpus


# --------------------------------------------------------------------------
# tf-single
# --------------------------------------------------------------------------


class SingleDevice(Distribution):
    name = "tf-single"

    def setup(self) -> None:
        configure_host(self.settings, 1)
        if self.settings.device == "gpu":
            require_gpus(1, "tf-single")
            self.topology.devices = ["/GPU:0"]
        else:
            self.topology.devices = ["/CPU:0"]

    def scope(self):
        import tensorflow as tf

        return tf.device(self.topology.devices[0])


# --------------------------------------------------------------------------
# tf.distribute strategies (tf-mirrored, tf-multiworker)
# --------------------------------------------------------------------------


class Strategy(Distribution):
    """Common code of the tf.distribute strategies; subclasses only build the strategy."""

    def setup(self) -> None:
        self.strategy = self.create_strategy()
        replicas = self.strategy.num_replicas_in_sync
        self.topology.replicas_in_process = replicas // self.topology.num_processes
        if replicas != self.settings.replicas:
            raise DeviceError(
                f"{self.name} has {replicas} replicas in sync but the run asks for "
                f"{self.settings.replicas}"
            )

    def scope(self):
        return self.strategy.scope()

    def make_dataset(self, dataset_fn):
        global_batch = self.settings.global_batch_size

        def per_pipeline(context):
            return dataset_fn(
                context.input_pipeline_id,
                context.num_input_pipelines,
                context.get_per_replica_batch_size(global_batch),
            )

        return self.strategy.distribute_datasets_from_function(per_pipeline)

    def run(self, replica_step, batch):
        import tensorflow as tf

        per_replica_loss = self.strategy.run(replica_step, args=batch)
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss, axis=None)

    def gather_rows(self, row: np.ndarray) -> np.ndarray:
        # Each process fills its own row of a zero matrix; a SUM all-reduce
        # over replicas, counting only the first replica of each process,
        # stacks the rows. Exact for the small integers and rates sent here.
        import tensorflow as tf

        row = np.asarray(row, dtype=np.float64)
        mine = np.zeros((self.topology.num_processes, row.size), dtype=np.float64)
        mine[self.topology.process_index] = row
        zeros = np.zeros_like(mine)
        per_process = self.topology.replicas_in_process

        def value(context):
            first_of_process = context.replica_id_in_sync_group % per_process == 0
            return tf.constant(mine if first_of_process else zeros)

        values = self.strategy.experimental_distribute_values_from_function(value)
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, values, axis=None).numpy()


def local_replica_devices(distribution: Distribution) -> list[str]:
    """The devices of one process's replicas: its GPUs, or on a CPU run as
    many logical CPU devices as it has "GPUs" per node."""
    import tensorflow as tf

    settings, count = distribution.settings, distribution.settings.gpus_per_node
    if settings.device == "cpu":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
        )
        configure_host(settings, 1)
        return [d.name for d in tf.config.list_logical_devices("CPU")][:count]
    configure_host(settings, 1)
    require_gpus(count, distribution.name)
    return [d.name for d in tf.config.list_logical_devices("GPU")][:count]


class Mirrored(Strategy):
    name = "tf-mirrored"

    def create_strategy(self):
        import tensorflow as tf

        self.topology.devices = local_replica_devices(self)
        # On GPUs NCCL's all-reduce, TensorFlow's default; among logical CPU
        # devices of one process a reduction to one of them.
        cpu = self.settings.device == "cpu"
        cross_device_ops = tf.distribute.ReductionToOneDevice() if cpu else None
        return tf.distribute.MirroredStrategy(
            self.topology.devices, cross_device_ops=cross_device_ops
        )


class CentralStorage(Strategy):
    """Variables on the host's CPU, the step replicated over its devices; each
    replica reads the variables from there and its gradients are summed there."""

    name = "tf-central-storage"

    def create_strategy(self):
        import tensorflow as tf

        self.topology.devices = local_replica_devices(self)
        return tf.distribute.experimental.CentralStorageStrategy(
            compute_devices=self.topology.devices, parameter_device="/CPU:0"
        )


class MultiWorker(Strategy):
    name = "tf-multiworker"

    def create_strategy(self):
        import tensorflow as tf

        resolver = self.cluster_resolver()
        workers = resolver.cluster_spec().num_tasks("worker")
        self.topology.num_processes, self.topology.process_index = workers, resolver.task_id
        configure_host(self.settings, self.settings.processes_per_node())
        if self.settings.device == "gpu":
            require_gpus(self.settings.gpus_per_node, f"tf-multiworker worker {resolver.task_id}")
        choice = self.settings.collective_implementation
        if choice == "auto":
            choice = "nccl" if self.settings.device == "gpu" else "ring"
        implementation = {
            "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
            "ring": tf.distribute.experimental.CommunicationImplementation.RING,
        }[choice]
        # Without a timeout a stalled (not dead) worker holds the others in a
        # collective for ever: TF's peer health check does not notice it.
        timeout = self.options.collective_timeout or None
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=implementation,
            timeout_seconds=timeout,
            bytes_per_pack=round(self.settings.all_reduce_pack_mb * 2**20),
        )
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=resolver, communication_options=options
        )
        self.topology.devices = list(strategy.extended.worker_devices)
        return strategy

    def cluster_resolver(self):
        import tensorflow as tf

        if "TF_CONFIG" in os.environ:
            return tf.distribute.cluster_resolver.TFConfigClusterResolver()
        if "SLURM_STEP_ID" in os.environ and "SLURM_PROCID" in os.environ:
            return self.slurm_resolver()
        raise DeviceError(
            "tf-multiworker needs TF_CONFIG (set by `trainscale run`) or a SLURM job step (srun)"
        )

    def slurm_resolver(self):
        """SlurmClusterResolver for this job step, on GPUs or CPUs.

        Its defaults ask nvidia-smi for the GPU count (absent on CPU nodes) and
        refuse 0 GPUs, so both counts are given: on GPUs each worker holds its
        node's G GPUs; on CPUs each worker is one replica and the resolver is
        told of one "GPU" per task, not set, and wrapped to say there are none.
        """
        import tensorflow as tf

        resolvers = tf.distribute.cluster_resolver
        port_base = slurm_port_base(os.environ["SLURM_JOB_ID"])
        if self.settings.device == "gpu":
            gpus = self.settings.gpus_per_node
            return resolvers.SlurmClusterResolver(
                port_base=port_base, gpus_per_node=gpus, gpus_per_task=gpus, auto_set_gpu=True
            )
        per_node = self.settings.processes_per_node()
        slurm = resolvers.SlurmClusterResolver(
            port_base=port_base, gpus_per_node=per_node, gpus_per_task=1, auto_set_gpu=False
        )
        cluster = slurm.cluster_spec().as_dict()  # also sets task_type and task_id
        return resolvers.SimpleClusterResolver(
            tf.train.ClusterSpec(on_this_network(cluster)),
            task_type=slurm.task_type,
            task_id=slurm.task_id,
            num_accelerators={},
            rpc_layer="grpc",
        )


def on_this_network(cluster: dict) -> dict:
    """The cluster's addresses on the run's network. TensorFlow's tasks reach
    each other by host name, which names the hosts' first network; a study's
    network (cluster.networks) names its own hosts by a suffix,
    TRAINSCALE_TF_HOST_SUFFIX (the SLURM lab's /etc/hosts: node1-shaped)."""
    suffix = os.environ.get("TRAINSCALE_TF_HOST_SUFFIX", "")
    if not suffix:
        return cluster
    return {
        job: [f"{host}{suffix}:{port}" for host, _, port in (a.rpartition(":") for a in tasks)]
        for job, tasks in cluster.items()
    }


def create_distribution(
    distribution_class: type[Distribution],
    settings: RunSettings,
    options: RunOptions,
    topology: Topology,
) -> Distribution:
    distribution = distribution_class(settings, options, topology)
    distribution.setup()
    return distribution
