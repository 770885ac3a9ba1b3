"""The knobs only some frameworks read, declared once each (trainscale.core.setting),
and what a step moves where that reads them; the registry's entries name them
(trainscale.catalogue.registry). Nothing here imports TensorFlow or torch.
"""

from __future__ import annotations

from typing import Callable, Mapping

from trainscale.catalogue.elastic_kinds import MIN_REPLICAS
from trainscale.catalogue.traffic import Traffic, all_reduce_traffic, sharded_traffic
from trainscale.core.setting import Setting


# What a step moves where that reads a framework's own knobs (beside their
# declarations below); the rest is trainscale.catalogue.traffic.
def fsdp_traffic(settings: Mapping) -> Traffic:
    # All-gather in forward, again in backward when forward resharded, and a
    # reduce-scatter of the gradients.
    passes = 3.0 if FSDP_RESHARD.value_in(settings) else 2.0
    return sharded_traffic(passes, "FSDP")(settings)


# An all-reduce of the gradients, compressed as the framework's knob says.
horovod_traffic = all_reduce_traffic("horovod_compression")
ddp_traffic = all_reduce_traffic("ddp_compression")


def zero_traffic(settings: Mapping) -> Traffic:
    # ZeRO-0 all-reduces gradients; ZeRO-1/2 reduce-scatter them and
    # all-gather the updated parameters (2 passes, as much as an all-reduce);
    # ZeRO-3 all-gathers the parameters in forward and again in backward, and
    # reduce-scatters the gradients (3). Rajbhandari et al., ZeRO, section 7.
    stage = int(ZERO_STAGE.value_in(settings))
    if stage == 0:
        return Traffic(2.0)
    return sharded_traffic(3.0 if stage == 3 else 2.0, f"ZeRO-{stage}")(settings)


HOROVOD_KNOBS = (
    Setting(
        "horovod_compression",
        str,
        "none",
        "gradients on the wire: none, or fp16 (hvd.Compression.fp16)",
        choices=("none", "fp16"),
        axis=True,
        group="communication",
    ),
    Setting(
        "horovod_fusion_threshold_mb",
        float,
        64.0,
        "Horovod's tensor fusion buffer (HOROVOD_FUSION_THRESHOLD); 0 turns fusion off",
        minimum=0,
        axis=True,
        group="communication",
        metavar="MB",
    ),
)


def _nccl_needs_a_gpu(settings) -> str:
    if settings.collective_implementation == "nccl" and settings.device != "gpu":
        return "--collective-implementation nccl needs --device gpu"
    return ""


MULTIWORKER_KNOBS = (
    Setting(
        "collective_implementation",
        str,
        "auto",
        "tf-multiworker's all-reduce: auto (NCCL on GPUs, RING on CPUs), ring or nccl",
        choices=("auto", "ring", "nccl"),
        axis=True,
        group="communication",
        check=_nccl_needs_a_gpu,
    ),
    Setting(
        "all_reduce_pack_mb",
        float,
        0.0,
        "tf-multiworker: all-reduce gradients in packs of this size "
        "(CommunicationOptions.bytes_per_pack); 0: TensorFlow decides",
        minimum=0,
        axis=True,
        group="communication",
        metavar="MB",
    ),
)

DDP_KNOBS = (
    Setting(
        "ddp_bucket_cap_mb",
        float,
        25.0,
        "torch-ddp: all-reduce gradients in buckets of this size (bucket_cap_mb)",
        minimum=0,
        axis=True,
        group="communication",
        metavar="MB",
    ),
    Setting(
        "ddp_compression",
        str,
        "none",
        "torch-ddp: gradients on the wire: none, or fp16 (the fp16_compress_hook)",
        choices=("none", "fp16"),
        axis=True,
        group="communication",
    ),
)


# Lightning's DDPStrategy takes DDP's knobs too.
LIGHTNING_KNOBS = (
    *DDP_KNOBS,
    Setting(
        "lightning_strategy",
        str,
        "ddp",
        "lightning: Trainer(strategy=...): ddp, or fsdp or deepspeed (on GPUs only, "
        "as Lightning says)",
        choices=("ddp", "fsdp", "deepspeed"),
        axis=True,
        group="communication",
    ),
)

# Lightning 2.6.6's own words, refusing its fsdp and deepspeed strategies on
# CPUs (its accelerator connector; DeepSpeedStrategy.setup_environment).
LIGHTNING_NEEDS_A_GPU = {
    "fsdp": "The strategy `fsdp` requires a GPU accelerator, but received `accelerator='cpu'`.",
    "deepspeed": "The DeepSpeed strategy is only supported on CUDA GPUs but "
    "`CPUAccelerator` is used.",
}


def lightning_strategy_check(settings) -> str:
    refusal = LIGHTNING_NEEDS_A_GPU.get(settings.lightning_strategy)
    if refusal and settings.device != "gpu":
        return (
            f"--lightning-strategy {settings.lightning_strategy}: Lightning refuses it on "
            f'CPUs ("{refusal}"); ddp runs there'
        )
    return ""


ELASTIC_KNOBS = (
    Setting(
        "checkpoint_blocks",
        int,
        1,
        "elastic frameworks: save the training state after every N timed blocks "
        "(what a restart goes on from)",
        minimum=1,
        axis=True,
        group="faults",
        metavar="N",
    ),
)


def fsdp_refuses_channels_last(settings) -> str:
    if settings.channels_last:
        # torch 2.13: "NotImplementedError: FSDP does not support non-contiguous parameters yet"
        return "--channels-last: FSDP2 shards only contiguous parameters (torch 2.13)"
    return ""


def deepspeed_fp16_needs_a_gpu(settings) -> str:
    if settings.precision == "fp16" and settings.device != "gpu":
        # DeepSpeed 0.19.8's CPU accelerator: "Type fp16 is not supported on your device."
        return "--precision fp16: DeepSpeed's CPU accelerator has no fp16 (use bf16, or a GPU)"
    return ""


def refused_traffic(why: str) -> Callable[[Mapping], Traffic]:
    """What a framework moves that is not a gradient over a ring: the step
    model says `why` and fits nothing."""
    return lambda settings: Traffic(refused=why)


# In table order: each ecosystem's baseline first.

PS_KNOBS = (
    Setting(
        "ps_steps_per_function",
        int,
        4,
        "tf-ps: worker steps in each function the coordinator schedules "
        "(fewer round trips to the coordinator per step)",
        minimum=1,
        axis=True,
        group="communication",
    ),
)


FSDP_RESHARD = Setting(
    "fsdp_reshard_after_forward",
    bool,
    True,
    "torch-fsdp: free each block's gathered parameters after forward and gather "
    "them again in backward (off: keep them until backward)",
    axis=True,
    group="communication",
)
FSDP_KNOBS = (FSDP_RESHARD,)


ZERO_STAGE = Setting(
    "zero_stage",
    int,
    0,
    "deepspeed: ZeRO's stage: 0 data parallel, 1 optimizer state, 2 and "
    "gradients, 3 and parameters sharded over the replicas",
    choices=(0, 1, 2, 3),
    axis=True,
    group="communication",
)
# ZeRO's buffers, in elements, at DeepSpeed 0.19.8's defaults (runtime/zero/config.py):
# held beyond a rank's shards (trainscale.analysis.memory_model.buffer_bytes).
ZERO_REDUCE_BUCKET = Setting(
    "zero_reduce_bucket_size",
    int,
    500_000_000,
    "deepspeed: elements of gradient reduced at a time (reduce_bucket_size; "
    "its buffer is held whole)",
    minimum=1,
    axis=True,
    group="memory",
)
ZERO_PREFETCH_BUCKET = Setting(
    "zero_prefetch_bucket_size",
    int,
    50_000_000,
    "deepspeed ZeRO-3: elements of parameters gathered ahead of their use "
    "(stage3_prefetch_bucket_size)",
    minimum=0,
    axis=True,
    group="memory",
)
ZERO_MAX_LIVE = Setting(
    "zero_max_live_parameters",
    int,
    1_000_000_000,
    "deepspeed ZeRO-3: elements of gathered parameters a rank keeps before it "
    "releases any (stage3_max_live_parameters)",
    minimum=0,
    axis=True,
    group="memory",
)
ZERO_REUSE_DISTANCE = Setting(
    "zero_max_reuse_distance",
    int,
    1_000_000_000,
    "deepspeed ZeRO-3: a gathered parameter used again within this many elements "
    "is kept, not released (stage3_max_reuse_distance)",
    minimum=0,
    axis=True,
    group="memory",
)
DEEPSPEED_KNOBS = (
    ZERO_STAGE,
    ZERO_REDUCE_BUCKET,
    ZERO_PREFETCH_BUCKET,
    ZERO_MAX_LIVE,
    ZERO_REUSE_DISTANCE,
    Setting(
        "zero_param_persistence_threshold",
        int,
        100_000,
        "deepspeed ZeRO-3: parameters this small are never sharded, every rank keeps "
        "them whole (stage3_param_persistence_threshold)",
        minimum=0,
        axis=True,
        group="memory",
    ),
)


# Its workers run torch-ddp's step: DDP's knobs are its knobs too.
RAY_KNOBS = (
    *DDP_KNOBS,
    Setting(
        "ray_max_failures",
        int,
        0,
        "ray-train: FailureConfig(max_failures): how often a lost worker may restart "
        "the worker group, from the state last reported through ray.train.report "
        "(0: a lost worker ends the run)",
        minimum=0,
        axis=True,
        group="faults",
    ),
    *ELASTIC_KNOBS,
    # With --ray-max-failures, a worker range: ScalingConfig(num_workers=(min, max)).
    MIN_REPLICAS,
)
