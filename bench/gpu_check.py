"""The GPU check: trainscale's torch path on one GPU, cell by cell, each
against the plain PyTorch loop a user writes (bench/gpu/README.md).

    bash bench/gpu_check.sh                                   # on a GPU machine
    .venv-torch/bin/python bench/gpu_check.py --device cpu --tiny --out DIR   # make test

A cell is a framework, a model, a batch and a precision (CELLS, most
important first). In each, the harness's step (the backend `trainscale
train` builds) and the plain loop run on the same model, batch, precision
and synthetic data in one process, timed blocks interleaved (A, B, A, B), so
their ratio is free of the machine's drift. A cell's row: images (tokens)/sec
of both and their ratio (goal >= 0.97), MFU against the device's peak for the
arithmetic that ran (TF32 or not, trainscale.harness.flops), peak memory
(torch's allocator and NVML's, with the device's total), NVML's utilisation
and the energy per image (token) over the harness's blocks.

Each cell is written to OUT/gpu_check.json as soon as it finishes; a run
skips the cells already there (--resume FILE adds those of an earlier run
on the same device), so a run cut short by the machine's time leaves what
it measured and the next one goes on. Cells run in groups, a process each
(GROUPS): a process that crashes or hangs loses only the rest of its group.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

RESULTS = "gpu_check.json"


@dataclass(frozen=True)
class Cell:
    """One measurement: `framework` training `model` at `batch` per step."""

    name: str
    group: str  # the process it runs in (GROUPS)
    framework: str
    model: str
    batch: int
    precision: str
    options: tuple[str, ...] = ()  # more of `trainscale train`'s flags
    ladder: bool = False  # a GPT size: larger ones are skipped once one does not fit
    record: bool = False  # a whole `trainscale run` (its record's fields), not a comparison
    # False: a GPU variant whose code another cell already runs (its options
    # only), left out of --tiny, which proves on a CPU that every cell's code runs.
    on_cpu: bool = True

    @property
    def imagenet(self) -> bool:
        """Reads generated ImageNet JPEGs (the check's --data-dir), not synthetic batches."""
        return "imagenet-jpeg" in self.options


# On a GPU: ResNet-50 at 224 px, batch 64; the GPT ladder at 1,024 tokens,
# batch 8. --tiny (a CPU): the small CNN at 32 px, batch 4, and for FSDP2 and
# DeepSpeed MobileNetV2 at batch 2 ("sharded": it has batch norms, as
# ResNet-50 has, which those two treat apart under bf16); gpt-tiny and
# gpt-mini at 32 tokens, batch 2, over 256 byte tokens; LeNet-5 for VGG-16
# (the cell proves the same code as the first). A CPU without bf16
# instructions runs bf16 slowly: on a 2-core AMD EPYC (AVX2, no AVX-512),
# alone, the check took 156 s with VGG-16 (34 s) and MobileNetV2 at batch 4,
# 105 s with these; gpt-mini took 116 s of a pass with GPT-2's vocabulary.
SIZES = {
    "gpu": {"image_size": 224, "seq_len": 1024, "warmup": 10, "rounds": 5, "block_seconds": 0.5,
            "resnet50": "resnet50", "sharded": "resnet50", "vgg16": "vgg16",
            "gpt": ("gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl"),
            "batch": {64: 64, 256: 256, 8: 8}, "sharded_batch": 64,
            "loader_workers": (4, 8, 16),
            "imagenet": {"classes": 8, "per_class": 128, "imagenet_sides": True}},
    "tiny": {"image_size": 32, "seq_len": 32, "warmup": 1, "rounds": 1, "block_seconds": 0.05,
             "resnet50": "small_cnn", "sharded": "mobilenet_v2", "vgg16": "lenet5",
             "gpt": ("gpt-tiny", "gpt-mini"), "vocab": 256,
             "batch": {64: 4, 256: 8, 8: 2}, "sharded_batch": 2,
             "loader_workers": (2,),
             "imagenet": {"classes": 4, "per_class": 16, "imagenet_sides": False}},
}  # fmt: skip


def cells(tiny: bool) -> list[Cell]:
    """Every cell, in the order they run: the most important first."""
    size = SIZES["tiny" if tiny else "gpu"]
    resnet, sharded, vgg, batch = size["resnet50"], size["sharded"], size["vgg16"], size["batch"]
    b64, bs = batch[64], size["sharded_batch"]
    image = [
        # (1) torch-single, bf16 and fp32; (2) torch-ddp on the one GPU (NCCL).
        Cell(f"torch-single-{resnet}-b{b64}-bf16", "a", "torch-single", resnet, b64, "bf16"),
        Cell(f"torch-single-{resnet}-b{b64}-fp32", "a", "torch-single", resnet, b64, "fp32"),
        Cell(f"torch-ddp-{resnet}-b{b64}-bf16", "a", "torch-ddp", resnet, b64, "bf16"),
        Cell(f"torch-ddp-{resnet}-b{b64}-fp32", "a", "torch-ddp", resnet, b64, "fp32",
             on_cpu=False),
        # The same through `trainscale run`: the launcher, the record's NVML fields.
        Cell(f"record-torch-ddp-{resnet}-b{b64}-bf16", "a", "torch-ddp", resnet, b64, "bf16",
             record=True),
    ]  # fmt: skip
    # ResNet-50 on decoded JPEGs (ImageNet's tree, generated at ImageNet's
    # sides) with 4, 8 and 16 DataLoader workers, beside the synthetic record
    # above: how far the input pipeline is from the step. Blocks of 50 steps,
    # so the loader's prefetched batches do not flatter a block.
    decoded = [
        Cell(f"record-torch-ddp-{resnet}-b{b64}-bf16-imagenet-jpeg-w{workers}", "i", "torch-ddp",
             resnet, b64, "bf16", ("--dataset", "imagenet-jpeg", "--loader-workers",
                                   str(workers), "--steps-per-block", "50"), record=True)
        for workers in size["loader_workers"]
    ]  # fmt: skip
    # (3) the GPT ladder, bf16, up to the largest that fits.
    ladder = [
        Cell(f"torch-single-{gpt}-b{batch[8]}-bf16", "a", "torch-single", gpt, batch[8], "bf16",
             ladder=True)
        for gpt in size["gpt"]
    ]  # fmt: skip
    # (4) FSDP2 with one rank, in the first process.
    fsdp = [Cell(f"torch-fsdp-{sharded}-b{bs}-bf16", "a", "torch-fsdp", sharded, bs, "bf16")]
    rest = [
        # Lightning's Trainer (ddp) against the DDP loop it replaces, in a
        # process of its own (its Trainer outlives the cell's process group).
        Cell(f"lightning-{resnet}-b{b64}-bf16", "l", "lightning", resnet, b64, "bf16"),
        # (5) DeepSpeed ZeRO-0 and 3, each in a process of its own: DeepSpeed
        # keeps its process groups in module globals, which a second
        # engine's new group does not replace.
        Cell(f"deepspeed-zero0-{sharded}-b{bs}-bf16", "b", "deepspeed", sharded, bs, "bf16",
             on_cpu=False),
        Cell(f"deepspeed-zero3-{sharded}-b{bs}-bf16", "c", "deepspeed", sharded, bs, "bf16",
             ("--zero-stage", "3")),
        # (6) channels-last and torch.compile on the first cell; (7) VGG-16, batch 256.
        Cell(f"torch-single-{resnet}-b{b64}-bf16-channels-last", "d", "torch-single", resnet,
             b64, "bf16", ("--channels-last",)),
        Cell(f"torch-single-{resnet}-b{b64}-bf16-compile", "d", "torch-single", resnet, b64,
             "bf16", ("--compile",)),
        Cell(f"torch-single-{vgg}-b{b64}-bf16", "d", "torch-single", vgg, b64, "bf16"),
        Cell(f"torch-single-{resnet}-b{batch[256]}-bf16", "d", "torch-single", resnet,
             batch[256], "bf16"),
        # The whole run again in blocks of 50 steps: on the H100 the record
        # measured 0.79 of the in-process step with blocks of 10, each ending
        # in a sync and a gather; if longer blocks close the gap, that is why.
        Cell(f"record-torch-ddp-{resnet}-b{b64}-bf16-blocks-of-50", "d", "torch-ddp", resnet,
             b64, "bf16", ("--steps-per-block", "50"), record=True, on_cpu=False),
    ]  # fmt: skip
    every = image + ladder + fsdp + decoded + rest
    return [cell for cell in every if cell.on_cpu or not tiny]


# In the order they run: the decoded-input records and Lightning's after the
# first group, as important.
GROUPS = ("a", "i", "l", "b", "c", "d")


# ---------------------------------------------------------------------------
# The results file: read, written after every cell
# ---------------------------------------------------------------------------


def read_results(path: str) -> dict:
    if not os.path.exists(path):
        return {"device": None, "cells": {}}
    with open(path) as handle:
        return json.load(handle)


def write_results(path: str, results: dict) -> None:
    temporary = f"{path}.tmp"
    with open(temporary, "w") as handle:
        json.dump(results, handle, indent=1)
    os.replace(temporary, path)


def update_cell(path: str, name: str, row: dict) -> None:
    results = read_results(path)
    results["cells"][name] = row
    write_results(path, results)


def pending(all_cells: list[Cell], results: dict, args) -> list[Cell]:
    """The cells still to measure: not written yet (a failure too, unless
    --retry-failed), and among --cells where given."""
    done = results["cells"]
    chosen = [c for c in all_cells if not args.cells or c.name in args.cells]
    redo = {"running"} | ({"failed"} if args.retry_failed else set())
    return [c for c in chosen if c.name not in done or done[c.name]["status"] in redo]


# ---------------------------------------------------------------------------
# The driver: a process per group, within the time budget
# ---------------------------------------------------------------------------


def drive(args) -> int:
    path = os.path.join(args.out, RESULTS)
    os.makedirs(args.out, exist_ok=True)
    if not os.path.exists(path):
        for earlier_path in args.resume or ():  # bench/gpu/ holds one file per device
            earlier = read_results(earlier_path)
            if (earlier["device"] or {}).get("name") == device_name(args.device):
                write_results(path, earlier)
                break
    deadline = time.monotonic() + args.budget_seconds
    all_cells = cells(args.tiny)
    todo = {c.name for c in pending(all_cells, read_results(path), args)}
    for cell in all_cells:
        if cell.name not in todo and (not args.cells or cell.name in args.cells):
            print(f"gpu check: {cell.name}: already written, skipped", flush=True)
    for group in GROUPS:
        todo = [c for c in pending(all_cells, read_results(path), args) if c.group == group]
        left = deadline - time.monotonic()
        if not todo or left < args.least_cell_seconds:
            continue
        command = [sys.executable, os.path.abspath(__file__), *child_args(args, group, left)]
        try:
            child = subprocess.run(command, timeout=left, stderr=subprocess.PIPE, text=True)
            ended = f"exit {child.returncode}"
            tail = child.stderr[-2000:]
            sys.stderr.write(child.stderr)
        except subprocess.TimeoutExpired as stopped:
            ended, tail = "stopped at the check's time budget", (stopped.stderr or b"")[-2000:]
        if ended != "exit 0":
            print(f"gpu check: group {group}'s process ended ({ended})", flush=True)
        mark_interrupted(path, ended, tail if isinstance(tail, str) else tail.decode())
    results = read_results(path)
    missing = [c.name for c in all_cells if c.name not in results["cells"]]
    print(f"gpu check: {len(results['cells'])} cells in {path}; not run: {missing or 'none'}")
    return 0


def device_name(device: str) -> str:
    """The device's name as the cells record it, without starting CUDA here:
    NVML's name of GPU 0 (torch.cuda.get_device_name's), or the CPU model."""
    if device == "gpu":
        import pynvml

        pynvml.nvmlInit()
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        return name.decode() if isinstance(name, bytes) else name
    with open("/proc/cpuinfo") as handle:
        names = [line.split(":", 1)[1].strip() for line in handle if "model name" in line]
    return names[0] if names else "unknown CPU"


def child_args(args, group: str, seconds_left: float) -> list[str]:
    forwarded = ["--out", args.out, "--device", args.device, "--group", group]
    forwarded += ["--data-dir", args.data_dir]
    forwarded += ["--budget-seconds", str(seconds_left)]
    forwarded += ["--tiny"] * args.tiny + ["--retry-failed"] * args.retry_failed
    return forwarded + (["--cells", *args.cells] if args.cells else [])


def mark_interrupted(path: str, ended: str, stderr_tail: str) -> None:
    """A cell its process never finished is a failure, with what the process said."""
    results = read_results(path)
    for name, row in results["cells"].items():
        if row["status"] == "running":
            row.update(status="failed", error=f"the process ended ({ended}) in this cell",
                       stderr_tail=stderr_tail)  # fmt: skip
            print(f"gpu check: {name}: failed ({ended})", flush=True)
    write_results(path, results)


# ---------------------------------------------------------------------------
# A group's process
# ---------------------------------------------------------------------------


def run_group(args) -> None:
    from gpu_cells import measure_cell, release, this_device

    path = os.path.join(args.out, RESULTS)
    deadline = time.monotonic() + args.budget_seconds
    results = read_results(path)
    device = this_device(args.device)
    if results["device"] and results["device"]["name"] != device["name"]:
        raise SystemExit(f"{path} holds another device's cells ({results['device']['name']})")
    results["device"] = device
    write_results(path, results)
    too_big = False
    for cell in pending(cells(args.tiny), results, args):
        if cell.group != args.group:
            continue
        if deadline - time.monotonic() < args.least_cell_seconds:
            break
        if cell.ladder and too_big:
            update_cell(
                path, cell.name, {"status": "skipped", "error": "a smaller GPT did not fit"}
            )
            continue
        update_cell(path, cell.name, {"status": "running"})
        started = time.monotonic()
        row = measure_cell(cell, SIZES["tiny" if args.tiny else "gpu"], args)
        row["cell_seconds"] = time.monotonic() - started
        row["cell"] = dataclasses.asdict(cell)
        update_cell(path, cell.name, row)
        too_big = too_big or (cell.ladder and row["status"] == "oom")
        print(f"gpu check: {cell.name}: {summary_line(row)}", flush=True)
        gc.collect()
        release()


def summary_line(row: dict) -> str:
    if row["status"] != "ok":
        return f"{row['status']}: {row.get('error')}"
    unit = "tokens" if row.get("tokens_per_sec") else "images"
    rate = row.get("tokens_per_sec") or row["images_per_sec"]
    if isinstance(rate, dict):  # a whole run's record: mean and std over its blocks
        rate = rate["mean"]
    ratio = row.get("harness_over_plain")
    mfu = row.get("mfu")
    return (
        f"{rate:.1f} {unit}/s"
        + (f", harness/plain {ratio:.3f}" if ratio else "")
        + (f", MFU {mfu:.3f}" if mfu else "")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, help="folder for gpu_check.json")
    parser.add_argument("--device", choices=["gpu", "cpu"], default="gpu")
    parser.add_argument("--tiny", action="store_true", help="the CPU sizes (make test)")
    parser.add_argument("--cells", nargs="+", help="only these cells (by name)")
    parser.add_argument(
        "--resume",
        nargs="+",
        help="earlier runs' results (one file per device): the cells of this device's are skipped",
    )
    parser.add_argument("--retry-failed", action="store_true", help="measure failed cells again")
    parser.add_argument(
        "--budget-seconds",
        type=float,
        default=480.0,
        help="stop starting cells after this long (default: 8 minutes)",
    )
    parser.add_argument(
        "--least-cell-seconds",
        type=float,
        default=15.0,
        help="no cell starts with less time than this left",
    )
    parser.add_argument(
        "--data-dir",
        default=os.path.join(tempfile.gettempdir(), "trainscale-gpu-check-imagenet"),
        help="where the decoded-input cells' ImageNet JPEGs are generated (if not there yet)",
    )
    parser.add_argument("--group", choices=GROUPS, help=argparse.SUPPRESS)
    args = parser.parse_args()  # fmt: skip
    if args.group:
        run_group(args)
        return
    sys.exit(drive(args))


if __name__ == "__main__":
    main()
