"""Accuracy mode's loop: train epoch by epoch, evaluating on the test split at
each epoch's end, until the target or --epochs (trainscale.core.accuracy).

An epoch is a block of the throughput statistics (timing.BlockTimes) and of
the grid point's timeline (trainscale.harness.run_events): a fault fires
before its step, an elastic framework saves its state after every
--checkpoint-blocks epochs, and its restart goes on from the epoch it saved.
The curve of the epochs before that comes back from the timeline, and the
wall clock counts from the first attempt's first step, so a recovered run's
time to the target includes its recovery.
"""

from __future__ import annotations

import math

import numpy as np

from trainscale.core.accuracy import (
    learning_rate,
    peak_learning_rate,
    per_class_accuracy,
    scored_classes,
    target_of,
    time_to_target,
)
from trainscale.core.timing import BlockTimes, Stopwatch
from trainscale.harness.backend import Backend
from trainscale.harness.progress import log, unit, who
from trainscale.harness.run_events import RunEvents


def steps_per_epoch(backend: Backend) -> int:
    s = backend.settings
    steps = backend.train_examples // s.global_batch_size
    if steps < 1:
        raise ValueError(
            f"the training split's {backend.train_examples} examples hold no global batch "
            f"of {s.global_batch_size}"
        )
    return steps


def train_epochs(backend: Backend, events: RunEvents, first_step: int = 0):
    """Train from `first_step` (a restart's, at an epoch's start) to the end;
    return the epochs' BlockTimes and what the record says of accuracy."""
    s, topology = backend.settings, backend.topology
    steps = steps_per_epoch(backend)
    epochs = BlockTimes(
        images_per_block=s.batch_size * topology.replicas_in_process * steps,
        replicas_in_process=topology.replicas_in_process,
        steps_per_block=steps,
    )
    first_epoch = first_step // steps
    curve = events.curve_before(first_epoch)
    # Starts before the first step touches the data; a restart's goes on
    # from the first attempt's.
    clock, offset = Stopwatch(), events.seconds_since_timed_start() if first_step else 0.0
    events.timed_start(first_step)
    rate = None
    for epoch in range(first_epoch, s.epochs):
        epoch_clock = Stopwatch()
        for step in range(steps):
            wanted = learning_rate(
                s.learning_rate, s.replicas, s.lr_scaling, s.warmup_epochs, epoch + step / steps
            )
            if wanted != rate:
                backend.set_learning_rate(wanted)
                rate = wanted
            events.before_step(epoch * steps + step)
            loss = backend.step()  # (TensorFlow's first step ran in compile_untouched)
            events.after_step(loss, epoch * steps + step + 1)
        loss_value = backend.read_loss(loss)
        seconds = epoch_clock.elapsed()
        own = np.array([epochs.local_rate(seconds), loss_value, seconds])
        # One collective: every process's epoch's numbers and test share
        # (OWN columns, then evaluate()'s).
        gathered = backend.gather_rows(np.concatenate([own, backend.evaluate()]))
        curve.append(_curve_point(backend, epochs, gathered, epoch, offset + clock.elapsed()))
        curve[-1].update(learning_rate=rate)
        images = round(epochs.images[-1])
        events.block_done(epoch, (epoch + 1) * steps, images, seconds, curve=curve[-1])
        if topology.is_chief:
            point = curve[-1]
            perplexity = f", perplexity {point['test_perplexity']:.3f}" if s.is_text else ""
            log(
                f"{who(s)}: epoch {epoch + 1}/{s.epochs} {point['images_per_sec']:.1f} {unit(s)}, "
                f"test accuracy {point['test_accuracy']:.4f}, loss {point['test_loss']:.4f}"
                f"{perplexity}, at {point['wall_seconds']:.1f} s"
            )
        if target_of(s).reached(curve[-1]):
            break
    return epochs, _summary(backend, curve, steps, gathered[:, OWN:].sum(axis=0))


# A gathered row: the process's epoch (rate, loss, seconds), then its evaluation.
OWN = 3


def _curve_point(backend, epochs: BlockTimes, gathered: np.ndarray, epoch: int, wall: float):
    """One epoch's row of the curve from every process's gathered numbers."""
    loss_sum, correct, examples = gathered[:, OWN : OWN + 3].sum(axis=0)
    own = gathered[backend.topology.process_index]
    total = epochs.add(float(own[2]), gathered[:, 0], gathered[:, 2])
    point = {
        "epoch": epoch + 1,
        "wall_seconds": wall,
        "train_seconds": float(gathered[:, 2].max()),
        "images_per_sec": total,
        "train_loss": float(own[1]) if backend.loss_is_global else float(gathered[:, 1].sum()),
        "test_loss": float(loss_sum / examples),
        # A text model's: the share of next tokens predicted right.
        "test_accuracy": float(correct / examples),
    }
    if backend.settings.is_text:  # its loss is per token: exp of it, the perplexity
        point["test_perplexity"] = math.exp(point["test_loss"])
    return point


def _summary(backend: Backend, curve: list[dict], steps: int, tested: np.ndarray) -> dict:
    """What the record says of accuracy; `tested`: the last evaluation's
    row (Backend.evaluate), summed over the processes."""
    s = backend.settings
    target, classes = target_of(s), scored_classes(s)
    seconds, epochs_to_target = time_to_target(curve, target)
    return {
        "mode": "accuracy",
        "final_loss": curve[-1]["train_loss"],
        "train_examples": backend.train_examples,
        "test_examples": int(round(tested[2])),
        "steps_per_epoch": steps,
        "epochs_run": len(curve),
        # The whole run on the clock: to the target, or through every epoch.
        "training_seconds": curve[-1]["wall_seconds"],
        "target_accuracy": s.target_accuracy or None,
        "target_metric": target.metric,
        "target": target.value or None,
        "time_to_target_seconds": seconds,
        "epochs_to_target": epochs_to_target,
        "final_test_accuracy": curve[-1]["test_accuracy"],
        "final_test_loss": curve[-1]["test_loss"],
        **({"final_test_perplexity": curve[-1]["test_perplexity"]} if s.is_text else {}),
        "peak_learning_rate": peak_learning_rate(s.learning_rate, s.replicas, s.lr_scaling),
        **per_class_accuracy(tested, classes),
        **({"test_class_names": backend.test_class_names} if classes else {}),
        "curve": curve,
    }
