"""Out of memory, the watchdog, and a rank that dies: outcomes, never hangs, never numbers."""

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TRAINSCALE, load_json, trainscale

from trainscale.launch import OOM_SIGNS

pytestmark = pytest.mark.slow

BIG = [
    "--model",
    "vgg16",
    "--image-size",
    "224",
    "--batch-size",
    "64",
    "--dataset",
    "synthetic",
    "--device",
    "cpu",
    "--warmup-steps",
    "1",
    "--iterations",
    "1",
    "--steps-per-iteration",
    "1",
]


def run_capped(args, address_space_mb, timeout=300):
    """`trainscale run` under a memory cap on its own processes (RLIMIT_AS), never the machine."""
    limit = address_space_mb * 1024 * 1024

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "1"}
    return subprocess.run(
        [sys.executable, "-m", "trainscale", "run", *args],
        preexec_fn=cap,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


@pytest.mark.parametrize(
    ("framework", "replicas", "cap_mb"),
    [
        # TensorFlow's oneDNN kernel reports RESOURCE_EXHAUSTED, then the process crashes.
        ("tf-single", 1, 4000),
        # Both Horovod ranks run out (where depends on the allocator's order).
        ("horovod", 2, 3000),
    ],
)
def test_out_of_memory_is_a_recorded_outcome(tmp_path, framework, replicas, cap_mb):
    output = tmp_path / "r.json"
    result = run_capped(
        ["--framework", framework, "--gpus-per-node", str(replicas), *BIG, "--output", str(output)],
        cap_mb,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    record = load_json(output)
    assert record["status"] == "oom"
    # Where memory runs out first varies (input batch, weights, activations);
    # the record keeps the first line that said so, whichever it was.
    assert any(s in record["error"] for s in OOM_SIGNS) and "\n" not in record["error"]
    assert record["images_per_sec"] is None  # no number for what was not measured
    assert record["elapsed_seconds"] > 0
    assert "OOM after" in result.stdout


# Horovod on 2 CPU ranks training (nearly) forever: only a stop ends it.
ENDLESS_HOROVOD = [
    "--framework", "horovod", "--gpus-per-node", "2", "--model", "small_cnn",
    "--image-size", "32", "--dataset", "synthetic", "--device", "cpu",
    "--iterations", "100000",
]  # fmt: skip


def test_the_watchdog_ends_a_run_and_records_a_timeout(tmp_path):
    output = tmp_path / "r.json"
    start = time.monotonic()
    result = trainscale(
        "run", *ENDLESS_HOROVOD, "--timeout", "20", "--output", str(output), timeout=120
    )
    wall = time.monotonic() - start
    assert result.returncode == 0, result.stderr[-3000:]
    record = load_json(output)
    assert record["status"] == "timeout" and record["images_per_sec"] is None
    assert 20 <= record["elapsed_seconds"] <= 35  # the limit plus the grace to stop
    assert wall < 45
    assert "block 1/100000" in result.stderr  # it was training when it was stopped


def test_a_killed_rank_ends_the_run_quickly_and_leaves_no_record(tmp_path):
    output = tmp_path / "r.json"
    run = subprocess.Popen(
        [*TRAINSCALE, "run", *ENDLESS_HOROVOD, "--output", str(output)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    # Wait until training runs, then kill rank 1 (the process whose
    # OMPI_COMM_WORLD_RANK is 1) as a crash or a lost node would.
    victim = None
    deadline = time.monotonic() + 90
    while victim is None and time.monotonic() < deadline:
        time.sleep(1)
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes()
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"OMPI_COMM_WORLD_RANK=1\0" in environ and str(output).encode() in cmdline:
                victim = int(pid)
        if victim and not os.path.exists(f"/proc/{victim}"):
            victim = None
    assert victim, "rank 1 never started"
    time.sleep(8)  # into the timed blocks
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    _, stderr = run.communicate(timeout=60)
    assert run.returncode != 0
    assert time.monotonic() - killed_at < 30  # no rank left spinning in a collective
    assert not output.exists()
    assert "exited with" in stderr


def test_concurrent_runs_on_one_machine_do_not_collide(tmp_path, cifar_dir):
    # Two MultiWorker and two Horovod runs of the same study at once, as the
    # local executor or SLURM packing small jobs on a node would start them:
    # no port, temp file or record may be shared.
    runs = []
    for i, framework in enumerate(["tf-multiworker", "tf-multiworker", "horovod", "horovod"]):
        output = tmp_path / f"{framework}-{i}.json"
        args = [
            "--framework",
            framework,
            "--gpus-per-node",
            "2",
            "--model",
            "small_cnn",
            "--image-size",
            "32",
            "--batch-size",
            "8",
            "--dataset",
            "cifar100",
            "--data-dir",
            cifar_dir,
            "--device",
            "cpu",
            "--warmup-steps",
            "1",
            "--iterations",
            "2",
            "--steps-per-iteration",
            "2",
            "--timeout",
            "240",
            "--output",
            str(output),
        ]
        runs.append(
            (
                output,
                subprocess.Popen(
                    [sys.executable, "-m", "trainscale", "run", *args],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
                ),
            )
        )
    for output, proc in runs:
        _, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-3000:]
        record = load_json(output)
        assert record["status"] == "ok" and record["replicas"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(o.name for o, _ in runs)
