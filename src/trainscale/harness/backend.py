"""The seam between the timed loop and an ecosystem's training code.

trainscale.harness.training runs the same loop for every framework: warm-up steps,
timed blocks each ended by reading the loss (the device sync), every
process's block rate gathered, then the record. Everything that depends on
TensorFlow or torch sits behind a Backend, built once per process:

- prepare(): processes find each other, pick their devices, build the model,
  the optimizer, the precision policy, the sharded input and the compiled
  step. Afterwards `topology` says where this process stands.
- step() runs one training step and returns the loss as the device holds it;
  read_loss() turns it into a float, which waits for the step to finish.
- gather_rows() stacks a row of floats from every process with the
  framework's own collective (Horovod's allgather, the strategy's all-reduce,
  torch.distributed's all_gather): the record's total rate is the SUM of
  every process's rate.
- out_of_memory_errors: the exceptions that mean the device ran out of
  memory, which `trainscale train` turns into an `oom` record;
  ran_out_of_memory() asks of one error, where the type alone cannot tell.

trainscale.catalogue.registry says where each framework's Backend is (`backend`);
trainscale.harness.training imports that module only, so a torch run never imports
TensorFlow and the other way round.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
from dataclasses import dataclass, field

import numpy as np

from trainscale.catalogue.options import RunOptions
from trainscale.catalogue.settings import RunSettings
from trainscale.core.horovod_ranks import require_gloo
from trainscale.core.slurm import horovod_env_from_slurm


class DeviceError(RuntimeError):
    """The process sees fewer devices than the run asked for."""


def require_cuda_devices(count: int) -> None:
    """Fail unless CUDA_VISIBLE_DEVICES names at least `count` devices.

    What SLURM gave this process is checked before TensorFlow starts, so a
    launcher that hides GPUs (a step wrapped in `srun -n1` without --gpus,
    say) is caught even on a CPU run, and no number is reported for it.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = [d for d in (visible or "").split(",") if d.strip()]
    if len(devices) < count:
        raise DeviceError(
            f"this process was given {count} GPU(s) per the job request but sees "
            f"{len(devices)} (CUDA_VISIBLE_DEVICES={visible if visible is not None else '<unset>'})"
        )


@dataclass
class Topology:
    """Where this process stands among the run's: what a framework's set-up
    finds out, written there once (the TensorFlow frameworks fill the
    backend's own)."""

    num_processes: int = 1
    process_index: int = 0
    replicas_in_process: int = 1
    devices: list[str] = field(default_factory=list)

    @property
    def is_chief(self) -> bool:
        return self.process_index == 0

    @property
    def num_replicas(self) -> int:
        return self.num_processes * self.replicas_in_process


class Backend:
    # Whether step()'s loss is already the global mean (tf.distribute reduces
    # it over replicas) or only this process's share, to be summed.
    loss_is_global = True
    out_of_memory_errors: tuple[type[BaseException], ...] = (MemoryError,)
    # Whether a rank's process, its run done, may go through Python's own
    # finalization (trainscale.launching.train_process); see TorchDistributed's reason not to.
    finalizes_at_exit = True

    def __init__(self, settings: RunSettings, options: RunOptions):
        self.settings = settings
        self.options = options
        self.topology = Topology()

    def ran_out_of_memory(self, err: BaseException) -> bool:
        """Whether `err` means the device (or the host) ran out of memory."""
        return isinstance(err, self.out_of_memory_errors)

    def decode_only_rate(self) -> float | None:
        """Images/sec this process's input pipeline yields with no training,
        over a block's batches, for a data set decoded while training
        (core.imagenet); None for any other (default)."""
        return None

    def named_data_error(self, err: BaseException):
        """The DataError naming the file behind `err`, where an input
        pipeline's error names none; None if it is not one (default)."""
        return None

    def prepare(self) -> None:
        raise NotImplementedError

    def step(self):
        raise NotImplementedError

    def after_first_step(self) -> None:
        """Called once, after the first warm-up step (Horovod-TF broadcasts there)."""

    # What observe_collectives() saw: {operation: {"calls", "elements"}}, or None.
    collectives_per_step: dict | None = None

    def observe_collectives(self):
        """A context around one untimed step that notes in collectives_per_step
        the collectives the step ran (default: not observed)."""
        return contextlib.nullcontext()

    # What the step observe_collectives() runs around held at its peak, where
    # --tensor-memory asks and the backend can tell: {"bytes", "by_category", "source"}.
    tensor_memory: dict | None = None

    # What observe_collectives() can see: collectives, tensor memory.
    sees_collectives = False
    sees_tensor_memory = False

    def observes_a_step(self) -> bool:
        """Whether observe_collectives() observes anything: else no step is spent on it."""
        return self.sees_collectives or (self.sees_tensor_memory and self.settings.tensor_memory)

    # -- accuracy mode (trainscale.core.accuracy) --------------------------------

    # Examples in the training split, set by read_splits() (0: synthetic data).
    train_examples = 0
    # Each test class's name, in label order, set by read_splits() in
    # accuracy mode for an image data set (accuracy.scored_classes).
    test_class_names: list[str] = []

    def read_splits(self) -> tuple:
        """(train, test) as (images, labels), read once in prepare(): train None
        for synthetic data, test None outside accuracy mode."""
        from trainscale.core.datasets import DATASETS
        from trainscale.core.text_data import token_windows

        s = self.settings
        dataset = DATASETS[s.dataset]
        if s.mode == "accuracy" and not dataset.is_text:  # a bad meta file fails here
            self.test_class_names = dataset.class_names(s.data_dir)
        if dataset.release is None:
            return None, None
        if dataset.streams:  # its files, decoded while training (core.imagenet)
            # Kept: listing ImageNet's 1.28 M files is not done twice.
            self.train_files = files = dataset.load(s.data_dir)
            self.train_examples = len(files) if files.labels is not None else 0
            return files, None
        names = ("train", "test") if s.mode == "accuracy" else ("train",)
        splits = [dataset.load(s.data_dir, split) for split in names]
        if dataset.is_text:  # a text's tokens, cut into examples of --seq-len
            splits = [token_windows(tokens, s.seq_len) for tokens in splits]
        self.train_examples = len(splits[0][0])
        return splits[0], splits[1] if len(splits) > 1 else None

    def compile_untouched(self) -> None:
        """Compile the training and evaluation steps without touching any data,
        before the clock starts (default: nothing to compile)."""

    def set_learning_rate(self, rate: float) -> None:
        raise NotImplementedError

    def evaluate(self) -> np.ndarray:
        """This process's share of the test split (accuracy.evaluation_shard),
        with the model in inference mode: [summed loss, correct, examples],
        then each scored class's correct and examples (accuracy.scored_classes)."""
        raise NotImplementedError

    def read_loss(self, loss) -> float:
        return float(loss)

    def gather_rows(self, row: np.ndarray) -> np.ndarray:
        """Stack a 1-D float row from every process: shape (num_processes, len(row))."""
        return np.asarray(row, dtype=np.float64)[None, :]

    def gather_json(self, value, width: int = 4096) -> list:
        """Gather one JSON-able value from every process, through gather_rows."""
        blob = json.dumps(value).encode()
        if len(blob) > width:
            raise ValueError(f"value too large to gather ({len(blob)} > {width} bytes)")
        row = np.zeros(width, dtype=np.float64)
        row[: len(blob)] = np.frombuffer(blob, dtype=np.uint8)
        rows = self.gather_rows(row).astype(np.uint8)
        return [json.loads(bytes(r).rstrip(b"\0").decode()) for r in rows]

    def trainable_weights(self) -> list[np.ndarray]:
        """The model's whole trainable weights, in the model's order (the
        equivalence tests). Every process calls it: a framework that shards
        them gathers them here."""
        raise NotImplementedError

    def close(self) -> None:
        """Leave the other processes cleanly, once the run is recorded (default: nothing)."""

    def trainable_parameters(self) -> int:
        """How many numbers the model trains: what a gradient all-reduce moves
        (trainscale.analysis.predict), sharded or not."""
        raise NotImplementedError

    # -- elastic frameworks (FrameworkSpec.elastic; trainscale.core.faults) ----

    # Whether the loop saves the state (save_state) and a restart restores it.
    elastic = False

    def notice(self, event: str, **fields) -> None:
        """An event for the run's timeline (trainscale.harness.run_events sets it)."""

    def run_blocks(self, blocks_from, first_step: int):
        """Run the timed blocks from `first_step` (blocks_from does): here, once;
        a framework that recovers in its own process runs them in its own way."""
        return blocks_from(first_step)

    def save_state(self, path: str, steps: int) -> None:
        """Save the training state after `steps` timed steps (the chief calls it)."""
        raise NotImplementedError

    def restore_state(self, path: str) -> int:
        """Load the state `path` holds, if any, and skip the data it had
        trained on; return the timed steps it had done (0: none saved)."""
        return 0

    def framework_config(self) -> dict:
        """What the framework was configured with beyond the settings (DeepSpeed's
        config), for the record; {} when nothing."""
        return {}

    def peak_memory(self) -> dict:
        """The peak memory of one replica of this process: on GPUs the
        allocator's peak of its device (the largest, for several), on CPUs
        the process's peak resident memory (which its replicas share)."""
        import resource

        rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return {"bytes": int(rss_kib) * 1024, "source": "process peak RSS (CPU run)"}

    def memory_capacity(self) -> dict:
        """The memory one replica of this process may use: on GPUs its
        device's, on CPUs the process's share of what its memory cgroup (or
        else the machine) allows the node's processes."""
        return cpu_memory_capacity(self.settings.processes_per_node())

    def gpu_name(self) -> str:
        raise NotImplementedError

    def peak_precision(self) -> str:
        """The arithmetic a step's FLOPs ran in, whose peak MFU is taken
        against (trainscale.harness.flops): --precision, but `tf32` for a
        float32 run whose ecosystem puts float32 on tensor cores."""
        return self.settings.precision

    def training_flops_per_image(self) -> int:
        raise NotImplementedError

    def software_versions(self) -> dict:
        raise NotImplementedError


def cpu_memory_capacity(processes_on_node: int) -> dict:
    """This process's share of the memory its cgroup (the tightest limit on
    it or a parent: SLURM's --mem), or else the machine, allows: what a CPU
    replica must fit in."""
    from trainscale.core.supervision import MemoryCgroup

    cgroup = MemoryCgroup.of_this_process()
    limit_mib = cgroup.limit_mib() if cgroup else None
    if limit_mib:
        limit, source = int(limit_mib * 2**20), f"memory cgroup {cgroup.folder}"
    else:
        try:
            with open("/proc/meminfo") as handle:
                line = next(line for line in handle if line.startswith("MemTotal"))
        except (OSError, StopIteration):
            return {"bytes": None, "source": "unknown"}
        limit, source = int(line.split()[1]) * 1024, "MemTotal of /proc/meminfo"
    share = max(1, processes_on_node)
    return {"bytes": limit // share, "source": f"{source} / {share} process(es) on the node"}


# --------------------------------------------------------------------------
# Horovod, the same in both ecosystems
# --------------------------------------------------------------------------


def batches_trained(settings: RunSettings, timed_steps: int) -> int:
    """The batches a run had drawn after `timed_steps` timed steps: the
    warm-up's too (accuracy mode has none). An elastic framework's restored
    state skips them, and goes on with the batch it was at."""
    return (settings.warmup_steps if settings.mode != "accuracy" else 0) + timed_steps


def init_horovod(hvd, settings: RunSettings) -> None:
    """hvd.init() for horovod.tensorflow or horovod.torch, with trainscale's settings."""
    if os.environ.get("TRAINSCALE_HOROVOD_GLOO_FROM_SLURM"):
        os.environ.update(horovod_env_from_slurm())
    require_gloo(hvd)
    # Read by Horovod's background thread when it starts, in hvd.init().
    threshold = round(settings.horovod_fusion_threshold_mb * 2**20)
    os.environ["HOROVOD_FUSION_THRESHOLD"] = str(threshold)
    hvd.init()


def horovod_wire_compression(hvd, settings: RunSettings):
    """Horovod's compression of gradients on the wire, as --horovod-compression says."""
    return {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}[
        settings.horovod_compression
    ]


def horovod_versions(module: str) -> dict:
    """Horovod's version and whether it has NCCL, as `module` (horovod.torch,
    horovod.tensorflow) was built; None where it is not installed."""
    try:
        import horovod

        hvd = importlib.import_module(module)
    except ImportError:
        return {"horovod": None, "horovod_nccl": None}
    return {"horovod": horovod.__version__, "horovod_nccl": hvd.nccl_built() or None}
