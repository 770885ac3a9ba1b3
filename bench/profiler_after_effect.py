"""Does one profiled warm-up step slow every step after it? (bench/gpu/README.md)

On an H100 and an H200 a whole `trainscale run` of torch-ddp (ResNet-50,
batch 64, bf16) measured about 0.78 of the same step timed in the GPU
check's own process, with blocks of 10 steps and of 50 alike. One thing the
run does that the check does not: its last warm-up step runs under
torch.profiler (Backend.observe_collectives, the record's
`collectives_per_step`). Kineto does not finalise CUPTI when a profile ends
unless TEARDOWN_CUPTI=1 (pytorch/pytorch#144455), which is reported to slow
later steps by 10-20 %.

Each variant runs in a process of its own: the harness's step timed in
blocks before and after one step under the profiler (or, for the control,
one plain step), so the after/before ratio is the profile's after-effect:

    python3 bench/profiler_after_effect.py --out DIR [--device cpu --tiny]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

VARIANTS = {
    "control": {},  # one plain step between the two halves
    "profiled": {},  # one step under torch.profiler, as observe_collectives runs it
    "profiled-teardown-cupti": {"TEARDOWN_CUPTI": "1"},  # the same, CUPTI finalised after
}


def measure(variant: str, args) -> dict:
    from gpu_cells import cell_settings, prepared, steps_per_block, timed_block
    from gpu_check import SIZES, Cell

    size = SIZES["tiny" if args.tiny else "gpu"]
    model = size["resnet50"]
    cell = Cell("after-effect", "a", "torch-ddp", model, size["batch"][64], "bf16")
    backend = prepared(cell_settings(cell, size, args.device))
    try:
        for _ in range(size["warmup"]):
            loss = backend.step()
        backend.read_loss(loss)
        steps = steps_per_block(backend, size["block_seconds"])

        def half() -> list[float]:
            return [timed_block(backend.step, backend.read_loss, steps, False)[0]
                    for _ in range(args.blocks)]  # fmt: skip

        before = half()
        if variant == "control":
            backend.read_loss(backend.step())
        else:
            with backend.observe_collectives():
                loss = backend.step()
            backend.read_loss(loss)
        after = half()
    finally:
        backend.close()
    middle = len(before) // 2
    ratio = sorted(after)[middle] / sorted(before)[middle]
    return {"variant": variant, "steps_per_block": steps, "before": before, "after": after,
            "after_over_before": ratio, "collectives": getattr(backend, "collectives_per_step",
                                                               None)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", choices=["gpu", "cpu"], default="gpu")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--variant", choices=list(VARIANTS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(measure(args.variant, args)), flush=True)
        return
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for variant, env in VARIANTS.items():
        command = [sys.executable, os.path.abspath(__file__), "--variant", variant,
                   "--out", args.out, "--device", args.device, "--blocks", str(args.blocks),
                   *["--tiny"] * args.tiny]  # fmt: skip
        done = subprocess.run(command, env={**os.environ, **env}, capture_output=True,
                              text=True, timeout=300)  # fmt: skip
        if done.returncode != 0:
            rows.append({"variant": variant, "error": done.stderr[-2000:]})
        else:
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps({k: v for k, v in rows[-1].items() if k not in ("before", "after")}),
              flush=True)  # fmt: skip
        with open(os.path.join(args.out, "profiler_after_effect.json"), "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
