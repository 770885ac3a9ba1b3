"""What both harness benchmarks share (bench/harness_bench.py for TensorFlow,
bench/torch_bench.py for torch): blocks timed side by side, one-replica runs
through each framework's real launcher, medians and their bootstrap interval.
Imports neither TensorFlow nor torch.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainscale.catalogue.settings import RunSettings


def interleaved_blocks(blocks: dict, rounds: int) -> dict[str, list[float]]:
    """Call each block function once per round, A, B, A, B, ...: each returns the
    images/sec of one timed block. Interleaving blocks, not whole runs, makes a
    ratio immune to the machine's drift (a 2-core VM's neighbours come and go)."""
    for block in blocks.values():  # trace and warm up, untimed
        block()
    rates: dict[str, list[float]] = {name: [] for name in blocks}
    for _ in range(rounds):
        for name, block in blocks.items():
            rates[name].append(block())
    for name, values in rates.items():
        print(f"bench: {name}: median {median(values):.1f} img/s", file=sys.stderr, flush=True)
    return rates


def timed_block(step, steps: int, images: int):
    def block() -> float:
        start = time.perf_counter()
        for _ in range(steps):
            loss = step()
        float(loss)  # the device sync that ends a block, as in the harness
        return images / (time.perf_counter() - start)

    return block


def run_framework(
    settings: RunSettings,
    framework: str,
    output: str,
    python: str = sys.executable,
    replicas: int = 1,
) -> dict:
    """One `trainscale run` of `framework` with `replicas` replicas on this node,
    timed from outside, by `python` (the environment the framework runs from)."""
    one = dataclasses.replace(settings, framework=framework, gpus_per_node=replicas, nodes=1)
    command = [python, "-m", "trainscale", "run", *one.to_cli_args(), "--output", output]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:  # what the run said, not only that it failed
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    with open(output) as handle:
        record = json.load(handle)
    return {
        "images_per_sec": record["images_per_sec"]["mean"],
        "block_rates": record["images_per_sec"]["samples"],
        "wall_seconds": wall,
        # The fixed cost: from the training process's start (interpreter,
        # imports, framework set-up and rendezvous, model build, tracing,
        # warm-up) to its first timed step, as the record measures it.
        "fixed_seconds": record["seconds_to_first_timed_step"],
        # What the launcher adds around it (mpirun, local workers, the record).
        "wall_outside_timed_seconds": wall - record["timed_seconds"],
        "startup_seconds": record["startup_seconds"],
        "record": {"ray": record.get("ray")},
    }


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def ratio_interval(numerator: list[float], denominator: list[float]) -> list[float]:
    """95% bootstrap interval of median(numerator) / median(denominator).

    The blocks of a 2-core VM scatter by +-15% (its neighbours come and go):
    a ratio of medians is only as sure as this interval says. Seeded, so a
    rerun on the same numbers gives the same interval.
    """
    import numpy as np

    rng = np.random.default_rng(0)
    top, bottom = np.asarray(numerator), np.asarray(denominator)
    ratios = [
        np.median(rng.choice(top, len(top))) / np.median(rng.choice(bottom, len(bottom)))
        for _ in range(2000)
    ]
    return [float(v) for v in np.percentile(ratios, [2.5, 97.5])]


def one_replica_each(settings, frameworks: tuple[str, ...], work: str) -> dict:
    """Each framework with one replica, two rounds alternating; medians over every block."""
    runs = {name: [] for name in frameworks}
    for _ in range(2):
        for name in frameworks:
            runs[name].append(run_framework(settings, name, os.path.join(work, f"{name}.json")))
            print(f"bench: {name} 1 replica: {runs[name][-1]}", file=sys.stderr, flush=True)

    def blocks(name):
        return [x for run in runs[name] for x in run["block_rates"]]

    baseline = frameworks[0]
    return {
        name: {
            "images_per_sec": median(blocks(name)),
            f"ratio_to_{baseline.replace('-', '_')}": median(blocks(name))
            / median(blocks(baseline)),
            "ratio_interval_95": ratio_interval(blocks(name), blocks(baseline)),
            "fixed_seconds": median([r["fixed_seconds"] for r in runs[name]]),
            "wall_outside_timed_seconds": median(
                [r["wall_outside_timed_seconds"] for r in runs[name]]
            ),
            "startup_seconds_in_process": median([r["startup_seconds"] for r in runs[name]]),
            "samples": runs[name],
        }
        for name in frameworks
    }


# The models compared step against step, with the steps per block that make a
# block about 2 s on a 2-core CPU (the small CNN's steps take milliseconds).
STEP_MODELS = (("small_cnn", 256), ("vgg16", 8))


def harness_against(other: str, make_steps, settings_for, rounds: int) -> dict:
    """For each of STEP_MODELS, the harness's step against another step
    (make_steps(settings) -> (harness, other)), blocks interleaved in this
    process: medians, their ratio and its 95% interval, batch 32."""
    results = {}
    for model, steps in STEP_MODELS:
        harness, theirs = make_steps(settings_for(model))
        rates = interleaved_blocks(
            {
                "harness": timed_block(harness, steps, 32 * steps),
                other: timed_block(theirs, steps, 32 * steps),
            },
            rounds,
        )
        results[model] = {
            "harness_images_per_sec": median(rates["harness"]),
            f"{other}_images_per_sec": median(rates[other]),
            "ratio": median(rates["harness"]) / median(rates[other]),
            "ratio_interval_95": ratio_interval(rates["harness"], rates[other]),
            "block_rates": rates,
        }
    return results
