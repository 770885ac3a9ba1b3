"""Turning timed blocks into throughput statistics. Pure NumPy: no TensorFlow.

Definitions (also in the docs: explanation/definitions.md):
- A *block* is `steps_per_block` training steps timed together, ending
  with a device sync (the host reads the step's loss, which cannot exist
  before every earlier step on that replica has finished).
- A process's block rate is images it trained in the block / block seconds.
- The *total* images/sec of a block is the SUM over all processes of their
  block rates, gathered with a cross-process collective after each block
  (seed 000's fix: Horovod's own benchmark reported rank 0's rate times the
  number of ranks, which hides slow ranks).
- Per-replica images/sec is a process's block rate divided by the replicas
  it drives (MirroredStrategy drives several from one process).
- Reported: mean and sample standard deviation (ddof=1) over blocks.
- For a text model an "image" is an example, a sequence of tokens: its
  rates are in tokens too (token_rates), the example rate times its length.
- Step time is block seconds / steps: steps are not synced one by one (that
  would slow them), so percentiles are over block means, not single steps.
- With a time budget, the number of blocks is what fit in it (BlockBudget);
  the record says how many were timed (`blocks`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np


def mean_std(values) -> dict:
    values = np.asarray(values, dtype=np.float64).ravel()
    std = float(values.std(ddof=1)) if values.size > 1 else 0.0
    return {"mean": float(values.mean()), "std": std}


@dataclass
class BlockTimes:
    """Block durations of one process, and the cross-process rates per block."""

    images_per_block: int  # images this process trains in one block
    replicas_in_process: int
    steps_per_block: int
    seconds: list[float] = field(default_factory=list)
    # One row per block: the block rate of every process (index = process).
    process_rates: list[np.ndarray] = field(default_factory=list)
    # Per block: every process's images in it (its rate times its own seconds).
    images: list[float] = field(default_factory=list)

    def local_rate(self, seconds: float) -> float:
        return self.images_per_block / seconds

    def add(self, seconds: float, rates_of_all_processes, seconds_of_all_processes) -> float:
        """Record one block (this process's seconds, and every process's rate
        and seconds); return its total images/sec over all processes."""
        self.seconds.append(seconds)
        rates = np.asarray(rates_of_all_processes, dtype=np.float64).ravel()
        self.process_rates.append(rates)
        # Each process's own seconds: the processes' blocks end at different
        # times (by 5 % on a busy CPU), so the writer's would miscount them.
        process_seconds = np.asarray(seconds_of_all_processes, dtype=np.float64).ravel()
        self.images.append(float(np.dot(rates, process_seconds)))
        return float(rates.sum())

    def summary(self) -> dict:
        rates = np.vstack(self.process_rates)  # blocks x processes
        totals = rates.sum(axis=1)
        per_replica = rates / self.replicas_in_process
        step_ms = np.asarray(self.seconds) / self.steps_per_block * 1000.0
        return {
            "images_per_sec": {**mean_std(totals), "samples": [float(x) for x in totals]},
            # Every process's own rate per block (processes x blocks): the
            # samples above are their sums, so no worker's rate goes missing.
            "process_images_per_sec": [[float(x) for x in column] for column in rates.T],
            "per_replica_images_per_sec": mean_std(per_replica),
            "step_time_ms": {
                "mean": float(step_ms.mean()),
                "p50": float(np.percentile(step_ms, 50)),
                "p90": float(np.percentile(step_ms, 90)),
                "p99": float(np.percentile(step_ms, 99)),
                "basis": "block mean per step on the writing process",
            },
            "timed_seconds": float(np.sum(self.seconds)),
            # Every process's images in the timed blocks.
            "timed_images": float(np.sum(self.images)),
            "blocks": len(self.seconds),
        }


def token_rates(summary: dict, tokens_per_example: int) -> dict:
    """A text model's rates in tokens as well: each of its examples (what
    images_per_sec counts) is a sequence of `tokens_per_example` tokens."""

    def in_tokens(rate: dict) -> dict:
        return {key: rate[key] * tokens_per_example for key in ("mean", "std")}

    return {
        "tokens_per_example": tokens_per_example,
        "tokens_per_sec": in_tokens(summary["images_per_sec"]),
        "per_replica_tokens_per_sec": in_tokens(summary["per_replica_images_per_sec"]),
    }


def energy_per_example(energy_joules: float | None, summary: dict, tokens_per_example: int) -> dict:
    """What the devices drew per image trained (and per token, for a text
    model's `tokens_per_example`-token sequences) over the timed blocks:
    their energy over the timed part (NVML's counter,
    trainscale.core.gpu_monitor) over every process's images in it. None
    where no counter was read (CPUs, GPUs before Volta)."""
    images = summary["timed_images"]
    per_image = energy_joules / images if energy_joules is not None and images else None
    fields = {"energy_per_image_joules": per_image}
    if tokens_per_example > 1:
        per_token = per_image / tokens_per_example if per_image is not None else None
        fields["energy_per_token_joules"] = per_token
    return fields


# A run is input-bound when its input pipeline, decoding alone, yields less
# than this many times the images it trained per second: what is left over
# is too little for the pipeline to hide behind the step.
INPUT_BOUND_RATIO = 1.1


def input_pipeline(processes: list, training_images_per_sec: float) -> dict:
    """The run's decode-only rate (its processes' pipelines together, each
    measured after the timed blocks) and whether it is input-bound; no
    fields for a run whose data is in memory or synthetic (None rates)."""
    rates = [p.get("decode_only_images_per_sec") for p in processes]
    if not rates or any(rate is None for rate in rates):
        return {}
    total = float(sum(rates))
    return {
        "input_pipeline_images_per_sec": total,
        "input_bound": total < INPUT_BOUND_RATIO * training_images_per_sec,
    }


@dataclass
class BlockBudget:
    """How many blocks to time: `most`, or, with a budget of `seconds` > 0, as
    many as fit in it — at least `least` (a std needs two), at most `most`.

    Time is counted on the slowest process (each block's seconds are gathered),
    so every process reaches the same decision after the same block: a
    collective that one process skipped would hang the others. The last block
    may end past the budget: a run's timed part takes at most
    budget + one block (or `least` blocks), whatever the CPU's speed.
    """

    most: int
    seconds: float = 0.0
    least: int = 2
    blocks: int = 0
    spent: float = 0.0

    def done_after(self, slowest_block_seconds: float) -> bool:
        """Count one block; whether no further block should be timed."""
        self.blocks += 1
        self.spent += slowest_block_seconds
        if self.blocks >= self.most:
            return True
        return self.seconds > 0 and self.blocks >= self.least and self.spent >= self.seconds


class Stopwatch:
    """perf_counter-based interval timer (monotonic, sub-microsecond)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start
