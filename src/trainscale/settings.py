"""What one grid point is: the settings of one benchmark run, validated up front.

This module imports no TensorFlow, so the launcher, the workflow and the tests
can check settings in milliseconds. Every check names the command-line option
it is about, because the message is what a user sees.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass

from trainscale.registry import FRAMEWORKS, REGISTRY, framework_spec

DATASETS = ("cifar100", "synthetic")
DEVICES = ("gpu", "cpu")
OPTIMIZERS = ("adam", "sgd")
PRECISIONS = ("fp32", "fp16", "bf16")
# How Horovod ranks are started: MPI (mpirun here, srun --mpi=pmix under SLURM)
# or Gloo (horovodrun --gloo here, srun with a rendezvous server under SLURM).
HOROVOD_LAUNCHERS = ("mpi", "gloo")
# Horovod's gradient compression on the wire (hvd.Compression.none / .fp16).
HOROVOD_COMPRESSIONS = ("none", "fp16")
# DDP's gradient compression: none, or fp16 (the fp16_compress_hook).
DDP_COMPRESSIONS = ("none", "fp16")
# MultiWorkerMirrored's all-reduce: auto is NCCL on GPUs and RING on CPUs.
COLLECTIVE_IMPLEMENTATIONS = ("auto", "ring", "nccl")

# Smallest input side each model accepts (Keras' own limits for the
# applications; small_cnn needs two 5x5 convolutions and two 2x2 poolings).
MODEL_MIN_IMAGE_SIZE = {
    "vgg16": 32,
    "vgg19": 32,
    "resnet50": 32,
    "mobilenet_v2": 32,
    "inception_v3": 75,
    "small_cnn": 16,
}
MODELS = tuple(MODEL_MIN_IMAGE_SIZE)
# The models defined for torch too, as the same networks (trainscale.torch_models);
# the torch frameworks refuse the others.
TORCH_MODELS = ("vgg16", "vgg19", "resnet50", "small_cnn")

NUM_CLASSES = {"cifar100": 100, "synthetic": 100}


class SettingsError(ValueError):
    """A setting is invalid; the message names the option and fits on one line."""


@dataclass(frozen=True)
class RunSettings:
    """One grid point plus how it is measured. Defaults follow the paper (seed 000)."""

    framework: str
    nodes: int = 1
    gpus_per_node: int = 1
    model: str = "vgg16"
    batch_size: int = 64  # per replica, as in the paper
    image_size: int = 224
    dataset: str = "cifar100"
    data_dir: str = "data"
    device: str = "gpu"
    warmup_steps: int = 10
    iterations: int = 10
    steps_per_iteration: int = 20
    # 0: time exactly `iterations` blocks. Else stop once the timed blocks
    # have taken this long (at least 2 blocks, at most `iterations`): a demo's
    # work bounded by time on a CPU of any speed (trainscale.timing.BlockBudget).
    time_budget_seconds: float = 0.0
    seed: int = 1234
    optimizer: str = "adam"
    learning_rate: float = 1e-3
    precision: str = "fp32"
    xla: bool = False
    augment: bool = True
    horovod_launcher: str = "mpi"
    # Communication knobs (seed 001: they can change which framework wins).
    horovod_compression: str = "none"
    horovod_fusion_threshold_mb: float = 64.0  # Horovod's default; 0 turns fusion off
    collective_implementation: str = "auto"  # tf-multiworker
    all_reduce_pack_mb: float = 0.0  # tf-multiworker bytes_per_pack; 0: TensorFlow decides
    # The torch frameworks' knobs, mirroring the TensorFlow ones: torch.compile
    # (beside xla), channels-last memory layout, DDP's gradient bucket size
    # (beside Horovod's fusion buffer; 25 MB is DDP's default) and DDP's fp16
    # compression communication hook (beside Horovod's fp16 compression).
    compile: bool = False
    channels_last: bool = False
    ddp_bucket_cap_mb: float = 25.0
    ddp_compression: str = "none"

    @property
    def replicas(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.replicas

    @property
    def num_classes(self) -> int:
        return NUM_CLASSES[self.dataset]

    def processes_per_node(self) -> int:
        """How many OS processes one node runs (trainscale.registry)."""
        return framework_spec(self.framework).processes_per_node(self.gpus_per_node, self.device)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def settings_hash(self) -> str:
        """Hash of everything that changes what is measured.

        Two records with the same hash measured the same thing, so their
        numbers may be averaged; `data_dir` is left out because the same data
        may live in different places.
        """
        measured = {k: v for k, v in self.to_dict().items() if k != "data_dir"}
        blob = json.dumps(measured, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def to_cli_args(self) -> list[str]:
        """The options that reproduce these settings on `trainscale train`."""
        args: list[str] = []
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            flag = "--" + field.name.replace("_", "-")
            if isinstance(value, bool):
                args.append(flag if value else "--no-" + field.name.replace("_", "-"))
            else:
                args += [flag, str(value)]
        return args


@dataclass(frozen=True)
class RunOptions:
    """How one run is carried out and where its results go: nothing here
    changes what is measured, so none of it enters the settings hash."""

    output: str | None = None  # the JSON record, written atomically
    weights_file: str | None = None  # initial and final weights (equivalence tests)
    # (train) fail unless CUDA_VISIBLE_DEVICES names at least this many devices
    expect_cuda_devices: int = 0
    # (run) the GPUs per node the job asked its scheduler for
    requested_gpus_per_node: int = 0
    timeout: float = 0.0  # (run) the watchdog; 0: none
    # A collective waiting this long for a stalled rank fails the run; 0: forever.
    # Long enough for the first step's tracing skew between ranks, short
    # enough that a stalled rank does not hold a cluster allocation for long.
    collective_timeout: float = 300.0
    attempt: int = 1  # (run) which attempt at this grid point this is
    attempts: int = 0  # (run) from this attempt on, a failure writes a `failed` record


def _positive(name: str, value: int) -> None:
    if value <= 0:
        raise SettingsError(f"--{name} must be a positive integer, got {value}")


def validate(settings: RunSettings, *, check_data: bool = True) -> RunSettings:
    """Raise SettingsError for the first invalid setting; return the settings."""
    s = settings
    if s.framework not in FRAMEWORKS:
        raise SettingsError(
            f"--framework {s.framework!r} is unknown; choose one of {', '.join(FRAMEWORKS)}"
        )
    if s.model not in MODELS:
        raise SettingsError(f"--model {s.model!r} is unknown; choose one of {', '.join(MODELS)}")
    if s.dataset not in DATASETS:
        raise SettingsError(
            f"--dataset {s.dataset!r} is unknown; choose one of {', '.join(DATASETS)}"
        )
    if s.device not in DEVICES:
        raise SettingsError(f"--device {s.device!r} is unknown; choose one of {', '.join(DEVICES)}")
    if s.optimizer not in OPTIMIZERS:
        raise SettingsError(
            f"--optimizer {s.optimizer!r} is unknown; choose one of {', '.join(OPTIMIZERS)}"
        )
    if s.precision not in PRECISIONS:
        raise SettingsError(
            f"--precision {s.precision!r} is unknown; choose one of {', '.join(PRECISIONS)}"
        )
    if s.horovod_launcher not in HOROVOD_LAUNCHERS:
        raise SettingsError(
            f"--horovod-launcher {s.horovod_launcher!r} is unknown; "
            f"choose one of {', '.join(HOROVOD_LAUNCHERS)}"
        )
    if s.horovod_compression not in HOROVOD_COMPRESSIONS:
        raise SettingsError(
            f"--horovod-compression {s.horovod_compression!r} is unknown; "
            f"choose one of {', '.join(HOROVOD_COMPRESSIONS)}"
        )
    if s.ddp_compression not in DDP_COMPRESSIONS:
        raise SettingsError(
            f"--ddp-compression {s.ddp_compression!r} is unknown; "
            f"choose one of {', '.join(DDP_COMPRESSIONS)}"
        )
    if s.collective_implementation not in COLLECTIVE_IMPLEMENTATIONS:
        raise SettingsError(
            f"--collective-implementation {s.collective_implementation!r} is unknown; "
            f"choose one of {', '.join(COLLECTIVE_IMPLEMENTATIONS)}"
        )
    if s.collective_implementation == "nccl" and s.device != "gpu":
        raise SettingsError("--collective-implementation nccl needs --device gpu")
    for name in (
        "horovod_fusion_threshold_mb",
        "all_reduce_pack_mb",
        "ddp_bucket_cap_mb",
        "time_budget_seconds",
    ):
        if not getattr(s, name) >= 0:
            raise SettingsError(
                f"--{name.replace('_', '-')} must be zero or positive, got {getattr(s, name)}"
            )
    for name in ("nodes", "gpus_per_node", "batch_size", "image_size", "iterations"):
        _positive(name.replace("_", "-"), getattr(s, name))
    _positive("steps-per-iteration", s.steps_per_iteration)
    # The first step is never timed: Horovod broadcasts rank 0's variables
    # after it, and every framework traces its step function on it.
    if s.warmup_steps < 1:
        raise SettingsError(f"--warmup-steps must be at least 1, got {s.warmup_steps}")
    if s.seed < 0:
        raise SettingsError(f"--seed must be zero or positive, got {s.seed}")
    if not s.learning_rate > 0:
        raise SettingsError(f"--learning-rate must be positive, got {s.learning_rate}")
    minimum = MODEL_MIN_IMAGE_SIZE[s.model]
    if s.image_size < minimum:
        raise SettingsError(
            f"--image-size {s.image_size} is below {s.model}'s minimum of {minimum}"
        )
    spec = framework_spec(s.framework)
    if spec.ecosystem == "torch" and s.model not in TORCH_MODELS:
        raise SettingsError(
            f"--model {s.model} is not defined for torch, so it would not be the same network "
            f"as TensorFlow's; {s.framework} runs {', '.join(TORCH_MODELS)}"
        )
    if spec.one_device and (s.nodes, s.gpus_per_node) != (1, 1):
        raise SettingsError(
            f"--framework {s.framework} runs on one device: use --nodes 1 --gpus-per-node 1"
        )
    if spec.one_node and s.nodes != 1:
        spanning = [other.name for other in REGISTRY if not other.one_node]
        raise SettingsError(
            f"--framework {s.framework} runs on one node: use --nodes 1 "
            f"({', '.join(spanning)} span nodes)"
        )
    if check_data and s.dataset == "cifar100":
        # data.py reads files and knows nothing of settings: its error, which
        # names --data-dir, becomes a settings error here.
        from trainscale.data import DataError, find_cifar100

        try:
            find_cifar100(s.data_dir)
        except DataError as err:
            raise SettingsError(str(err)) from None
    return s


def with_global_batch(settings: RunSettings, global_batch_size: int) -> RunSettings:
    """Settings whose per-replica batch splits `global_batch_size` evenly (strong scaling)."""
    if global_batch_size <= 0:
        raise SettingsError(
            f"--global-batch-size must be a positive integer, got {global_batch_size}"
        )
    if global_batch_size % settings.replicas:
        raise SettingsError(
            f"--global-batch-size {global_batch_size} does not split over "
            f"{settings.replicas} replicas ({settings.nodes} nodes x {settings.gpus_per_node})"
        )
    return dataclasses.replace(settings, batch_size=global_batch_size // settings.replicas)


def local_cpu_count() -> int:
    """CPUs this process may use (respects affinity masks set by SLURM or taskset)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1
