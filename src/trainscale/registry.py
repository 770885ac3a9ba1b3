"""What each framework is, in one place: everything trainscale knows about a
framework apart from its training code, as data.

The settings and their checks, the launcher, the study's grid and knob axes,
the tables and figures, and the config schema's enum all read this registry
(a test holds the schema to it), so a new framework is one entry here plus the
code that trains it. Nothing here imports TensorFlow or torch: the workflow,
the launcher and the analysis ask it in milliseconds, on a laptop too.

How processes are started (`launch`):
- "single": one process drives all of the node's replicas (one device, or
  MirroredStrategy's devices);
- "horovod": one rank per replica (mpirun or horovodrun --gloo here, srun
  under SLURM);
- "multiworker": one TF_CONFIG worker per node holding its GPUs, one per
  replica on CPU (a worker holding two logical CPU replicas hung before its
  first step);
- "torch-distributed": one rank per replica, each told RANK, WORLD_SIZE,
  LOCAL_RANK and the first rank's MASTER_ADDR:MASTER_PORT, the environment
  torch.distributed's env:// rendezvous reads (local processes here, srun
  tasks under SLURM).

The ecosystem names the backend that trains it (trainscale.training.BACKENDS)
and the environment key (in the study config) names the venv it runs from.
"""

from __future__ import annotations

from dataclasses import dataclass

# Knobs every framework reads (a table block or figure panel each).
SHARED_KNOBS = ("precision",)
# Knobs every framework of one ecosystem reads: compiling the step (XLA's
# auto-clustering; torch.compile) and torch's memory layout.
TENSORFLOW_KNOBS = ("xla",)
TORCH_KNOBS = ("compile", "channels_last")
ECOSYSTEM_KNOBS = {"tensorflow": TENSORFLOW_KNOBS, "torch": TORCH_KNOBS}
HOROVOD_KNOBS = ("horovod_compression", "horovod_fusion_threshold_mb")


@dataclass(frozen=True)
class FrameworkSpec:
    name: str
    label: str  # in tables and figures
    ecosystem: str  # whose training code runs it: "tensorflow" or "torch"
    environment: str  # the config key naming the environment it runs from
    launch: str  # "single", "horovod", "multiworker" or "torch-distributed" (above)
    one_node: bool = False
    one_device: bool = False
    # The knob axes this framework reads, beyond SHARED_KNOBS.
    knobs: tuple[str, ...] = ()
    # The other ecosystem's framework it is held against in the tables
    # (trainscale.tables.cross_ecosystem_table), if any.
    compared_with: str = ""
    # Where its training code is: "module:Class", a trainscale.backend.Backend.
    backend: str = ""
    # The module its processes cannot run without; `trainscale` refuses the
    # framework in a Python that lacks it (horovod-torch needs Horovod built
    # with its torch extension, which the TensorFlow environment never has).
    requires: str = ""
    # Its example script, below examples/: the study's workload written as the
    # framework's documentation teaches (trainscale.examples, .refactoring).
    example: str = ""

    def processes_per_node(self, gpus_per_node: int, device: str) -> int:
        """How many OS processes one node runs for G GPUs (replicas) per node."""
        if self.launch in ("horovod", "torch-distributed"):
            return gpus_per_node
        if self.launch == "multiworker" and device == "cpu":
            return gpus_per_node
        return 1


# In table order: each ecosystem's baseline first.
REGISTRY = (
    FrameworkSpec(
        "tf-single",
        "TensorFlow, 1 device",
        "tensorflow",
        "train_env",
        "single",
        one_node=True,
        one_device=True,
        knobs=TENSORFLOW_KNOBS,
        requires="tensorflow",
        backend="trainscale.tf_backend:TensorFlowBackend",
        example="tf_single.py",
    ),
    FrameworkSpec(
        "horovod",
        "Horovod",
        "tensorflow",
        "train_env",
        "horovod",
        knobs=TENSORFLOW_KNOBS + HOROVOD_KNOBS,
        requires="horovod.tensorflow",
        backend="trainscale.tf_backend:TensorFlowBackend",
        example="tf_horovod.py",
    ),
    FrameworkSpec(
        "tf-mirrored",
        "TF MirroredStrategy",
        "tensorflow",
        "train_env",
        "single",
        one_node=True,
        knobs=TENSORFLOW_KNOBS,
        requires="tensorflow",
        backend="trainscale.tf_backend:TensorFlowBackend",
        example="tf_mirrored.py",
    ),
    FrameworkSpec(
        "tf-multiworker",
        "TF MultiWorkerMirrored",
        "tensorflow",
        "train_env",
        "multiworker",
        knobs=TENSORFLOW_KNOBS + ("collective_implementation", "all_reduce_pack_mb"),
        requires="tensorflow",
        backend="trainscale.tf_backend:TensorFlowBackend",
        example="tf_multiworker.py",
    ),
    FrameworkSpec(
        "torch-single",
        "PyTorch, 1 device",
        "torch",
        "torch_env",
        "single",
        one_node=True,
        one_device=True,
        knobs=TORCH_KNOBS,
        compared_with="tf-single",
        requires="torch",
        backend="trainscale.torch_backend:TorchBackend",
        example="torch_single.py",
    ),
    FrameworkSpec(
        "torch-ddp",
        "PyTorch DDP",
        "torch",
        "torch_env",
        "torch-distributed",
        knobs=TORCH_KNOBS + ("ddp_bucket_cap_mb", "ddp_compression"),
        compared_with="horovod",
        requires="torch",
        backend="trainscale.torch_ddp:DistributedDataParallel",
        example="torch_ddp.py",
    ),
    FrameworkSpec(
        "horovod-torch",
        "Horovod (PyTorch)",
        "torch",
        "torch_env",
        "horovod",
        knobs=TORCH_KNOBS + HOROVOD_KNOBS,
        compared_with="horovod",
        requires="horovod.torch",
        backend="trainscale.horovod_torch:Horovod",
        example="torch_horovod.py",
    ),
)
FRAMEWORKS = tuple(spec.name for spec in REGISTRY)
_BY_NAME = {spec.name: spec for spec in REGISTRY}


def framework_spec(name: str) -> FrameworkSpec:
    """The registry's entry for `name` (KeyError for a name it does not know)."""
    return _BY_NAME[name]


def table_order(name: str) -> int:
    """Where a framework's rows and columns go; an unknown name (a record of a
    framework since removed) goes last instead of failing the tables."""
    return FRAMEWORKS.index(name) if name in _BY_NAME else len(FRAMEWORKS)


def label(name: str) -> str:
    return _BY_NAME[name].label if name in _BY_NAME else name


def missing_module(name: str) -> str:
    """'' when this Python has what framework `name` requires, else what it lacks.

    Asked without importing anything heavy: a top-level module is looked up,
    not imported. A Horovod framework module (horovod.torch) is there only
    when Horovod was compiled for it: Horovod ships every framework's Python
    package but builds the library (mpi_lib*) of the ones it was built with.
    """
    import glob
    import importlib.util
    import os

    module = _BY_NAME[name].requires
    top, _, framework = module.partition(".")
    spec = importlib.util.find_spec(top)
    # A folder of that name on sys.path with no __init__.py (the test suite's
    # tests/torch/) is a namespace package, not the framework: origin None.
    if spec is None or spec.origin is None:
        return module
    if framework:
        folders = spec.submodule_search_locations or []
        if not any(glob.glob(os.path.join(f, framework, "mpi_lib*")) for f in folders):
            return f"{module} (Horovod built without it)"
    return ""


def knob_readers() -> dict[str, set[str] | None]:
    """Each knob axis and the frameworks that read it (None: every framework)."""
    readers: dict[str, set[str] | None] = {name: None for name in SHARED_KNOBS}
    for spec in REGISTRY:
        for knob in spec.knobs:
            readers.setdefault(knob, set()).add(spec.name)
    return readers


def panel_knobs(frameworks) -> set[str]:
    """The knobs that split tables into blocks and figures into panels, for
    records of these frameworks: the shared ones, and an ecosystem's own
    (xla; compile, channels_last) when every framework is of that ecosystem.
    There frameworks are compared at equal settings; any other knob a
    framework reads makes a column or line of its own per value."""
    ecosystems = {_BY_NAME[name].ecosystem for name in frameworks if name in _BY_NAME}
    knobs = set(SHARED_KNOBS)
    if len(ecosystems) == 1:
        knobs |= set(ECOSYSTEM_KNOBS[ecosystems.pop()])
    return knobs
