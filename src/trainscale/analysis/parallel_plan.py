"""`trainscale plan`: every parallel configuration of a GPT on a cluster,
whether it fits in a device's memory, and its predicted step time, ranked.

A **parallel configuration** splits the cluster's W = nodes x GPUs ranks
into data x tensor x pipeline degrees (Megatron-LM's order: a tensor group
inside a node, then the data-parallel replicas, the pipeline's stages
outermost), with a ZeRO stage over the data ranks (FSDP2 is stage 3), the
pipeline's microbatches and schedule, and activation checkpointing on or off.

Memory per rank is the memory model's (trainscale.analysis.memory_model:
model states after the tensor, pipeline and ZeRO splits, activations for the
microbatches the schedule keeps in flight), at the pipeline's worst stage.

The step time is the sum of terms, each the algorithm the backend runs:

- compute: the slowest pipeline stage's FLOPs (trainscale.core.gpt's 6N +
  12LHQT per token, 8N with checkpointing: a second forward; the last
  stage holds the head too) over its data and tensor ranks, at a rank's
  achieved FLOP/s;
- the pipeline's bubble: a stage idles (p - 1) microbatch slots of its
  (m + p - 1), for GPipe and 1F1B alike (Narayanan et al. 2021);
  each ring step below also pays its link's latency;
- the data-parallel exchange: a ring over the d replicas moves 2(d-1)/d of
  the gradient's bytes (an all-reduce, or ZeRO-1/2's reduce-scatter and
  all-gather), 3(d-1)/d under ZeRO-3 and FSDP2 (Rajbhandari et al., §7),
  (d-1)/d more over gloo, whose reduce-scatter is an all-reduce, over a
  node's links when the replicas fit in one, else the network; ZeRO-3 and
  FSDP2 call their collectives per unit (each block, and the root), and
  each call's ring steps pay their own cost besides; it hides behind up
  to `overlap` of the backward pass (as `trainscale predict`'s step model
  has it);
- tensor parallelism: each block all-reduces its activations twice in
  forward and twice in backward (three times with checkpointing's second
  forward), over the node's links (Shoeybi et al. 2019);
- the pipeline's sends: each microbatch's activations forward and their
  gradient back, once per stage boundary a rank has.

The terms' numbers (StepTerms: a rank's FLOP/s, each link's bandwidth and
latency, the overlap) are assumed from a data sheet, or fitted to a
study's records (trainscale.analysis.parallel_plan_fit), which also gives
each prediction its 95 % band; the plan labels each term as one or the
other.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainscale.analysis.memory_model import BYTES, rank_parameters
from trainscale.analysis.parallel_plan_memory import memory
from trainscale.analysis.predict import BACKWARD_SHARE
from trainscale.catalogue.knobs import ZERO_STAGE
from trainscale.catalogue.model_parallel_knobs import (
    PIPELINE_MICROBATCHES,
    PIPELINE_SCHEDULE,
    PIPELINE_STAGES,
    TENSOR_PARALLEL,
)
from trainscale.core.gpt import gpt_shape, stage_blocks, stage_training_flops_per_token

ZERO_STAGES = (0, 1, 2, 3)
# Microbatches per stage tried for a pipeline: m = p x each (Megatron-LM's
# guidance is m >= 4p for a bubble under a fifth).
MICROBATCHES_PER_STAGE = (1, 2, 4, 8)


@dataclass(frozen=True)
class Cluster:
    """The cluster's shape and a device's memory."""

    nodes: int
    gpus_per_node: int
    device_memory_gib: float
    # The collective library: NCCL reduce-scatters; gloo has none, and
    # PyTorch's FSDP2 and DeepSpeed all-reduce the whole gradient in its place
    # (a CPU record's collectives_per_step: gloo:all_reduce of every element).
    collectives: str = "nccl"

    @property
    def devices(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class Workload:
    """What is trained: a ladder model, its sequence and vocabulary, the
    global batch in sequences, and how."""

    model: str
    seq_len: int
    vocabulary: int
    global_batch: int
    precision: str = "bf16"
    optimizer: str = "adam"


@dataclass(frozen=True)
class StepTerms:
    """What the step time's terms are made of: assumed (a data sheet's peak
    times a share, a link's rated bandwidth) or fitted to a study's records
    (trainscale.analysis.parallel_plan_fit)."""

    flops_per_sec: float  # one rank's compute, achieved
    intra_gb_per_s: float  # bus bandwidth between a node's devices
    inter_gb_per_s: float  # one device's share of the network between nodes
    intra_latency_s: float = 0.0  # per ring step
    inter_latency_s: float = 0.0
    overlap: float = 0.0  # the share of the backward pass the data-parallel exchange hides behind
    # What a scheme's own calls cost beyond their bytes and the link's
    # latency (dispatch, a DTensor's redistribution, the schedule's
    # bookkeeping): per tensor-parallel all-reduce, per pipeline send.
    tensor_call_s: float = 0.0
    send_s: float = 0.0
    # ZeRO-3's and FSDP2's calls per unit (a block, or the root): gather in
    # forward, again in backward, reduce; each of d - 1 ring steps costs this.
    shard_call_s: float = 0.0
    # DeepSpeed's ZeRO-1 and 2, per step, beyond their collectives: a hook
    # per parameter tensor moving its gradient into the reduce bucket, the
    # fp32 partition's update and its copy back into the weights.
    partition_step_s: float = 0.0
    # The model's own relative error (RMS) over the study's runs it was
    # fitted to: the refits' spread says how well the records pin the terms
    # down, this how far the model's sum of terms misses a run; it widens
    # every band (a prediction interval, not a fit's confidence interval).
    model_error: float = 0.0


@dataclass(frozen=True)
class MemoryBudget:
    reserved_gib: float = 1.0  # the runtime's own memory: CUDA context, allocator slack
    headroom: float = 0.1  # the share of device memory kept free


@dataclass(frozen=True)
class Configuration:
    data: int
    tensor: int
    pipeline: int
    shard_stage: int
    microbatches: int = 1
    checkpointing: bool = False
    schedule: str = "1f1b"

    @property
    def name(self) -> str:
        parts = [f"dp{self.data}", f"tp{self.tensor}", f"pp{self.pipeline}"]
        if self.shard_stage:
            parts.append(f"zero{self.shard_stage}")
        if self.pipeline > 1:
            parts.append(f"m{self.microbatches} {self.schedule}")
        if self.checkpointing:
            parts.append("ckpt")
        return " ".join(parts)

    def frameworks(self) -> tuple[tuple[str, dict], ...]:
        """The trainscale frameworks that run it, each with its knobs; none:
        predicted only."""
        d, t, p, z = self.data, self.tensor, self.pipeline, self.shard_stage
        zero = ("deepspeed", {ZERO_STAGE.name: z})
        if t == 1 and p == 1:
            return {0: (("torch-ddp", {}), zero), 3: (("torch-fsdp", {}), zero)}.get(z, (zero,))
        if p == 1 and (z == 3 or d == 1):  # FSDP2 across the tensor groups
            return (("torch-tp", {TENSOR_PARALLEL.name: t}),)
        if t == 1 and z == 0:  # DDP across the pipelines
            knobs = {
                PIPELINE_STAGES.name: p,
                PIPELINE_MICROBATCHES.name: self.microbatches,
                PIPELINE_SCHEDULE.name: self.schedule,
            }
            return (("torch-pipeline", knobs),)
        return ()

    def runs_as(self) -> tuple[str, ...]:
        """frameworks(), as the plan's table names them."""
        return tuple(
            " ".join([name, *(f"{k}={v}" for k, v in knobs.items())])
            for name, knobs in self.frameworks()
        )


@dataclass(frozen=True)
class Prediction:
    configuration: Configuration
    memory_bytes: dict[str, float]  # the worst stage's, by kind
    seconds: dict[str, float]  # the step's terms
    fits: bool
    tokens_per_step: int
    # Tokens/sec with each refit of the terms (none where they were assumed).
    draw_rates: tuple[float, ...] = ()
    model_error: float = 0.0  # StepTerms.model_error

    @property
    def band(self) -> tuple[float, float] | None:
        """The 95 % band: the refits' tokens/sec, widened by 1.96 of the
        model's own error each way; None where there are no refits."""
        if not self.draw_rates:
            return None
        low, high = np.percentile(self.draw_rates, [2.5, 97.5])
        wide = 1.96 * self.model_error
        return float(low) * max(0.0, 1 - wide), float(high) * (1 + wide)

    @property
    def step_seconds(self) -> float:
        return sum(self.seconds.values())

    @property
    def tokens_per_sec(self) -> float:
        return self.tokens_per_step / self.step_seconds


def configurations(cluster: Cluster, workload: Workload) -> list[Configuration]:
    """Every configuration the cluster's ranks split into: a tensor degree
    dividing a node's GPUs and the model's heads, a pipeline of at most one
    block a stage, a global batch that divides over the replicas and the
    microbatches, each ZeRO stage (tensor groups: none, or FSDP2's 3)."""
    shape = gpt_shape(workload.model)
    found = []
    for t in _divisors(cluster.gpus_per_node):
        if shape.heads % t:
            continue
        for p in _divisors(cluster.devices // t):
            d = cluster.devices // (t * p)
            if p > shape.layers or workload.global_batch % d:
                continue
            per_replica = workload.global_batch // d
            zeros = ZERO_STAGES if t == 1 and p == 1 else (0, 3) if p == 1 else (0, 1)
            microbatches = sorted({p * k for k in MICROBATCHES_PER_STAGE}) if p > 1 else [1]
            for z in zeros if d > 1 else (0,):
                for m in microbatches:
                    if per_replica % m:
                        continue
                    for ckpt in (False, True):
                        found.append(Configuration(d, t, p, z, m, ckpt))
    return found


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def stage_flops_per_token(workload: Workload, stage: int, stages: int) -> int:
    w = workload
    return stage_training_flops_per_token(w.model, w.seq_len, w.vocabulary, stage, stages)


def step_terms(
    config: Configuration, cluster: Cluster, workload: Workload, terms: StepTerms
) -> dict[str, float]:
    """Seconds of each term of one step (the module's docstring), at the
    pipeline's slowest stage: the others wait for it."""
    w, p, m = workload, config.pipeline, config.microbatches
    shape = gpt_shape(w.model)
    tokens = w.global_batch * w.seq_len
    slowest = max(range(p), key=lambda stage: stage_flops_per_token(w, stage, p))
    flops = stage_flops_per_token(w, slowest, p) * tokens / (config.data * config.tensor)
    if config.checkpointing:
        flops = flops * 4 / 3  # a second forward: 8N where training is 6N
    compute = flops / terms.flops_per_sec
    bubble = compute * (p - 1) / m
    microbatch_bytes = tokens // (config.data * m) * shape.width * BYTES[w.precision]
    tensor = 0.0
    if config.tensor > 1:
        calls = (6 if config.checkpointing else 4) * len(stage_blocks(shape.layers, slowest, p))
        ring = _ring(config.tensor, microbatch_bytes, terms, inter=False)
        tensor = calls * m * (ring + terms.tensor_call_s)
    data = 0.0
    if config.data > 1:
        held = rank_parameters(w.model, w.seq_len, w.vocabulary, config.tensor, slowest, p)
        grad_bytes = held * (BYTES[w.precision] if config.shard_stage in (1, 2) else 4)
        passes = 3 if config.shard_stage == 3 else 2
        if config.shard_stage and cluster.collectives == "gloo":
            passes += 1  # its reduce-scatter is an all-reduce: two passes, not one
        across = config.tensor * config.data > cluster.gpus_per_node
        exchange = passes / 2 * _ring(config.data, grad_bytes, terms, across)
        if config.shard_stage == 3:
            units = len(stage_blocks(shape.layers, slowest, p)) + 1
            exchange += 3 * units * (config.data - 1) * terms.shard_call_s
        data = max(0.0, exchange - terms.overlap * BACKWARD_SHARE * compute)
        if config.shard_stage in (1, 2):
            data += terms.partition_step_s  # not communication: nothing hides it
    sends = 0.0
    if p > 1:
        across = config.tensor * config.data * p > cluster.gpus_per_node
        bandwidth, latency = _link(terms, across)
        # forward, and the gradient back
        sends = 2 * m * (microbatch_bytes / (bandwidth * 1e9) + latency + terms.send_s)
    return {"compute": compute, "bubble": bubble, "data": data, "tensor": tensor, "pipeline": sends}


def _link(terms: StepTerms, inter: bool) -> tuple[float, float]:
    if inter:
        return terms.inter_gb_per_s, terms.inter_latency_s
    return terms.intra_gb_per_s, terms.intra_latency_s


def _ring(ranks: int, size: float, terms: StepTerms, inter: bool) -> float:
    """Seconds of a ring all-reduce of `size` bytes over `ranks` ranks: 2(n-1)/n
    of the bytes cross each link, in 2(n-1) steps of one latency each (the
    step model's ring, trainscale.analysis.predict)."""
    bandwidth, latency = _link(terms, inter)
    return 2 * (ranks - 1) * (size / ranks / (bandwidth * 1e9) + latency)


def plan_one(
    config: Configuration,
    cluster: Cluster,
    workload: Workload,
    budget: MemoryBudget,
    terms: StepTerms,
    draws: tuple[StepTerms, ...] = (),
) -> Prediction:
    """One configuration's memory and step; with a 95 % band where `draws`
    (the terms refitted to redrawn records) are given."""
    tokens = workload.global_batch * workload.seq_len
    held = memory(config, workload, budget, collectives=cluster.collectives)
    seconds = step_terms(config, cluster, workload, terms)
    rates = tuple(tokens / sum(step_terms(config, cluster, workload, d).values()) for d in draws)
    usable = (1 - budget.headroom) * cluster.device_memory_gib * 2**30
    fits = sum(held.values()) <= usable
    return Prediction(config, held, seconds, fits, tokens, rates, terms.model_error)


def plan(
    cluster: Cluster,
    workload: Workload,
    budget: MemoryBudget,
    terms: StepTerms,
    draws: tuple[StepTerms, ...] = (),
) -> list[Prediction]:
    """Every configuration, those that fit first, fastest first."""
    found = [
        plan_one(config, cluster, workload, budget, terms, draws)
        for config in configurations(cluster, workload)
    ]
    return sorted(found, key=lambda p: (not p.fits, -p.tokens_per_sec))
