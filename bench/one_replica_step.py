"""Where a one-replica run of a torch framework spends more than torch-single:
both steps built as `trainscale train` builds them, in ONE process, timed
blocks interleaved (A, B, A, B), then each step under torch.profiler.

    .venv-torch/bin/python bench/one_replica_step.py FRAMEWORK [--rounds N]

Prints one JSON object: both rates, their ratio and its interval, and the
operators whose self CPU time per step grew most from torch-single's to the
framework's (the cost's breakdown). Whole `trainscale run`s of both
(bench/torch_bench.py's one_replica) add what differs outside the step:
the launch path, the process, the machine's drift between processes.
One framework per process: torch.distributed's group can be made once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from common import median, ratio_interval, timed_block

from trainscale.catalogue.launch_kinds import free_ports
from trainscale.catalogue.options import RunOptions
from trainscale.catalogue.settings import RunSettings
from trainscale.frameworks import backend_class

BATCH = 32
STEPS_PER_BLOCK = 6


def one_replica(framework: str):
    """`framework`'s backend with world size 1, prepared as a rank of `trainscale run` is."""
    port = free_ports(1)[0]
    os.environ.update(
        RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )  # fmt: skip
    return prepared(framework)


def prepared(framework: str):
    settings = RunSettings(
        framework=framework, model="vgg16", image_size=32, batch_size=BATCH,
        dataset="synthetic", device="cpu", warmup_steps=1,
    )  # fmt: skip
    backend = backend_class(settings.framework)(settings, RunOptions())
    backend.prepare()
    return backend


def self_cpu_per_step(backend, steps: int = 4) -> dict[str, float]:
    """Milliseconds of self CPU time per step, per operator (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as trace:
        for _ in range(steps):
            loss = backend.step()
        backend.read_loss(loss)
    return {e.key: e.self_cpu_time_total / 1000 / steps for e in trace.key_averages()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("framework")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()

    single = prepared("torch-single")
    other = one_replica(args.framework) if args.framework != "torch-single" else single
    blocks = {
        "torch-single": timed_block(single.step, STEPS_PER_BLOCK, BATCH * STEPS_PER_BLOCK),
        args.framework: timed_block(other.step, STEPS_PER_BLOCK, BATCH * STEPS_PER_BLOCK),
    }
    for block in blocks.values():  # warm up, untimed
        block()
    rates: dict[str, list[float]] = {name: [] for name in blocks}
    for _ in range(args.rounds):
        for name, block in blocks.items():
            rates[name].append(block())
    theirs, mine = self_cpu_per_step(single), self_cpu_per_step(other)
    grown = sorted(
        ((name, mine.get(name, 0.0) - theirs.get(name, 0.0)) for name in set(mine) | set(theirs)),
        key=lambda item: -item[1],
    )
    print()  # the JSON on one line of its own, after whatever DeepSpeed logged
    json.dump(
        {
            "framework": args.framework,
            "images_per_sec": median(rates[args.framework]),
            "torch_single_images_per_sec": median(rates["torch-single"]),
            "ratio": median(rates[args.framework]) / median(rates["torch-single"]),
            "ratio_interval_95": ratio_interval(rates[args.framework], rates["torch-single"]),
            "step_ms": {name: 1000 * BATCH / median(r) for name, r in rates.items()},
            "profiled_ms_per_step": {
                "torch-single": sum(theirs.values()),
                args.framework: sum(mine.values()),
            },
            "grown_ms_per_step": {name: round(ms, 2) for name, ms in grown[:8]},
            "block_rates": rates,
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
