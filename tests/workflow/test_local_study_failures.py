"""A local study that fails, is killed or interrupted, for real: the point
recorded as failed, no half result, and a rerun that trains only what is
missing (the studies are test_local_study.py's STUDY, under other names)."""

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import copy_repository, local_study, snakemake, start_snakemake, train_jobs
from test_local_study import study_variant

from trainscale.core.records import is_record_name


@pytest.mark.slow
def test_a_point_that_keeps_failing_is_retried_then_recorded_as_failed(tmp_path):
    # Asking for a GPU on this GPU-less machine fails every time, for real.
    repo = copy_repository(str(tmp_path / "repo"))
    study = study_variant(
        "fails",
        grid={"framework": ["tf-single"], "gpus_per_node": [1]},
        benchmark={"device": "gpu", "dataset": "synthetic"},
        train_retries=1,
        constraints={},
    )
    del study["benchmark"]["data_dir"], study["benchmark"]["generate_cifar100_images"]
    args = [*local_study(repo, study), "--until", "tables"]  # what it reads
    result = snakemake(repo, *args)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "Trying to restart job" in output  # the first attempt failed and was retried
    record = json.loads(
        Path(repo, "results/fails/runs/tf-single/small_cnn/b16/n1g1r1.json").read_text()
    )
    assert record["status"] == "failed" and record["images_per_sec"] is None
    assert "GPU(s) per the job request but sees 0" in record["error"]  # the log's tail
    table = Path(repo, "results/fails/tables/table1.md").read_text()
    assert "| small_cnn | 16 | 1 | FAILED |" in table
    # Not rerun by a later run: retrying failed points is the user's call.
    again = snakemake(repo, "-n", *args)
    assert train_jobs(again.stdout + again.stderr) == 0


def _processes_of(repo: str, command: bytes) -> list[int]:
    """The `trainscale <command>` processes of this repository copy running now."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            cwd = os.readlink(f"/proc/{pid}/cwd")  # the rule's paths are relative
        except OSError:
            continue
        if b"trainscale\0" + command + b"\0" in cmdline and cwd == repo:
            found.append(int(pid))
    return found


def _descendants(pid: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            children += map(int, (task / "children").read_text().split())
    return [pid for child in children for pid in (child, *_descendants(child))]


def _training_of(repo: str) -> bool:
    """Whether a `trainscale train` process of this repository copy runs now."""
    return bool(_processes_of(repo, b"train"))


def _new_points_in_their_timed_blocks(repo: str) -> list[str]:
    """The records that `trainscale train` processes of this copy are writing,
    not written yet, whose run has logged its first timed block.

    A training that has written its record still runs for a second or two (it
    exits), and Snakemake has not yet seen its job end: interrupted then, that
    record is whole but marked incomplete.
    """
    found = []
    for pid in _processes_of(repo, b"train"):
        with contextlib.suppress(OSError, ValueError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            record = argv[argv.index("--output") + 1]
            if os.path.exists(os.path.join(repo, record)):
                continue
            # Its rule's log: runs/<point>.json logs to logs/train/<point>.log.
            log = Path(repo, record.replace("/runs/", "/logs/train/", 1)).with_suffix(".log")
            if log.exists() and re.search(r"block 1/\d+ ", log.read_text()):
                found.append(record)
    return found


def _wait_for_a_point_in_its_timed_blocks(repo: str, snakemake_run, after_a_record_in=None):
    """Until a training of this copy logs its first timed block (once a record
    is in the folder `after_a_record_in`, if given): polled, within 300 s."""
    deadline = time.monotonic() + 300
    while not (
        (after_a_record_in is None or list(after_a_record_in.rglob("n*.json")))
        and _new_points_in_their_timed_blocks(repo)
    ):
        assert snakemake_run.poll() is None, "snakemake ended before it was interrupted"
        assert time.monotonic() < deadline, "no training reached its timed blocks in 300 s"
        time.sleep(0.2)


@pytest.mark.slow
def test_a_job_killed_on_its_last_attempt_is_recorded_as_failed(tmp_path):
    # The launcher and its training killed at once (as the OOM killer of a
    # whole job, or an admin, would): the run writes nothing, Snakemake sees
    # the job fail and deletes its output; the workflow records the point.
    repo = copy_repository(str(tmp_path / "repo"))
    study = study_variant(
        "killed",
        grid={"framework": ["tf-single"], "gpus_per_node": [1], "batch_size": [16, 32]},
        benchmark={"blocks": 100, "steps_per_block": 10, "time_budget_seconds": 5},
        train_retries=0,
        constraints={},
    )
    args = [*local_study(repo, study), "--until", "tables"]  # what it reads
    snakemake_run = start_snakemake(repo, *args)
    try:
        _wait_for_a_point_in_its_timed_blocks(repo, snakemake_run)
        # The launcher first (it would record a failing training itself), then
        # the training it started.
        (launcher,) = _processes_of(repo, b"run")
        training = _descendants(launcher)
        for pid in (launcher, *training):
            os.kill(pid, signal.SIGKILL)
        output, _ = snakemake_run.communicate(timeout=600)
    finally:
        if snakemake_run.poll() is None:
            snakemake_run.kill()
    assert snakemake_run.returncode != 0, output[-4000:]  # the job failed, as Snakemake saw
    assert "1 grid point(s) failed on their last attempt" in output, output[-4000:]
    runs = Path(repo, "results", "killed", "runs", "tf-single", "small_cnn")
    records = {p.parent.name: json.loads(p.read_text()) for p in runs.rglob("n1g1r1.json")}
    assert sorted(r["status"] for r in records.values()) == ["failed", "ok"], records
    killed = next(r for r in records.values() if r["status"] == "failed")
    assert killed["error"].startswith("the job ended without writing a record")
    assert "--- tail of results/killed/logs/train/tf-single/small_cnn/" in killed["error"]
    assert killed["provenance"]["recorded_by"].startswith("the workflow on ")
    # The next run trains nothing and builds the tables from everything else.
    again = snakemake(repo, *args)
    assert again.returncode == 0, again.stderr[-4000:]
    assert train_jobs(again.stdout + again.stderr) == 0
    table = Path(repo, "results/killed/tables/table1.md").read_text()
    batch = killed["batch_size"]
    assert f"| small_cnn | {batch} | 1 | FAILED |" in table, table


def _interrupt(repo: str, args: list[str], signal_number: int, runs: Path) -> set[str]:
    """Snakemake with `args` in a session of its own (Ctrl-C reaches every
    process of the terminal's group; kill -9 of the group is the machine going
    away under it), given `signal_number` once a training of a point not yet
    recorded (and after a first record) is in its timed blocks. Then, once no
    training of the copy is left, every record is whole: the records there."""
    snakemake_run = start_snakemake(
        repo, *args, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        _wait_for_a_point_in_its_timed_blocks(repo, snakemake_run, after_a_record_in=runs)
        os.killpg(snakemake_run.pid, signal_number)
        snakemake_run.wait(timeout=120)
    finally:
        if snakemake_run.poll() is None:
            os.killpg(snakemake_run.pid, signal.SIGKILL)
    # Ctrl-C stops the job too. kill -9 of Snakemake's group need not reach a
    # Horovod rank (mpirun starts each rank in a process group of its own): it
    # may train on, an orphan, and write its record whole; wait for it as a
    # user would before rerunning.
    deadline = time.monotonic() + 120
    while _training_of(repo):
        assert signal_number == signal.SIGKILL, "Ctrl-C left a training running"
        assert time.monotonic() < deadline, "an orphaned training never ended"
        time.sleep(0.2)
    # Whatever is there is whole: every record parses; leftovers are only
    # hidden temp files, which nothing reads.
    for path in runs.parent.rglob("*.json"):
        if is_record_name(path.name):
            json.loads(path.read_text())
    return {p.name for p in runs.rglob("n*.json")}


def _missing_trainings(repo: str, args: list[str], written: set[str]) -> None:
    """A rerun would train only the missing points (and, after kill -9, the
    orphan's point: its record is whole, but Snakemake never saw the job end)."""
    dry = snakemake(repo, "-n", *args, "--rerun-incomplete")
    assert dry.returncode == 0, dry.stderr[-4000:]
    assert train_jobs(dry.stdout + dry.stderr) in (3 - len(written), 4 - len(written))


@pytest.mark.slow
def test_an_interrupted_study_leaves_no_half_result_and_resumes(tmp_path):
    """Ctrl-C inside the study's second training, then kill -9 of its rerun
    inside another: each time what is written is whole, and the next run
    trains only what is missing. One study, interrupted twice: over a
    minute for its 3 points' trainings (two of them cut short), 3 runs of
    Snakemake and its records' table (collect) once."""
    repo = copy_repository(str(tmp_path / "repo"))
    study = study_variant(
        "interrupted",
        grid={"framework": ["tf-single", "horovod"], "gpus_per_node": [1, 2]},
        # Long enough to be interrupted inside a training's timed blocks
        # (5 s of them, after its start-up), short enough that resuming
        # costs little.
        benchmark={"blocks": 200, "steps_per_block": 10, "time_budget_seconds": 5},
        # No retries: a job cancelled by Ctrl-C is not a failure to record.
        train_retries=0,
    )
    args = [*local_study(repo, study), "--until", "collect"]  # what it reads
    runs = Path(repo, "results", "interrupted", "runs")

    written = _interrupt(repo, args, signal.SIGINT, runs)
    assert 1 <= len(written) < 3
    _missing_trainings(repo, args, written)

    written = _interrupt(repo, [*args, "--rerun-incomplete"], signal.SIGKILL, runs)
    # A killed Snakemake leaves its lock: the next run says so and --unlock frees it.
    locked = snakemake(repo, *args)
    assert locked.returncode != 0 and "cannot be locked" in locked.stderr
    assert snakemake(repo, *args, "--unlock").returncode == 0
    _missing_trainings(repo, args, written)

    resumed = snakemake(repo, *args, "--rerun-incomplete")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    records = [json.loads(p.read_text()) for p in runs.rglob("n*.json")]
    assert len(records) == 3 and {r["status"] for r in records} == {"ok"}
    assert (runs.parent / "throughput.csv").exists()
