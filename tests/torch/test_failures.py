"""A torch rank that dies, and the watchdog: outcomes as for TensorFlow, never hangs."""

import time

import pytest
from runs import (
    assert_a_killed_rank_ends_the_run,
    load_json,
    one_per_launch_kind,
    start_run,
    trainscale,
)

from trainscale.registry import framework_spec

pytestmark = pytest.mark.slow

# 2 CPU ranks training (nearly) forever: only a stop ends them.
ENDLESS = [
    "--gpus-per-node", "2", "--model", "small_cnn", "--image-size", "32",
    "--dataset", "synthetic", "--device", "cpu", "--iterations", "100000",
]  # fmt: skip
FIRST_BLOCK = "block 1/100000"


# One framework of ranks per launch kind: the launcher ends the others.
RANKS = [f for f in one_per_launch_kind("torch") if not framework_spec(f).one_device]


@pytest.mark.parametrize("framework", RANKS)
def test_a_killed_rank_ends_the_run_quickly_and_leaves_no_record(tmp_path, framework):
    run_args = ["--framework", framework, *ENDLESS]
    assert_a_killed_rank_ends_the_run(run_args, tmp_path / "r.json", FIRST_BLOCK)


def test_the_watchdog_ends_a_ddp_run_and_records_a_timeout(tmp_path):
    # The limit must fall inside training whatever this CPU's speed: measured
    # from this machine's start-up, as tests/harness/test_failures.py does.
    output = tmp_path / "startup.json"
    start = time.monotonic()
    run, printed = start_run("--framework", "torch-ddp", *ENDLESS, "--output", str(output))
    try:
        printed.wait_for(FIRST_BLOCK)
        startup = time.monotonic() - start
    finally:
        run.terminate()
        run.wait(timeout=60)
    limit = round(max(20, 2 * startup + 10))
    output = tmp_path / "r.json"
    result = trainscale(
        "run", "--framework", "torch-ddp", *ENDLESS, "--timeout", str(limit),
        "--output", str(output), timeout=limit + 300,
    )  # fmt: skip
    print(f"start-up to the first block {startup:.1f} s; watchdog {limit} s")
    assert result.returncode == 0, result.stderr[-3000:]
    record = load_json(output)
    assert record["status"] == "timeout" and record["images_per_sec"] is None
    assert limit <= record["elapsed_seconds"] <= limit + 15
    assert FIRST_BLOCK in result.stderr  # it was training when it was stopped
