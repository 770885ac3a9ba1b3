"""The knobs of the frameworks that split a model (torch-pipeline, torch-tp),
declared once each (trainscale.core.setting), with the checks that read them
and what a step moves where they are set; the registry's entries name them
(trainscale.catalogue.registry). Nothing here imports TensorFlow or torch.
"""

from __future__ import annotations

from trainscale.catalogue.knobs import fsdp_refuses_channels_last, refused_traffic
from trainscale.core.setting import Setting

PIPELINE_SCHEDULE = Setting(
    "pipeline_schedule",
    str,
    "1f1b",
    "torch-pipeline: gpipe (every microbatch's forward, then every backward) or "
    "1f1b (one forward, one backward in the steady state: fewer live activations)",
    choices=("gpipe", "1f1b"),
    axis=True,
    group="model parallelism",
)

PIPELINE_MICROBATCHES = Setting(
    "pipeline_microbatches",
    int,
    4,
    "torch-pipeline: microbatches each pipeline's batch (its share of the global "
    "batch) is cut into (more: a smaller bubble, smaller matrix products; 0: one per stage)",
    minimum=0,
    axis=True,
    group="model parallelism",
)

PIPELINE_STAGES = Setting(
    "pipeline_stages",
    int,
    0,
    "torch-pipeline: stages in each pipeline, a rank each (the mesh is N x replicas/N; "
    "across the pipelines each stage's gradients are all-reduced, as DDP does); "
    "0: every rank in one pipeline",
    minimum=0,
    axis=True,
    group="model parallelism",
)
PIPELINE_KNOBS = (PIPELINE_SCHEDULE, PIPELINE_MICROBATCHES, PIPELINE_STAGES)


TENSOR_PARALLEL = Setting(
    "tensor_parallel",
    int,
    0,
    "torch-tp: ranks in each tensor-parallel group (the mesh is replicas/N x N, "
    "FSDP2 across the groups); 0: every rank in one group",
    minimum=0,
    axis=True,
    group="model parallelism",
)
TENSOR_PARALLEL_KNOBS = (TENSOR_PARALLEL,)


# Between neighbouring stages, each microbatch's activations forward and
# their gradients back (batch x tokens x width each), and every stage idles
# through the schedule's bubble; with several pipelines, the all-reduce of
# each stage's gradients across them besides.
pipeline_traffic = refused_traffic(
    "torch-pipeline: a step sends activations between neighbouring stages and "
    "idles in the pipeline's bubble; gradients move only across the pipelines"
)
# Twice per block in forward and again in backward, an all-reduce of the
# activations (batch x tokens x width) within each tp group; gradients only
# across the dp groups.
tensor_parallel_traffic = refused_traffic(
    "torch-tp: a step all-reduces activations within each tensor-parallel "
    "group, per block; only FSDP2 across the groups moves gradients"
)


def pipeline_stages(settings) -> int:
    """The stages of each pipeline (a rank each): as set, or every rank for 0."""
    return settings.pipeline_stages or settings.replicas


def pipeline_microbatches(settings) -> int:
    """The microbatches each pipeline cuts its batch into: as set, or one
    per stage for 0, the fewest 1F1B runs."""
    return settings.pipeline_microbatches or pipeline_stages(settings)


def pipeline_check(settings) -> str:
    """Why the pipelines cannot split this run ("" if it can)."""
    from trainscale.core.gpt import GPT_SHAPES

    s = settings
    stages, layers = pipeline_stages(s), GPT_SHAPES[s.model].layers
    if s.replicas % stages:
        return f"--pipeline-stages {stages} does not divide the {s.replicas} ranks"
    if stages > layers:
        return f"{stages} stages, but {s.model} has {layers} blocks to split"
    microbatches, batch = pipeline_microbatches(s), s.global_batch_size // (s.replicas // stages)
    if batch % microbatches:
        return (
            f"--pipeline-microbatches {microbatches} does not split a pipeline's "
            f"batch of {batch}"
        )
    if s.pipeline_schedule == "1f1b" and microbatches < stages:
        # torch 2.13's Schedule1F1B raises "Number of microbatches (2) must be
        # greater than or equal to the number of stages (4)" in every rank.
        return (
            f"--pipeline-microbatches {microbatches}: 1F1B needs one per stage at least "
            f"({stages} stages); use {stages}, 0 (one per stage) or gpipe"
        )
    if s.precision == "fp16":
        # The schedule runs backward itself: there is no loss to hand a GradScaler.
        return "--precision fp16: the schedule runs backward without loss scaling; use bf16"
    return ""


def tensor_parallel_check(settings) -> str:
    """Why the mesh cannot split this run ("" if it can)."""
    from trainscale.core.gpt import GPT_SHAPES

    s = settings
    tp = s.tensor_parallel or s.replicas
    if s.replicas % tp:
        return f"--tensor-parallel {tp} does not divide the {s.replicas} ranks"
    heads = GPT_SHAPES[s.model].heads
    if heads % tp:
        return f"--tensor-parallel {tp} does not divide {s.model}'s {heads} heads"
    return fsdp_refuses_channels_last(s)
