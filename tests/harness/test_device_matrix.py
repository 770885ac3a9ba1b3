"""bench/device_matrix.py (the issue's GPU matrix) on a small CPU matrix, for real."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cpu_model() -> str:
    with open("/proc/cpuinfo") as handle:
        return next(
            line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")
        )


@pytest.mark.slow  # two `trainscale run`s, each trained end to end
def test_the_device_matrix_runs_each_cell_through_the_harness():
    command = [
        sys.executable, os.path.join(REPO, "bench", "device_matrix.py"),
        "--device", "cpu", "--models", "small_cnn", "--frameworks", "tf-single",
        "--precisions", "fp32", "--xla", "off", "on", "--batch-size", "8",
        "--image-size", "32", "--warmup-steps", "1", "--blocks", "2",
        "--steps-per-block", "2",
    ]  # fmt: skip
    # A hang bound, sized for a CPU several times slower than the fastest here.
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    matrix = json.loads(result.stdout)
    rows = matrix["rows"]
    assert [(r["framework"], r["model"], r["precision"], r["xla"]) for r in rows] == [
        ("tf-single", "small_cnn", "fp32", False),
        ("tf-single", "small_cnn", "fp32", True),
    ]
    for row in rows:
        assert row["status"] == "ok" and row["images_per_sec"] > 0, row
        assert row["device_name"] == cpu_model()
        assert row["mfu"] is None  # a CPU's peak is not in trainscale.harness.flops
