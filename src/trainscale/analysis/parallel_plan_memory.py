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
from trainscale.core.gpt import gpt_shape


def memory(
    config,
    workload,
    budget,
    framework: str | None = None,
    knobs: Mapping = {},
) -> dict[str, float]:
    """Bytes one rank holds at most, at its pipeline's fullest stage: model
    states (DeepSpeed below ZeRO-3 keeps 16-bit weights and an fp32 master;
    the others fp32 weights under autocast) with the activations or the
    gradients and the step's transients, at the largest of its peaks
    (memory_model.peak_phase: a pipeline's kept outputs among them);
    ZeRO-3's gathered blocks (the one computing and the one prefetched),
    the framework's own
    buffers (memory_model.buffer_bytes: `framework`, else the first that
    runs the configuration, with a run's `knobs`) and the runtime's own."""
    w = workload
    runs = config.frameworks()
    framework = framework or (runs[0][0] if runs else "")
    weights = w.precision if config.shard_stage in (1, 2) else "fp32"
    microbatch = w.global_batch // (config.data * config.microbatches)
    # torch's schedule keeps every microbatch's output (the last stage's
    # logits) to merge them when its step returns.
    pipelined = config.pipeline > 1 or framework == "torch-pipeline"
    worst: dict[str, float] = {}
    for stage in range(config.pipeline):
        held = rank_parameters(
            w.model, w.seq_len, w.vocabulary, config.tensor, stage, config.pipeline
        )
        held_bytes = {
            **stage_peak(
                w.model,
                microbatch,
                w.seq_len,
                w.vocabulary,
                w.optimizer,
                w.precision,
                config.checkpointing,
                config.tensor,
                stage,
                config.pipeline,
                config.microbatches,
                config.schedule,
                weights,
                config.data,
                config.shard_stage,
                keeps_outputs=pipelined,
            ),  # fmt: skip
            "gathered": _gathered_bytes(config, w) if config.shard_stage == 3 else 0.0,
            "buffers": buffer_bytes(framework, held, weights, config.shard_stage, knobs),
            "reserved": budget.reserved_gib * 2**30,
        }
        if sum(held_bytes.values()) > sum(worst.values()):
            worst = held_bytes
    return worst


def _gathered_bytes(config, workload) -> float:
    block = block_linear_weights(gpt_shape(workload.model), config.tensor)
    return 2 * BYTES["fp32"] * block
