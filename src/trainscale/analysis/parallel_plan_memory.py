"""`trainscale plan`'s memory per rank: the memory model's counts
(trainscale.analysis.memory_model) for a parallel configuration, at its
pipeline's fullest stage, by kind. Its arguments are
trainscale.analysis.parallel_plan's Configuration, Workload and
MemoryBudget (that module imports this one); parallel_plan.plan_one
compares the sum with a device's memory, analysis.memory_check with a run's
live tensor bytes. Pure Python: no TensorFlow, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainscale.analysis.memory_model import (
    BYTES,
    block_linear_weights,
    buffer_bytes,
    rank_parameters,
    stage_peak,
)
from trainscale.catalogue.knobs import ZERO_MAX_LIVE, ZERO_REUSE_DISTANCE
from trainscale.core.gpt import gpt_shape


def memory(
    config,
    workload,
    budget,
    framework: str | None = None,
    knobs: Mapping = {},
    collectives: str = "nccl",
) -> dict[str, float]:
    """Bytes one rank holds at most, at its pipeline's fullest stage: model
    states (DeepSpeed keeps its weights in the run's precision and an fp32
    master copy of the partition it updates; the others fp32 weights under
    autocast) with the activations or the gradients and the step's
    transients, at the largest of its peaks (memory_model.peak_phase: a
    pipeline's kept outputs among them); the weights ZeRO-3 and FSDP2 hold
    gathered (gathered_bytes); the framework's own buffers
    (memory_model.buffer_bytes: `framework`, else the first that runs it,
    a run's `knobs`), the runtime's; FSDP2's over `collectives` (reduce_copies),
    and what its peak holds or not by its ranks' timing (timing_bytes)."""
    w = workload
    runs = config.frameworks()
    framework = framework or (runs[0][0] if runs else "")
    # A ZeRO-1 or 2 configuration that nothing here runs is DeepSpeed's.
    deepspeed = framework == "deepspeed" or (not framework and config.shard_stage in (1, 2))
    weights = w.precision if deepspeed else "fp32"
    microbatch = w.global_batch // (config.data * config.microbatches)
    # torch's schedule keeps every microbatch's output (the last stage's
    # logits) to merge them when its step returns.
    pipelined = config.pipeline > 1 or framework == "torch-pipeline"
    worst: dict[str, float] = {}
    for stage in range(config.pipeline):
        held = rank_parameters(
            w.model, w.seq_len, w.vocabulary, config.tensor, stage, config.pipeline
        )
        peak = stage_peak(
            w.model, microbatch, w.seq_len, w.vocabulary, w.optimizer, w.precision,
            config.checkpointing, config.tensor, stage, config.pipeline,
            config.microbatches, config.schedule, weights, config.data, config.shard_stage,
            keeps_outputs=pipelined,
            master=deepspeed and config.shard_stage > 0,  # ZeRO's own clone
            reduce_copies=reduce_copies(config, deepspeed, collectives),
        )  # fmt: skip
        held_bytes = {
            **peak,
            "gathered": gathered_bytes(framework, config, w, held, knobs),
            "buffers": buffer_bytes(framework, held, weights, config.shard_stage, knobs),
            "timing": timing_bytes(config, w, stage, deepspeed, collectives),
            "reserved": budget.reserved_gib * 2**30,
        }
        if sum(held_bytes.values()) > sum(worst.values()):
            worst = held_bytes
    return worst


def reduce_copies(config, deepspeed: bool, collectives: str) -> int:
    """FSDP2's copies of a unit's whole gradient while it reduces
    (memory_model.unit_reduce_phases): autograd's and the reduce-scatter's
    input, and gloo's clone of that input past one rank; 0 for any other scheme."""
    if config.shard_stage != 3 or deepspeed:
        return 0
    return 3 if collectives == "gloo" and config.data > 1 else 2


def timing_bytes(config, workload, stage: int, deepspeed: bool, collectives: str) -> float:
    """Bytes a rank's peak holds or not by its ranks' timing: one tensor the
    size of the token embedding, the largest unit with a GPT-2 vocabulary.
    torch's memory timeline of gpt-tiny over gloo (2 ranks of one run)
    showed one rank holding it at the peak and the other not, for DDP and
    tensor parallelism (a gradient of its size) and FSDP2 (its root unit's
    gathered embedding, freed before that unit's reduce or after:
    memory_model.unit_reduce_phases); bench/README.md. Counted in fp32
    (FSDP2's gathered weight: the run's type) on the first stage, which
    holds the embedding, of a torch configuration of more than one data or
    tensor rank; DeepSpeed's peak is its buffers' and showed no such step."""
    if deepspeed or stage or config.data * config.tensor == 1:
        return 0.0
    fsdp2 = reduce_copies(config, deepspeed, collectives) > 0
    size = BYTES[workload.precision] if fsdp2 else BYTES["fp32"]
    return size * gpt_shape(workload.model).width * workload.vocabulary


def gathered_bytes(framework: str, config, workload, held: int, knobs: Mapping = {}) -> float:
    """The bytes of weights a ZeRO-3 or FSDP2 rank holds whole, of the
    `held` parameters its pipeline stage has before the ZeRO split. FSDP2:
    two blocks' (the one computing and the one prefetched; its embedding
    and head are units of their own, and their whole gradients while they
    reduce are memory_model.unit_reduce_phases'). DeepSpeed's ZeRO-3 releases a
    gathered parameter only if its next use is further than
    ZERO_REUSE_DISTANCE's elements away: a block's next use is its
    backward, twice the rest of the model away, so at the default (10^9)
    every parameter of a model of under 500 M stays gathered from its
    forward to its backward, up to ZERO_MAX_LIVE's count. Where in the
    step the peak falls is not known for either: counted at every phase."""
    if config.shard_stage != 3:
        return 0.0
    if framework == "deepspeed":
        reuse, live = (int(knob.value_in(knobs)) for knob in (ZERO_REUSE_DISTANCE, ZERO_MAX_LIVE))
        kept = min(held if 2 * held <= reuse else reuse / 2, live)
    else:
        kept = 2 * block_linear_weights(gpt_shape(workload.model), config.tensor)
    # Gathered in the run's type: DeepSpeed's 16-bit weights, FSDP2's param_dtype.
    return BYTES[workload.precision] * kept
