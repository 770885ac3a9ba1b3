"""Time-to-accuracy: definitions, kept pure (NumPy only), as timing.py is for throughput.

What is on the clock (MLPerf Training's rules, also in the docs: explanation/accuracy-clock.md):
- The clock starts just before the first training step touches the data. It
  stops at the end of the evaluation that first shows the test accuracy at
  or above the target. Evaluation is on the clock.
- Off the clock, recorded as `startup_seconds`: interpreter start, imports,
  the processes finding each other, model build, and the first compile
  (TensorFlow traces its training and evaluation steps on shapes alone, with
  no data: Backend.compile_untouched).
- The target is a test accuracy for an image model, and for a text model a
  validation perplexity, exp(mean loss per token), at or below (Target).
- An epoch is one pass of the global batch over the training split:
  len(train) // global batch steps. The test split is evaluated at each
  epoch's end, sharded over the processes, each test example counted once.

Learning-rate scaling with the number of replicas (Goyal et al., "Accurate,
Large Minibatch SGD"): `linear` multiplies the learning rate by the replicas,
`sqrt` by their square root. With `warmup_epochs`, the rate starts at the
unscaled learning rate and rises linearly, step by step, to the scaled one
over those epochs. The record has the rate of every epoch.

A cell's time-to-target over its repeats (MLPerf): with 5 or more runs, the
fastest and slowest are dropped and the rest averaged; a run that never
reached the target counts as the slowest, and if one is among those kept the
cell has no time. With fewer runs: the mean and spread of all, again only if
every run reached the target. The table says how many did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# At this many runs or more, a cell drops its fastest and slowest (MLPerf).
OLYMPIC_AT = 5


def peak_learning_rate(base: float, replicas: int, scaling: str) -> float:
    """The learning rate after warm-up: `base` scaled for `replicas` replicas."""
    factor = {"none": 1.0, "linear": float(replicas), "sqrt": math.sqrt(replicas)}[scaling]
    return base * factor


def learning_rate(
    base: float, replicas: int, scaling: str, warmup_epochs: float, epochs_done: float
) -> float:
    """The rate of the step that starts after `epochs_done` epochs (a fraction mid-epoch)."""
    peak = peak_learning_rate(base, replicas, scaling)
    if warmup_epochs <= 0 or epochs_done >= warmup_epochs:
        return peak
    return base + (peak - base) * epochs_done / warmup_epochs


@dataclass(frozen=True)
class Target:
    """What accuracy mode trains to: a curve point's `metric` at `value` (0:
    no target, every epoch is trained). An image model's is the test
    accuracy, at or above; a text model's the validation perplexity,
    exp(the mean loss per token), at or below."""

    metric: str
    value: float

    @property
    def higher_is_better(self) -> bool:
        return self.metric == "test_accuracy"

    def reached(self, point: dict) -> bool:
        if self.value <= 0:
            return False
        if self.higher_is_better:
            return point[self.metric] >= self.value
        return point[self.metric] <= self.value


def target_of(settings) -> Target:
    """The run's target: --target-perplexity for a text model, --target-accuracy otherwise."""
    if settings.is_text:
        return Target("test_perplexity", settings.target_perplexity)
    return Target("test_accuracy", settings.target_accuracy)


def scored_classes(settings) -> int:
    """How many classes an evaluation counts one by one (seed 003 reads its
    DeepSpeed runs class by class): an image data set's; none for a text
    model, whose "classes" are its vocabulary's tokens."""
    return 0 if settings.is_text else settings.num_classes


def per_class_accuracy(totals: np.ndarray, classes: int) -> dict:
    """The record's per-class part from an evaluation's summed row
    ([loss, correct, examples, correct of each class, examples of each
    class]): each class's test accuracy (None where the split has none of
    it) and its examples; nothing where `classes` is 0."""
    if not classes:
        return {}
    correct, examples = totals[3 : 3 + classes], totals[3 + classes : 3 + 2 * classes]
    return {
        "final_test_accuracy_per_class": [
            float(c / e) if e else None for c, e in zip(correct, examples)
        ],
        "test_examples_per_class": [int(round(e)) for e in examples],
    }


def time_to_target(curve: list[dict], target: Target) -> tuple[float | None, int | None]:
    """(seconds, epochs) at the first evaluation that reached `target`; (None, None)
    if none reached it, or there is no target (0)."""
    for point in curve:
        if target.reached(point):
            return point["wall_seconds"], point["epoch"]
    return None, None


def cell_time_to_target(times: list[float | None]) -> dict:
    """A cell's time-to-target over its runs (None: a run that never reached it)."""
    reached = [t for t in times if t is not None]
    result = {"runs": len(times), "reached": len(reached), "mean": None, "std": None}
    if len(times) >= OLYMPIC_AT:
        ordered = sorted(times, key=lambda t: math.inf if t is None else t)
        kept = ordered[1:-1]
        result["rule"] = "mean without the fastest and slowest"
    else:
        kept = list(times)
        result["rule"] = "mean of all"
    if kept and all(t is not None for t in kept):
        values = np.asarray(kept, dtype=np.float64)
        result["mean"] = float(values.mean())
        result["std"] = float(values.std(ddof=1)) if len(values) > 1 else 0.0
    return result


def evaluation_batches(images, labels, index: int, count: int, batch: int) -> list:
    """evaluation_shard's examples in batches: [(images, labels, weights)], NumPy."""
    indices, weights = evaluation_shard(len(images), index, count, batch)
    return [
        (images[indices[i : i + batch]], labels[indices[i : i + batch]], weights[i : i + batch])
        for i in range(0, len(indices), batch)
    ]


def evaluation_shard(num_examples: int, index: int, count: int, batch: int):
    """The test examples process `index` of `count` evaluates, padded so every
    process runs the same number of equal batches (a sharded model's forward
    is a collective): (indices, weights), weight 0 on padding. Every example
    has weight 1 in exactly one process."""
    mine = np.arange(index, num_examples, count)
    per_process = -(-num_examples // count)
    length = max(batch, -(-per_process // batch) * batch)
    indices = np.zeros(length, dtype=np.int64)
    weights = np.zeros(length, dtype=np.float32)
    indices[: len(mine)], weights[: len(mine)] = mine, 1.0
    return indices, weights
