"""The record file: written whole or not at all, its schema checked, and a job
lost without a record recorded from its logs."""

import json
import os

import pytest

from trainscale.core.records import SCHEMA_VERSION, atomic_write_json, read_record


def test_atomic_write_replaces_whole_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "runs" / "r.json"
    atomic_write_json(str(path), {"schema": SCHEMA_VERSION, "value": 1})
    atomic_write_json(str(path), {"schema": SCHEMA_VERSION, "value": 2})
    assert read_record(str(path))["value"] == 2
    assert os.listdir(path.parent) == ["r.json"]


def test_failed_write_keeps_the_old_record(tmp_path):
    path = tmp_path / "r.json"
    atomic_write_json(str(path), {"schema": SCHEMA_VERSION, "value": 1})
    with pytest.raises(TypeError):
        atomic_write_json(str(path), {"schema": SCHEMA_VERSION, "value": object()})
    assert json.loads(path.read_text())["value"] == 1
    assert os.listdir(tmp_path) == ["r.json"]


def test_unknown_schema_is_refused(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"schema": 99}))
    with pytest.raises(ValueError, match="unknown record schema 99"):
        read_record(str(path))


def test_atomic_writes_get_the_mode_of_any_new_file(tmp_path):
    # mkstemp's private 0600 would hide results from colleagues on a shared cluster.
    path = tmp_path / "r.json"
    old = os.umask(0o027)
    try:
        atomic_write_json(str(path), {"schema": SCHEMA_VERSION})
    finally:
        os.umask(old)
    assert oct(path.stat().st_mode & 0o777) == oct(0o640)


# What slurmstepd writes into a job's log when SLURM ends the job (seen on the lab).
NODE_FAILURE = (
    "slurmstepd: error: *** JOB 12 ON node1 CANCELLED AT 2026-11-22T03:50:01 "
    "DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***\n"
)
TIME_LIMIT = (
    "slurmstepd: error: *** JOB 13 ON node1 CANCELLED AT 2026-11-22T04:10:00 "
    "DUE TO TIME LIMIT ***\n"
)


@pytest.mark.parametrize(
    "slurm_log, status, first_line",
    [
        (NODE_FAILURE, "failed", "SLURM ended the job: *** JOB 12 ON node1 CANCELLED AT"),
        (TIME_LIMIT, "timeout", "SLURM ended the job at its time limit: *** JOB 13"),
        (None, "failed", "the job ended without writing a record"),
    ],
    ids=["node-failure", "time-limit", "killed"],
)
def test_a_job_lost_without_a_record_is_recorded_from_its_logs(
    tmp_path, slurm_log, status, first_line
):
    from trainscale.catalogue.settings import RunSettings
    from trainscale.core.records import lost_job_record

    settings = RunSettings(framework="horovod", nodes=2, batch_size=16, model="small_cnn")
    run_log = tmp_path / "n2g1r1.log"
    run_log.write_text("[trainscale] horovod small_cnn 2 replica(s): block 3/150\n")
    logs = [str(run_log)]
    if slurm_log:
        (tmp_path / "12.log").write_text("srun: error: Node failure on node2\n" + slurm_log)
        logs.append(str(tmp_path / "12.log"))
    record = lost_job_record(settings, logs, time_limit_seconds=1800)
    assert record["status"] == status and record["images_per_sec"] is None
    assert record["error"].startswith(first_line), record["error"]
    assert "block 3/150" in record["error"]  # the run's log tail is quoted
    assert record["elapsed_seconds"] == (1800 if status == "timeout" else None)
    # A record of its grid point like any other (collect checks these fields).
    assert (record["framework"], record["nodes"], record["batch_size"]) == ("horovod", 2, 16)
    atomic_write_json(str(tmp_path / "r.json"), record)
    assert read_record(str(tmp_path / "r.json"))["settings_hash"] == settings.settings_hash()
