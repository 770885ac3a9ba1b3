"""The GPU check (bench/gpu_check.py) on the CPU at its tiny sizes, so that it
cannot rot between the loans of a GPU: every cell, in order, the harness's
step against the plain loop of its framework for real (gloo in a world of
one where the GPU's is NCCL), and a second run that skips what the first
wrote.

It is also the suite's one run of torch.compile and channels-last (cell 6).
"""

import json
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "bench")
sys.path.insert(0, BENCH)
from gpu_check import cells, device_name  # noqa: E402

pytestmark = pytest.mark.slow


def run_check(out, data_dir, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, os.path.join(BENCH, "gpu_check.py"), "--device", "cpu", "--tiny"]
    command += ["--data-dir", str(data_dir)]
    return subprocess.run(
        [*command, "--out", str(out), *extra], capture_output=True, text=True, timeout=1200
    )


def test_every_cell_runs_on_the_cpu_and_a_second_run_skips_what_the_first_wrote(tmp_path):
    """Over a minute: 14 cells in 5 processes, two whole `trainscale run`s
    (one on generated JPEGs), a DeepSpeed MobileNetV2 cell and
    torch.compile's first compilation on this machine. The GPU's variants
    that run no code of their own (Cell.on_cpu) are left out.
    bf16 is the GPU's arithmetic, so the cells run it here too: with every
    cell, the check alone took 105 s on a 2-core AMD EPYC (AVX2, no bf16
    instructions), its two DeepSpeed cells 44 s of them; beside the rest of
    the suite, about three times that."""
    names = [cell.name for cell in cells(tiny=True)]
    first = run_check(tmp_path, tmp_path / "imagenet")
    assert first.returncode == 0, first.stderr[-4000:]
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    assert list(results["cells"]) == names  # every cell, in the order they ran
    # A second run (the GPU machine's next loan, writing to another folder)
    # goes on from the first's file, same device: nothing is measured again.
    earlier = str(tmp_path / "gpu_check.json")
    again = run_check(tmp_path / "next", tmp_path / "imagenet", "--resume", earlier)
    assert again.returncode == 0, again.stderr[-4000:]
    for name in names:
        assert f"gpu check: {name}: already written, skipped" in again.stdout
    assert json.loads((tmp_path / "next" / "gpu_check.json").read_text()) == results
    device = results["device"]
    assert device["name"] == device_name("cpu") and device["torch"].startswith("2.13.0")

    rows = results["cells"]
    for name, row in rows.items():
        assert row["status"] == "ok", (name, row.get("error"), row.get("stderr_tail"))
        if row["cell"]["record"]:
            continue
        rate = (
            row["tokens_per_sec"]
            if row["cell"]["model"].startswith("gpt")
            else row["images_per_sec"]
        )
        assert rate > 0 and row["plain_loop_per_sec"] > 0, name
        harness, plain = row["block_rates"]["harness"], row["block_rates"]["plain"]
        assert len(harness) == len(plain) == row["blocks_each"] >= 1
        assert row["harness_over_plain"] == pytest.approx(
            sorted(harness)[len(harness) // 2] / sorted(plain)[len(plain) // 2]
        )
        # A CPU has no entry in the peak table, and NVML nothing to sample.
        assert row["mfu"] is None and row["peak_basis"].startswith("unknown")
        assert row["peak_memory_bytes"] > 0 and row["device_memory_bytes"] > 0
        assert row["utilisation_percent"] is None and row["energy_joules"] is None
    # The GPT ladder: a rate in tokens; the bf16 cells' MFU basis is bf16's.
    ladder = [row for row in rows.values() if row["cell"]["ladder"]]
    assert [row["cell"]["model"] for row in ladder] == ["gpt-tiny", "gpt-mini"]
    assert all(row["images_per_sec"] is None and row["peak_precision"] == "bf16" for row in ladder)
    # A CPU's float32 is float32 (a GPU's may count as TF32: bench/gpu/README.md).
    fp32 = [row for row in rows.values() if row["cell"]["precision"] == "fp32"]
    assert fp32 and all(row["peak_precision"] == "fp32" for row in fp32)
    # The whole run through `trainscale run`, in blocks of 2 steps and of 50,
    # on synthetic batches and on decoded JPEGs: its record's fields.
    short, decoded = [row for row in rows.values() if row["cell"]["record"]]
    assert "--steps-per-block 2 " in short["command"]
    assert "--steps-per-block 50 " in decoded["command"]
    assert "--dataset imagenet-jpeg " in decoded["command"]
    assert f"--data-dir {tmp_path / 'imagenet'} " in decoded["command"]
    assert "--loader-workers 2 " in decoded["command"]
    # The pipeline's own rate, and whether it kept up (a 2-core CPU's step is
    # slow beside its decoding: not input-bound at these sizes, but either
    # answer is a real one; the field must be a verdict, not absent).
    assert decoded["input_pipeline_images_per_sec"] > 0
    assert decoded["input_bound"] in (True, False)
    assert short["input_pipeline_images_per_sec"] is None and short["input_bound"] is None
    for record in (short, decoded):
        assert record["images_per_sec"]["mean"] > 0
        assert "--framework torch-ddp" in record["command"]
        assert record["gpu_monitor_note"] == "CPU run: no GPU to sample"
        assert record["energy_per_image_joules"] is None
