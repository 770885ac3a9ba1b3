"""A fault's declaration and what a timeline says it cost (trainscale.core.faults),
on timelines written here; tests/torch/test_elastic.py writes real ones."""

import pytest

from trainscale.catalogue.settings import RunSettings, SettingsError, validate
from trainscale.core.faults import Fault, parse_fault, recovery_summary


def test_a_fault_is_parsed_from_its_one_line_form():
    assert parse_fault("none") is None
    assert parse_fault("kill-rank1-step40") == Fault("kill", "rank", 1, 40, None)
    assert parse_fault("stop-node0-at2.5s-for10s") == Fault("stop", "node", 0, None, 2.5, 10.0)
    for wrong in ("kill-rank1", "stop-rank1-step4", "kill-rank1-step4-for2s", "crash-rank1-step4"):
        with pytest.raises(ValueError):
            parse_fault(wrong)


def test_a_fault_outside_the_run_is_refused_naming_the_flag():
    base = dict(framework="torch-ddp", gpus_per_node=2, dataset="synthetic", device="cpu")
    validate(RunSettings(**base, fault="kill-rank1-step4"), check_data=False)
    with pytest.raises(SettingsError, match="--fault kill-rank2-step4: the run has ranks 0 to 1"):
        validate(RunSettings(**base, fault="kill-rank2-step4"), check_data=False)
    with pytest.raises(SettingsError, match="--fault"):
        validate(RunSettings(**base, fault="kill-everything"), check_data=False)


def event(name, time, **fields):
    return {"event": name, "time": time, "process": 0, **fields}


def test_recovery_goodput_and_work_lost_from_a_timeline():
    events = [
        event("timed_start", 10.0, step=0, world_size=2),
        event("block_done", 11.0, block=0, step=5, images=80, seconds=1.0, world_size=2),
        event("checkpoint", 11.1, step=5, seconds=0.1),
        event("fault_injected", 11.5, step=7, world_size=2),
        event("detected", 11.6, how="RuntimeError: lost peer"),
        event("start", 13.0, world_size=1),
        event("restored", 14.0, step=5, world_size=1),
        event("timed_start", 14.0, step=5, world_size=1),
        event("resumed", 14.5, step=6, world_size=1),
        event("block_done", 16.0, block=1, step=10, images=40, seconds=2.0, world_size=1),
    ]
    summary = recovery_summary(events)
    assert summary["detection_seconds"] == pytest.approx(0.1)
    assert summary["detected_by"] == "RuntimeError: lost peer"
    assert summary["restart_seconds"] == pytest.approx(1.5)
    assert summary["recovery_seconds"] == pytest.approx(3.0)
    assert summary["steps_redone"] == 2
    assert (summary["world_size_before"], summary["world_size_after"]) == (2, 1)
    # 120 images that count, over 6 s from the first timed step to the last block.
    assert summary["goodput_images_per_sec"] == pytest.approx(20.0)
    assert [w["world_size"] for w in summary["world_sizes"]] == [2, 1]
    assert summary["checkpoint_seconds"] == pytest.approx(0.1)


def test_a_block_trained_twice_counts_once():
    events = [
        event("timed_start", 0.0, step=0, world_size=2),
        event("block_done", 1.0, block=0, step=5, images=80, seconds=1.0, world_size=2),
        event("block_done", 2.0, block=1, step=10, images=80, seconds=1.0, world_size=2),
        event("fault_injected", 2.5, step=12, world_size=2),
        event("start", 3.0, world_size=2),
        event("restored", 4.0, step=0, world_size=2),
        event("timed_start", 4.0, step=0, world_size=2),
        event("block_done", 5.0, block=0, step=5, images=80, seconds=1.0, world_size=2),
        event("block_done", 6.0, block=1, step=10, images=80, seconds=1.0, world_size=2),
    ]
    summary = recovery_summary(events)
    assert summary["images_counted"] == 160 and summary["images_trained"] == 320
    assert summary["steps_redone"] == 12
    assert summary["goodput_images_per_sec"] == pytest.approx(160 / 6)
    assert summary["recovery_seconds"] is None  # no step completed after was noted


@pytest.mark.slow
def test_the_fault_demo_measures_recovery_and_prices_failures(tmp_path):
    """profiles/local/faults.yaml through local Snakemake, for real: torch-elastic
    survives a lost rank and a lost node; torch-ddp fails, and the workflow's
    retry starts it over. The suite's one run of each of these faults: the
    records are checked here (tests/torch/test_elastic.py has the faults
    this study does not inject). About a minute: 6 attempts of 2 ranks, and
    the restarts' rendezvous (a 5 s last call each)."""
    import math
    import os

    import pandas as pd
    from conftest import copy_repository, snakemake

    repo = copy_repository(str(tmp_path / "repo"))
    args = ["--profile", "profiles/local", "--configfile", "profiles/local/faults.yaml"]
    result = snakemake(repo, *args, "--until", "recovery", timeout=1500)  # what it reads
    assert result.returncode == 0, result.stderr[-4000:]
    folder = os.path.join(repo, "results", "faults-demo")
    rows = pd.read_csv(os.path.join(folder, "tables", "recovery.csv"))
    print(rows.drop(columns="record").to_string())
    got = {(r.framework, r.fault): r for r in rows.itertuples()}
    assert len(got) == len(rows) == 5
    rank = got["torch-elastic", "kill-rank1-step12"]
    node = got["torch-elastic", "kill-node1-step12"]
    ddp = got["torch-ddp", "kill-rank1-step12"]
    assert rank.steps_redone == node.steps_redone == 2 and ddp.steps_redone == 12
    assert (rank.world, node.world, ddp.world) == ("2", "2 → 1", "2")
    for row in (rank, node, ddp):
        assert 0 < row.detection_seconds < row.restart_seconds < row.recovery_seconds
        assert row.goodput_of_no_fault < 1
    assert got["torch-ddp", "none"].goodput_of_no_fault == 1
    goodput = pd.read_csv(os.path.join(folder, "tables", "goodput.csv"))
    assert len(goodput) == 3 * 3  # each faulted run at each failure rate
    for row in goodput.itertuples():
        if row.framework == "torch-ddp":  # starts over: a 1 h job's expected time
            work = 3600
            expected = work / ((row.mtbf_minutes * 60 + row.recovery_cost_seconds)
                               * math.expm1(work / (row.mtbf_minutes * 60)))  # fmt: skip
            assert row.goodput_fraction == pytest.approx(expected)
            assert math.isnan(row.young_interval_seconds)
        else:
            young = math.sqrt(2 * row.checkpoint_seconds * row.mtbf_minutes * 60)
            assert row.young_interval_seconds == pytest.approx(young)
        assert 0 <= row.goodput_fraction <= 1
    for ext in ("png", "pdf"):
        assert os.path.getsize(os.path.join(folder, "figures", f"recovery_timeline.{ext}")) > 0
    records = {key: _record(repo, row.record) for key, row in got.items()}
    _check_the_records(records, result.stdout + result.stderr)


# 6 blocks of 5 steps of 8 images on each of 2 ranks; the fault comes before
# step 12, inside the third block, 2 steps after the second block's checkpoint.
IMAGES = 6 * 5 * 8 * 2


def _record(repo: str, path: str) -> dict:
    import json
    import os

    with open(os.path.join(repo, path)) as handle:
        return json.load(handle)


def _check_the_records(records: dict, output: str) -> None:
    clean = records["torch-elastic", "none"]
    rank = records["torch-elastic", "kill-rank1-step12"]
    recovery = rank["recovery"]
    assert recovery["fault_injected"] and recovery["fault_step"] == 12
    assert recovery["world_size_before"] == recovery["world_size_after"] == 2
    # The same state restored (weights, Adam's moments, every rank's dropout
    # generator) and the batches skipped: the same training, to the bit.
    assert rank["final_loss"] == clean["final_loss"]
    assert recovery["images_counted"] == clean["recovery"]["images_counted"] == IMAGES
    assert not clean["recovery"]["fault_injected"]
    assert recovery["goodput_images_per_sec"] < clean["recovery"]["goodput_images_per_sec"]
    # The timeline figure's points: block 2 was cut short, so after the
    # restart blocks 2 to 5 follow blocks 0 and 1.
    assert [point["block"] for point in rank["timeline"]] == [0, 1, 2, 3, 4, 5]
    # A lost node: the world it ended with, and blocks after the loss train
    # half the images (2 blocks at 2 ranks, 4 at 1).
    node = records["torch-elastic", "kill-node1-step12"]
    assert [w["world_size"] for w in node["recovery"]["world_sizes"]] == [2, 1]
    assert node["replicas"] == node["processes"] == 1
    assert node["recovery"]["images_counted"] == (2 * 2 + 4 * 1) * 5 * 8
    # torch-ddp's first attempt failed with no record; the fault fired once,
    # so the retry ran whole, from step 0.
    assert "Trying to restart job" in output
    ddp = records["torch-ddp", "kill-rank1-step12"]["recovery"]
    assert ddp["steps_redone"] == 12 and ddp["checkpoints"] == 0
    assert ddp["images_trained"] == IMAGES + 2 * 5 * 8 * 2  # blocks 0 and 1 twice
