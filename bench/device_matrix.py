"""The frameworks on one device, across precision and XLA: images/sec and MFU.

    .venv-train/bin/python bench/device_matrix.py --device gpu        (on a GPU node)

By default the issue's GPU matrix: VGG-16 and ResNet-50 at 224x224, batch 64,
one GPU, `tf-single`, `horovod` and `tf-mirrored`, fp32 and fp16 (Keras mixed
precision), XLA off and on. Every cell is one `trainscale run` (the real
launch path: mpirun for Horovod), on synthetic data so the input pipeline is
not what is measured. Prints one JSON object on stdout: a row per cell with
its images/sec, MFU and the device's name, as the record gives them. A cell
that fails (e.g. out of memory) is a row with its status, not an error.

bench/run.py runs it with `--device gpu`; the options make small matrices for
a CPU (the tests run one).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time

FRAMEWORKS = ("tf-single", "horovod", "tf-mirrored")


def cell(framework: str, model: str, precision: str, xla: bool, args, folder: str) -> dict:
    """One `trainscale run` on one device; the row the record makes of it."""
    output = os.path.join(folder, f"{framework}-{model}-{precision}-xla{int(xla)}.json")
    command = [
        sys.executable, "-m", "trainscale", "run",
        "--framework", framework, "--model", model, "--device", args.device,
        "--nodes", "1", "--gpus-per-node", "1",
        "--batch-size", str(args.batch_size), "--image-size", str(args.image_size),
        "--dataset", "synthetic", "--precision", precision, "--xla" if xla else "--no-xla",
        "--warmup-steps", str(args.warmup_steps), "--blocks", str(args.blocks),
        "--steps-per-block", str(args.steps_per_block),
        "--timeout", str(args.timeout), "--attempt", "1", "--attempts", "1",
        "--output", output,
    ]  # fmt: skip
    start = time.perf_counter()
    run = subprocess.run(command, capture_output=True, text=True)
    row = {
        "framework": framework,
        "model": model,
        "precision": precision,
        "xla": xla,
        "wall_seconds": time.perf_counter() - start,
    }
    if not os.path.exists(output):
        return {**row, "status": f"no record (exit {run.returncode})", "log": run.stderr[-2000:]}
    with open(output) as handle:
        record = json.load(handle)
    rate = record.get("images_per_sec") or {}
    return {
        **row,
        "status": record["status"],
        "images_per_sec": rate.get("mean"),
        "images_per_sec_std": rate.get("std"),
        "mfu": record.get("mfu"),
        "achieved_tflops": record.get("achieved_tflops"),
        "peak_basis": record.get("peak_basis"),
        "device_name": record.get("device_name"),
        "error": (record.get("error") or "").split("\n", 1)[0] or None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="gpu", choices=["gpu", "cpu"])
    parser.add_argument("--models", nargs="+", default=["vgg16", "resnet50"])
    parser.add_argument("--frameworks", nargs="+", default=list(FRAMEWORKS))
    parser.add_argument("--precisions", nargs="+", default=["fp32", "fp16"])
    parser.add_argument("--xla", nargs="+", default=["off", "on"], choices=["off", "on"])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--warmup-steps", type=int, default=10)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--steps-per-block", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory(prefix="trainscale-matrix-") as folder:
        for model, framework, precision, xla in itertools.product(
            args.models, args.frameworks, args.precisions, args.xla
        ):
            rows.append(cell(framework, model, precision, xla == "on", args, folder))
            print(f"bench: {json.dumps(rows[-1])[:300]}", file=sys.stderr, flush=True)
    json.dump({"device": args.device, "batch_size": args.batch_size,
               "image_size": args.image_size, "rows": rows}, sys.stdout)  # fmt: skip


if __name__ == "__main__":
    main()
