"""A torch rank that dies, and the watchdog: outcomes as for TensorFlow, never hangs."""

import pytest
from runs import (
    assert_a_killed_rank_ends_the_run,
    load_json,
    one_per_launch_kind,
    trainscale,
    watchdog_limit,
)

from trainscale.study.registry import framework_spec

pytestmark = pytest.mark.slow

# 2 CPU ranks training (nearly) forever: only a stop ends them.
ENDLESS = [
    "--gpus-per-node", "2", "--model", "small_cnn", "--image-size", "32",
    "--dataset", "synthetic", "--device", "cpu", "--blocks", "100000",
]  # fmt: skip
FIRST_BLOCK = "block 1/100000"


# One framework of ranks per launch kind: the launcher ends the others. An
# elastic framework survives a lost rank instead (tests/torch/test_elastic.py).
RANKS = [
    f
    for f in one_per_launch_kind("torch")
    if not framework_spec(f).one_device and not framework_spec(f).elastic
]


@pytest.mark.parametrize("framework", RANKS)
def test_a_killed_rank_ends_the_run_quickly_and_leaves_no_record(tmp_path, framework):
    run_args = ["--framework", framework, *ENDLESS]
    assert_a_killed_rank_ends_the_run(run_args, tmp_path / "r.json", FIRST_BLOCK)


def test_the_watchdog_ends_a_ddp_run_and_records_a_timeout(tmp_path):
    limit = watchdog_limit(
        ["--framework", "torch-ddp", *ENDLESS], tmp_path / "startup.json", FIRST_BLOCK
    )
    output = tmp_path / "r.json"
    result = trainscale(
        "run", "--framework", "torch-ddp", *ENDLESS, "--timeout", str(limit),
        "--output", str(output), timeout=limit + 300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    record = load_json(output)
    assert record["status"] == "timeout" and record["images_per_sec"] is None
    assert limit <= record["elapsed_seconds"] <= limit + 15
    assert FIRST_BLOCK in result.stderr  # it was training when it was stopped
