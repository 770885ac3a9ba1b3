"""What each framework is, in one place: everything trainscale knows about a
framework apart from its training code, as data.

An entry (a FrameworkSpec, trainscale.catalogue.framework_spec) names its label
and table order, its ecosystem and the environment it runs from, its launch
kind (trainscale.catalogue.launch_kinds), its topology limits, the knobs only it
reads (declared once, in trainscale.catalogue.knobs), where its training code is,
what its processes cannot run without, its example script, what one of its
training steps moves between replicas (the step model's traffic,
trainscale.analysis.predict) and what it refuses. The settings, the launcher,
the study's grid and schema, the tables and figures, the refactoring analysis
and the tests all read it, so a new framework is one entry here, its module,
its example and its own tests. A high-level API's framework (Keras's fit,
Lightning), which replaces a custom loop here, has its entry in
trainscale.catalogue.high_level.

Nothing here imports TensorFlow or torch: the workflow, the launcher and the
analysis ask it in milliseconds, on a laptop too.
"""

from __future__ import annotations

from trainscale.catalogue.elastic_kinds import HOROVOD_ELASTIC, TORCHRUN_ELASTIC
from trainscale.catalogue.framework_spec import FrameworkSpec
from trainscale.catalogue.high_level import high_level_entries
from trainscale.catalogue.knobs import (
    DDP_KNOBS,
    DEEPSPEED_KNOBS,
    ELASTIC_KNOBS,
    FSDP_KNOBS,
    HOROVOD_KNOBS,
    MULTIWORKER_KNOBS,
    PS_KNOBS,
    RAY_KNOBS,
    ddp_traffic,
    deepspeed_fp16_needs_a_gpu,
    fsdp_refuses_channels_last,
    fsdp_traffic,
    horovod_traffic,
    zero_traffic,
)
from trainscale.catalogue.launch_kinds import (
    DEEPSPEED,
    HOROVOD,
    MULTIWORKER,
    ONE_PROCESS,
    RAY,
    TORCHRUN,
)
from trainscale.catalogue.model_parallel_knobs import (
    PIPELINE_KNOBS,
    TENSOR_PARALLEL_KNOBS,
    pipeline_check,
    pipeline_traffic,
    tensor_parallel_check,
    tensor_parallel_traffic,
)
from trainscale.catalogue.parameter_server_kind import PARAMETER_SERVERS
from trainscale.catalogue.traffic import no_traffic, parameter_server_traffic
from trainscale.core.setting import Setting

REGISTRY = (
    FrameworkSpec(
        "tf-single",
        "TensorFlow, 1 device",
        "tensorflow",
        "train_env",
        ONE_PROCESS,
        backend="trainscale.frameworks.tensorflow.tf_backend:SingleDeviceBackend",
        requires="tensorflow",
        example="tf_single.py",
        one_node=True,
        one_device=True,
        traffic=no_traffic,
    ),
    FrameworkSpec(
        "horovod",
        "Horovod",
        "tensorflow",
        "train_env",
        HOROVOD,
        backend="trainscale.frameworks.tensorflow.tf_backend:HorovodBackend",
        requires="horovod.tensorflow",
        example="tf_horovod.py",
        knobs=HOROVOD_KNOBS,
        traffic=horovod_traffic,
    ),
    FrameworkSpec(
        "tf-mirrored",
        "TF MirroredStrategy",
        "tensorflow",
        "train_env",
        ONE_PROCESS,
        backend="trainscale.frameworks.tensorflow.tf_backend:MirroredBackend",
        requires="tensorflow",
        example="tf_mirrored.py",
        one_node=True,
    ),
    FrameworkSpec(
        "tf-multiworker",
        "TF MultiWorkerMirrored",
        "tensorflow",
        "train_env",
        MULTIWORKER,
        backend="trainscale.frameworks.tensorflow.tf_backend:MultiWorkerBackend",
        requires="tensorflow",
        example="tf_multiworker.py",
        knobs=MULTIWORKER_KNOBS,
    ),
    FrameworkSpec(
        "tf-central-storage",
        "TF CentralStorage",
        "tensorflow",
        "train_env",
        ONE_PROCESS,
        backend="trainscale.frameworks.tensorflow.tf_backend:CentralStorageBackend",
        requires="tensorflow",
        example="tf_central_storage.py",
        one_node=True,
        # Every replica reads the variables from, and sends its gradient to,
        # the host's CPU: within one host, not over a network link.
        traffic=no_traffic,
    ),
    FrameworkSpec(
        "tf-ps",
        "TF ParameterServer (async)",
        "tensorflow",
        "train_env",
        PARAMETER_SERVERS,
        backend="trainscale.frameworks.tensorflow.tf_backend:ParameterServerBackend",
        requires="tensorflow",
        example="tf_ps.py",
        knobs=PS_KNOBS,
        concept_evidence=(
            ("cluster set-up", ("ClusterCoordinator",)),
            ("data sharding", ("create_per_worker_dataset",)),
            ("parameter servers", ("ParameterServerStrategy", "variable_partitioner")),
        ),
        traffic=parameter_server_traffic,
        asynchronous=True,
    ),
    FrameworkSpec(
        "torch-single",
        "PyTorch, 1 device",
        "torch",
        "torch_env",
        ONE_PROCESS,
        backend="trainscale.frameworks.torch.torch_backend:TorchBackend",
        requires="torch",
        example="torch_single.py",
        text_example="torch_gpt_single.py",
        one_node=True,
        one_device=True,
        compared_with="tf-single",
        traffic=no_traffic,
    ),
    FrameworkSpec(
        "torch-ddp",
        "PyTorch DDP",
        "torch",
        "torch_env",
        TORCHRUN,
        backend="trainscale.frameworks.torch.torch_ddp:DistributedDataParallel",
        requires="torch",
        example="torch_ddp.py",
        text_example="torch_gpt_ddp.py",
        knobs=DDP_KNOBS,
        compared_with="horovod",
        traffic=ddp_traffic,
    ),
    FrameworkSpec(
        "torch-elastic",
        "PyTorch DDP (torchrun elastic)",
        "torch",
        "torch_env",
        TORCHRUN_ELASTIC,
        backend="trainscale.frameworks.torch.torch_elastic:ElasticDistributedDataParallel",
        requires="torch",
        example="torch_elastic.py",
        # DDP's step: DDP's knobs are its knobs too.
        knobs=(*DDP_KNOBS, *ELASTIC_KNOBS),
        compared_with="horovod",
        concept_evidence=(("elastic restart", ("save", "load")),),
        traffic=ddp_traffic,
        elastic=True,
    ),
    FrameworkSpec(
        "ray-train",
        "Ray Train",
        "torch",
        "torch_env",
        RAY,
        backend="trainscale.frameworks.torch.ray_train:RayTrainDDP",
        requires="ray",
        example="torch_ray.py",
        knobs=RAY_KNOBS,
        compared_with="horovod",
        # Ray joins the process group itself; the example asks Ray for the
        # rest (ScalingConfig, get_device, prepare_model, TorchTrainer).
        concept_evidence=(
            ("cluster set-up", ("ScalingConfig",)),
            ("device pinning", ("get_device",)),
            ("gradient all-reduce", ("prepare_model",)),
            ("training engine", ("TorchTrainer",)),
        ),
        traffic=ddp_traffic,
        driver="trainscale.frameworks.torch.ray_train:drive",
    ),
    FrameworkSpec(
        "horovod-torch",
        "Horovod (PyTorch)",
        "torch",
        "torch_env",
        HOROVOD,
        backend="trainscale.frameworks.torch.horovod_torch:Horovod",
        requires="horovod.torch",
        example="torch_horovod.py",
        knobs=HOROVOD_KNOBS,
        compared_with="horovod",
        traffic=horovod_traffic,
    ),
    FrameworkSpec(
        "horovod-torch-elastic",
        "Horovod elastic (PyTorch)",
        "torch",
        "torch_env",
        HOROVOD_ELASTIC,
        backend="trainscale.frameworks.torch.horovod_torch_elastic:HorovodElastic",
        requires="horovod.torch",
        example="torch_horovod_elastic.py",
        # horovodrun starts another host's ranks over ssh (elastic needs its
        # driver): here one node, its ranks under the host's two names.
        one_node=True,
        knobs=(*HOROVOD_KNOBS, *ELASTIC_KNOBS),
        compared_with="horovod",
        concept_evidence=(("elastic restart", ("elastic",)),),
        traffic=horovod_traffic,
        elastic=True,
    ),
    FrameworkSpec(
        "torch-fsdp",
        "PyTorch FSDP2",
        "torch",
        "torch_env",
        TORCHRUN,
        backend="trainscale.frameworks.torch.torch_fsdp:FullyShardedDataParallel",
        requires="torch",
        example="torch_fsdp.py",
        knobs=FSDP_KNOBS,
        compared_with="horovod",
        concept_evidence=(
            ("gradient all-reduce", ("fully_shard",)),
            ("sharded training state", ("fully_shard",)),
        ),
        traffic=fsdp_traffic,
        check=fsdp_refuses_channels_last,
    ),
    FrameworkSpec(
        "deepspeed",
        "DeepSpeed",
        "torch",
        "torch_env",
        DEEPSPEED,
        backend="trainscale.frameworks.torch.torch_deepspeed:DeepSpeed",
        requires="deepspeed",
        example="torch_deepspeed.py",
        example_files=("ds_config.json",),
        knobs=DEEPSPEED_KNOBS,
        compared_with="horovod",
        concept_evidence=(
            ("process group", ("init_distributed",)),
            ("gradient all-reduce", ("initialize",)),
            ("training engine", ("initialize",)),
            ("sharded training state", ("zero_optimization",)),
        ),
        traffic=zero_traffic,
        check=deepspeed_fp16_needs_a_gpu,
    ),
    FrameworkSpec(
        "horovod-elastic",
        "Horovod elastic (TensorFlow)",
        "tensorflow",
        "train_env",
        HOROVOD_ELASTIC,
        backend="trainscale.frameworks.tensorflow.horovod_elastic:HorovodElasticBackend",
        requires="horovod.tensorflow",
        example="tf_horovod_elastic.py",
        # As horovod-torch-elastic: one node, its ranks under the host's two
        # names. Last: every other framework keeps its colour in the figures.
        one_node=True,
        knobs=(*HOROVOD_KNOBS, *ELASTIC_KNOBS),
        concept_evidence=(("elastic restart", ("elastic",)),),
        traffic=horovod_traffic,
        elastic=True,
    ),
    FrameworkSpec(
        "torch-pipeline",
        "PyTorch pipeline parallel",
        "torch",
        "torch_env",
        TORCHRUN,
        backend="trainscale.frameworks.torch.torch_pipeline:Pipeline",
        requires="torch",
        text_example="torch_pipeline.py",
        knobs=PIPELINE_KNOBS,
        concept_evidence=(
            ("pipeline stages", ("PipelineStage",)),
            ("microbatch schedule", ("ScheduleGPipe", "Schedule1F1B")),
        ),
        traffic=pipeline_traffic,
        check=pipeline_check,
        splits_model=True,
    ),
    FrameworkSpec(
        "torch-tp",
        "PyTorch tensor parallel",
        "torch",
        "torch_env",
        TORCHRUN,
        backend="trainscale.frameworks.torch.torch_tp:TensorParallel",
        requires="torch",
        text_example="torch_tensor_parallel.py",
        knobs=TENSOR_PARALLEL_KNOBS,
        concept_evidence=(
            ("device mesh", ("init_device_mesh",)),
            ("layer sharding plan", ("parallelize_module", "ColwiseParallel", "RowwiseParallel")),
        ),
        traffic=tensor_parallel_traffic,
        check=tensor_parallel_check,
        splits_model=True,
    ),
)
# The high-level APIs' frameworks, after every custom loop's.
REGISTRY += high_level_entries(REGISTRY)
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


def base_of(framework: str) -> str:
    """The single-device framework `framework`'s example changes (itself for
    one): its entry's `base`, else its ecosystem's first."""
    spec = framework_spec(framework)
    if spec.one_device or spec.base:
        return spec.base or framework
    return next(s.name for s in REGISTRY if s.ecosystem == spec.ecosystem and s.one_device)


def knob_declarations() -> list[Setting]:
    """The settings some frameworks read and others not, declared by the
    entries and their launch kinds, each once, in registry order."""
    found: dict[str, Setting] = {}
    for spec in REGISTRY:
        for setting in (*spec.launch.settings, *spec.knobs):
            found.setdefault(setting.name, setting)
    return list(found.values())


def framework_readers(name: str) -> set[str]:
    """The frameworks that read knob `name`, declared by their entries or launch kinds."""
    return {
        spec.name
        for spec in REGISTRY
        if any(s.name == name for s in (*spec.launch.settings, *spec.knobs))
    }
