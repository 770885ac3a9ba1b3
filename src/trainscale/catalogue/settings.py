"""What one grid point is: the settings of one benchmark run, validated up front.

Every setting is declared once (trainscale.core.setting): those every framework reads
here, in SETTINGS; a knob only some frameworks read in their registry entries (or their
launch kind). RunSettings, its defaults, `trainscale`'s flags (cli.py), the checks below
and the study schema's fragments (schema.config_schema) are made from these declarations.

This module imports no TensorFlow, so settings are checked in milliseconds; each check
names the command-line option it is about (its message is what users see).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json

from trainscale.catalogue.models import MODELS, check_model_input
from trainscale.catalogue.registry import (
    FRAMEWORKS,
    REGISTRY,
    framework_readers,
    framework_spec,
    knob_declarations,
)
from trainscale.core.datasets import DATASETS
from trainscale.core.faults import FAULT_FORMS, NO_FAULT, check_fault
from trainscale.core.gpt import GPT2_VOCABULARY, GPT_SHAPES, TEXT_MODELS
from trainscale.core.setting import REQUIRED, Setting, SettingsError

__all__ = ["SettingsError", "RunSettings", "validate"]


def _check_mode(s) -> str:
    if s.mode != "accuracy":
        return ""
    if DATASETS[s.dataset].release is None:
        return f"--mode accuracy needs a test split: --dataset {s.dataset} has none"
    if s.compile:
        # torch.compile compiles on the first training step, on the clock.
        return "--mode accuracy does not run with --compile (it would compile on the clock)"
    return ""


# The grid point: the study's grid sets these, not its `benchmark:` keys.
_POINT = dict(in_study=False, group="grid point", minimum=1)
# The settings every framework reads (None) or every framework of an
# ecosystem (readers). Defaults follow the paper (seed 000).
SETTINGS = (
    Setting("framework", str, REQUIRED, "the framework (trainscale.catalogue.registry)",
            choices=FRAMEWORKS, in_study=False, group="grid point"),
    Setting("nodes", int, 1, "nodes; replicas = nodes x GPUs per node", **_POINT),
    Setting("gpus_per_node", int, 1, "GPUs (replicas) per node", **_POINT),
    Setting("model", str, "vgg16", "the network", choices=MODELS,
            in_study=False, group="grid point"),
    Setting("batch_size", int, 64, "per replica (weak scaling, the paper's setting)", **_POINT),
    # Native by default: seed 004 trains MNIST at 28 px; seed 000 asks for
    # CIFAR-100 resized to 224, and says so.
    Setting("image_size", int, 0, "input side, resized to (each model has its minimum); "
            "0: the data set's native side (28 for MNIST, 32 for CIFAR, 224 synthetic)",
            minimum=0, group="data and device"),
    # Declared for every run, read by the text models only (as image_size by
    # the image models): 0 resolves to the model's and the data's own.
    Setting("seq_len", int, 0, "tokens per example of a text model (a GPT); 0: the "
            "model's context (1,024 for GPT-2's shapes)", minimum=0, group="data and device",
            metavar="TOKENS"),
    Setting("vocab_size", int, 0, "a text model's vocabulary; 0: the data set's (its "
            f"256 byte tokens; synthetic tokens: GPT-2's {GPT2_VOCABULARY:,})", minimum=0,
            group="data and device", metavar="TOKENS"),
    Setting("dataset", str, "cifar100", "read from --data-dir (trainscale.core.datasets), "
            "or synthetic", choices=tuple(DATASETS), group="data and device", axis=True),
    Setting("data_dir", str, "data", "holds the data set's release (e.g. "
            "cifar-100-python.tar.gz, or MNIST's IDX files)",
            group="data and device", pattern="^[A-Za-z0-9_./-]+$"),
    # Decoding is the input pipeline's cost: a study sets it per run to show it.
    Setting("loader_workers", int, 2, "a streamed data set's (imagenet-*) decoding workers: "
            "torch's DataLoader processes (0: in the training process) and tf.data's "
            "parallel map calls (0: autotuned)", minimum=0, group="data and device"),
    Setting("device", str, "gpu", "one replica per GPU, or per CPU share",
            choices=("gpu", "cpu"), group="data and device"),
    # A label to the harness, not a knob of the run: the workflow sends the
    # point to the named node type (cluster.systems: its partition, node
    # feature or GRES type), so seed 004's Titan RTX and V100 nodes are one
    # grid axis (tables/systems.*).
    Setting("system", str, "", "the node type the ranks run on: a name cluster.systems "
            "defines (the workflow submits to its partition and GRES type); '': the "
            "cluster's default", group="data and device", axis=True,
            pattern="^[A-Za-z0-9_.-]*$", metavar="NAME"),
    # Also a label to the harness: the workflow starts a run with the named
    # network's environment (cluster.networks: which interface NCCL, Gloo,
    # Open MPI and Horovod use), so seed 002's InfiniBand-vs-Ethernet study
    # is one grid axis on one cluster. Its flag is not --network: horovodrun
    # parses the rank command it starts too, and refuses that as an ambiguous
    # abbreviation of its --network-interface(s).
    Setting("network", str, "", "the cluster network the ranks talk over: a name "
            "cluster.networks defines (the workflow sets its environment); '': the "
            "cluster's default route", group="data and device", axis=True,
            pattern="^[A-Za-z0-9_.-]*$", metavar="NAME", cli_flag="--network-name"),
    # A label too: the workflow starts the run's processes through the named
    # container's command (cluster.containers; the --container-command option),
    # so seed 002's Docker-against-Singularity comparison is one grid axis.
    Setting("container", str, "none", "the container runtime and image the ranks run in: "
            "a name cluster.containers defines (the workflow passes its command); none: the "
            "bare host", group="data and device", axis=True,
            pattern="^[A-Za-z0-9_.-]+$", metavar="NAME", cli_flag="--container-name"),
    Setting("augment", bool, True, "the data set's augmentation: pad-4 random crop and "
            "flip for CIFAR, random-resized crop and flip for ImageNet; the MNIST family "
            "has none", group="data and device"),
    # The first step is never timed: Horovod broadcasts rank 0's variables
    # after it, and every framework traces its step function on it.
    Setting("warmup_steps", int, 10, "untimed steps first (at least 1: tracing, broadcast)",
            minimum=1, group="measurement"),
    # A block is the unit timed (trainscale.core.timing); "iteration" was its
    # second name until records, configs and flags all said block.
    Setting("blocks", int, 10, "timed blocks", minimum=1, group="measurement",
            former_names=("iterations",)),
    Setting("steps_per_block", int, 20, "steps per timed block", minimum=1,
            group="measurement", former_names=("steps_per_iteration",)),
    # A demo's work bounded by time on a CPU of any speed (trainscale.core.timing.BlockBudget).
    Setting("time_budget_seconds", float, 0.0,
            "stop timing blocks once they have taken this long (at least 2, at most "
            "--blocks); 0: time exactly --blocks blocks",
            minimum=0, group="measurement", metavar="SECONDS"),
    # Accuracy mode (trainscale.core.accuracy says what is on the clock).
    Setting("mode", str, "throughput", "throughput: timed blocks of steps; accuracy: "
            "epochs until --target-accuracy on the test split",
            choices=("throughput", "accuracy"), group="accuracy", check=_check_mode),
    Setting("epochs", int, 10, "accuracy mode: the most epochs to train",
            minimum=1, group="accuracy"),
    Setting("target_accuracy", float, 0.0, "accuracy mode: stop at this test accuracy "
            "(a fraction); 0: no target, train every epoch", minimum=0, group="accuracy",
            check=lambda s: "--target-accuracy is a fraction: at most 1"
            if s.target_accuracy > 1 else ""),
    Setting("target_perplexity", float, 0.0, "accuracy mode, a text model: stop at this "
            "validation perplexity or below; 0: no target", minimum=0, group="accuracy",
            check=lambda s: "--target-perplexity is a text model's (a gpt-*): "
            f"--model {s.model} has --target-accuracy" if s.target_perplexity and not s.is_text
            else ""),
    Setting("lr_scaling", str, "none", "scale the learning rate with the replicas "
            "(Goyal et al.): none, linear or sqrt", choices=("none", "linear", "sqrt"),
            group="accuracy"),
    Setting("warmup_epochs", float, 0.0, "ramp from the learning rate to the scaled one "
            "over these epochs", minimum=0, group="accuracy",
            check=lambda s: "--warmup-epochs needs --lr-scaling linear or sqrt: with none "
            "there is nothing to warm up to" if s.warmup_epochs and s.lr_scaling == "none"
            else ""),
    # The same fault for every framework of a study (trainscale.core.faults).
    Setting("fault", str, NO_FAULT, "a fault injected once per grid point, the same for "
            f"every framework: {FAULT_FORMS}; with one, every block is timed "
            "(no time budget)", group="faults", axis=True, pattern="^[a-z0-9.-]+$",
            metavar="FAULT", check=check_fault),
    Setting("seed", int, 1234, "weights, data order, augmentation",
            minimum=0, group="measurement"),
    Setting("optimizer", str, "adam", "adam or sgd", choices=("adam", "sgd")),
    Setting("learning_rate", float, 1e-3, "the optimizer's step size",
            minimum=0, exclusive_minimum=True),
    Setting("precision", str, "fp32", "fp16 (with loss scaling) or bf16: mixed precision",
            choices=("fp32", "fp16", "bf16"), axis=True),
    Setting("xla", bool, False, "XLA auto-clustering", readers=("tensorflow",), axis=True),
    Setting("compile", bool, False, "torch.compile the model", readers=("torch",), axis=True),
    Setting("channels_last", bool, False, "NHWC memory layout for model and batches",
            readers=("torch",), axis=True),
    Setting("tensor_memory", bool, False, "profile a step after the timed ones: live tensor "
            "bytes at its peak, by kind", readers=("torch",), group="measurement"),
    Setting("activation_checkpointing", bool, False, "recompute each transformer block's "
            "activations in backward instead of keeping them (a text model's)",
            readers=("torch",), axis=True, check=lambda s: "--activation-checkpointing "
            f"recomputes a GPT's blocks: --model {s.model} has none"
            if s.activation_checkpointing and not s.is_text else ""),
)  # fmt: skip


def all_settings() -> tuple[Setting, ...]:
    """Every setting of a run: SETTINGS, then the frameworks' knobs (registry)."""
    return (*SETTINGS, *knob_declarations())


SETTING = {setting.name: setting for setting in all_settings()}


@functools.lru_cache(maxsize=None)  # Python 3.8 has no functools.cache
def readers(name: str) -> frozenset[str] | None:
    """The frameworks that read setting `name` (None: every framework), cached."""
    setting = SETTING[name]
    if setting in SETTINGS:
        if setting.readers is None:
            return None
        return frozenset(s.name for s in REGISTRY if {s.name, s.ecosystem} & set(setting.readers))
    return frozenset(framework_readers(name))


# Settings a grid may vary too (`grid.precision: [fp32, fp16]`), each overriding
# benchmark.<name>, and who reads each (None: all). A framework that does not read a knob
# is not varied by it (that would measure the same thing twice) nor labelled with it.
KNOB_AXES = {s.name: readers(s.name) for s in all_settings() if s.axis}


def reads_setting(framework: str, name: str) -> bool:
    """Whether `framework` reads setting `name`: only then is it passed to the
    framework, does it label its records (their path, the tables' knobs, the
    figures' titles) and may a grid vary it there. A framework or a setting
    the registry no longer knows (an old record's) is taken to read it."""
    if name not in SETTING or framework not in FRAMEWORKS:
        return True
    who = readers(name)
    return who is None or framework in who


def panel_knobs(frameworks) -> set[str]:
    """The knobs that split tables into blocks and figures into panels, for
    records of these frameworks: those every framework reads (precision), and
    an ecosystem's own (xla; compile, channels_last) when every framework is
    of that ecosystem. There frameworks are compared at equal settings; any
    other knob a framework reads makes a column or line of its own per value."""
    known = {f for f in frameworks if f in FRAMEWORKS}
    ecosystems = {framework_spec(f).ecosystem for f in known}
    knobs = set()
    for setting in SETTINGS:
        if not setting.axis:
            continue
        if setting.readers is None or (len(ecosystems) == 1 and ecosystems <= set(setting.readers)):
            knobs.add(setting.name)
    return knobs


class _RunSettings:
    """One grid point plus how it is measured: the fields are SETTINGS and the
    frameworks' knobs (dataclasses.fields(RunSettings))."""

    def __post_init__(self):
        # --image-size 0 is the data set's native side, resolved here once, so
        # everything downstream (models, records, the settings hash) sees the
        # size; --seq-len and --vocab-size 0 likewise, for a text model.
        if self.is_text:
            if self.seq_len == 0:
                object.__setattr__(self, "seq_len", GPT_SHAPES[self.model].context)
            if self.vocab_size == 0:
                text = self.dataset in DATASETS and DATASETS[self.dataset].is_text
                vocabulary = DATASETS[self.dataset].num_classes if text else GPT2_VOCABULARY
                object.__setattr__(self, "vocab_size", vocabulary)
        elif self.image_size == 0 and self.dataset in DATASETS:
            object.__setattr__(self, "image_size", DATASETS[self.dataset].native_size)

    @property
    def is_text(self) -> bool:
        """Whether the model reads tokens (a GPT) rather than images."""
        return self.model in TEXT_MODELS

    @property
    def targets_per_example(self) -> int:
        """What one example's loss averages over: its tokens' next-token
        predictions for a text model, one label for an image."""
        return self.seq_len if self.is_text else 1

    @property
    def replicas(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.replicas

    @property
    def num_classes(self) -> int:
        """The model's outputs: the data set's classes, or a text model's vocabulary."""
        return self.vocab_size if self.is_text else DATASETS[self.dataset].num_classes

    @property
    def input_channels(self) -> int:
        """1 for a grayscale data set: the model's stem takes one channel."""
        return DATASETS[self.dataset].channels

    @property
    def augmentation(self) -> str:
        """What --augment does on this data set: its own augmentation, or none."""
        return DATASETS[self.dataset].augmentation if self.augment else "none"

    def processes_per_node(self) -> int:
        """How many OS processes one node runs, at most (the framework's launch kind)."""
        return framework_spec(self.framework).launch.tasks_per_node(self)

    def processes(self) -> int:
        """How many OS processes the run starts, every role's."""
        return framework_spec(self.framework).launch.process_count(self)

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
        """The options that reproduce these settings on `trainscale train`: the
        settings its framework reads (the others stay at their defaults)."""
        read = [s for s in all_settings() if reads_setting(self.framework, s.name)]
        return cli_args(self, read)


def cli_args(values, settings) -> list[str]:
    """`values`' fields as the flags of `settings` (--no-FLAG for a false bool)."""
    args: list[str] = []
    for setting in settings:
        value = getattr(values, setting.name)
        if setting.type is bool:
            args.append(setting.flag if value else "--no-" + setting.flag[2:])
        elif value is not None:
            args += [setting.flag, setting.cli_text(value)]
    return args


def settings_dataclass(name: str, settings, base: type) -> type:
    """A frozen dataclass with one field per setting, defaults as declared."""
    fields = [
        (s.name, s.type)
        if s.default is REQUIRED
        else (s.name, s.type, dataclasses.field(default=s.default))
        for s in settings
    ]
    made = dataclasses.make_dataclass(name, fields, bases=(base,), frozen=True)
    made.__module__, made.__doc__ = __name__, base.__doc__
    return made


RunSettings = settings_dataclass("RunSettings", all_settings(), _RunSettings)


def validate(settings, *, check_data: bool = True):
    """Raise SettingsError for the first invalid setting; return the settings."""
    s = settings
    for setting in all_settings():
        setting.validate(getattr(s, setting.name))
    for setting in all_settings():
        message = setting.check(s) if setting.check else ""
        if message:
            raise SettingsError(message)
    spec = framework_spec(s.framework)
    refused = check_model_input(s, spec.ecosystem, spec.splits_model)
    if refused:
        raise SettingsError(refused)
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
    refused = spec.check(s) if spec.check else ""
    if refused:
        raise SettingsError(f"--framework {s.framework}: {refused}")
    if check_data and DATASETS[s.dataset].release is not None:
        # datasets.py reads files and knows nothing of settings: its error,
        # which names --data-dir, becomes a settings error here.
        from trainscale.core.datasets import DataError

        try:
            DATASETS[s.dataset].find(s.data_dir)
        except DataError as err:
            raise SettingsError(str(err)) from None
    return s


def check_data_files(s) -> None:
    """Read the run's data once, whole, before any process starts: a bad file
    is the input's fault, not the grid point's, so it is refused here in one
    line naming the file, and no record is written."""
    dataset = DATASETS[s.dataset]
    if dataset.release is None:
        return
    from trainscale.core.datasets import DataError

    try:
        dataset.load(s.data_dir, "train")
    except DataError as err:
        raise SettingsError(str(err)) from None


def with_global_batch(settings, global_batch_size: int):
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
