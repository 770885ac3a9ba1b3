"""Run records: one JSON file per run, written atomically, and their provenance.

No TensorFlow here: the analysis environment reads records with this module.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import platform
import re
import subprocess
import tempfile

from trainscale.core.isolation import image_label, isolation_facts

SCHEMA_VERSION = 1
# When `trainscale run` started a run's processes (time.time(), in their
# environment): rank 0's start-up is timed from it, a container's included.
LAUNCHED_AT = "TRAINSCALE_LAUNCHED_AT"
STATUSES = ("ok", "oom", "failed", "timeout")


def utc_now() -> str:
    # timezone.utc, not datetime.UTC (3.11+): the harness runs on Python 3.8 too.
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _umask() -> int:
    """This process's umask, read without changing it (os.umask would, for a moment)."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


@contextlib.contextmanager
def atomic_path(path: str):
    """Yield a temp path beside `path`; on success it replaces `path` in one rename.

    Readers see the old file or the whole new one, never half of it: the temp
    file is in the target folder (rename is atomic only within a file system)
    and keeps the suffix, so writers that pick a format by suffix still work.
    A failure or kill leaves at most a hidden temp file, never the target.
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    base, suffix = os.path.splitext(os.path.basename(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=f".tmp{suffix}", dir=folder)
    os.close(fd)
    # mkstemp makes the file private (0600); results on a shared cluster file
    # system must get the same mode as any other new file (0666 less umask).
    os.chmod(tmp, 0o666 & ~_umask())
    try:
        yield tmp
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def is_record_name(name: str) -> bool:
    """Whether a file name in a runs/ folder is a record: a JSON file, not the
    hidden temp file (`.<name>.<random>.tmp.json`) atomic_path writes first and
    a killed writer leaves behind."""
    return name.endswith(".json") and not name.startswith(".")


def record_paths(folder: str) -> list[str]:
    """Every record below `folder` (a study's runs/), sorted: the one walk the
    workflow, the study folder's checks and the tests share."""
    return sorted(
        os.path.join(where, name)
        for where, _, names in os.walk(folder)
        for name in names
        if is_record_name(name)
    )


def atomic_write_text(path: str, text: str) -> None:
    with atomic_path(path) as tmp, open(tmp, "w") as handle:
        handle.write(text)


def atomic_write_json(path: str, payload: dict) -> None:
    """Write a record atomically (see atomic_path)."""
    atomic_write_text(path, json.dumps(payload, indent=2) + "\n")


def read_record(path: str) -> dict:
    with open(path) as handle:
        record = json.load(handle)
    if record.get("schema") != SCHEMA_VERSION:
        raise ValueError(f"{path}: unknown record schema {record.get('schema')!r}")
    return record


def git_commit() -> str | None:
    """The commit of the trainscale checkout this code runs from, if any."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(
            ["git", "-C", here, "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def slurm_job() -> dict | None:
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        return None
    return {
        "job_id": job_id,
        "step_id": os.environ.get("SLURM_STEP_ID"),
        "nodelist": os.environ.get("SLURM_JOB_NODELIST"),
        "partition": os.environ.get("SLURM_JOB_PARTITION"),
    }


def host_provenance() -> dict:
    """What this process can say about its host without importing TensorFlow."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git_commit": git_commit(),
        "slurm": slurm_job(),
        # What may slow a process in a container, and the image it runs in.
        "isolation": isolation_facts(),
        "image": image_label(),
    }


def record_head(settings, status: str) -> dict:
    """The fields every record starts with: its schema, status and grid point."""
    return {
        "schema": SCHEMA_VERSION,
        "status": status,
        "framework": settings.framework,
        "nodes": settings.nodes,
        "gpus_per_node": settings.gpus_per_node,
        "replicas": settings.replicas,
        "model": settings.model,
        "dataset": settings.dataset,
        "image_size": settings.image_size,
        # Grayscale data meet a one-channel stem (trainscale.core.datasets).
        "input_channels": settings.input_channels,
        "augmentation": settings.augmentation,
        "batch_size": settings.batch_size,
        "global_batch_size": settings.global_batch_size,
        "device": settings.device,
        "settings": settings.to_dict(),
        "settings_hash": settings.settings_hash(),
    }


def outcome_record(settings, status: str, error: str, elapsed_seconds: float | None) -> dict:
    """A record for a grid point that produced no throughput: `oom`, `timeout` or `failed`.

    It carries no numbers, so nothing can mistake it for a measurement; tables
    show its status in the cell instead.
    """
    import socket

    if status not in STATUSES or status == "ok":
        raise ValueError(f"not an outcome status: {status!r}")
    return {
        **record_head(settings, status),
        "images_per_sec": None,
        "per_replica_images_per_sec": None,
        "error": error,
        "elapsed_seconds": elapsed_seconds,
        "source": "measured",
        "provenance": {
            **host_provenance(),
            "launcher_host": socket.gethostname(),
            "finished_at": utc_now(),
        },
    }


def log_tail(path: str, lines: int = 30) -> str:
    """The last `lines` lines of a log file ("" if there is none)."""
    try:
        with open(path, errors="replace") as handle:
            return "".join(handle.readlines()[-lines:])
    except OSError:
        return ""


# SLURM's own word on how a job ended, as slurmstepd writes it into the job's log:
# "slurmstepd: error: *** JOB 12 ON node1 CANCELLED AT ... DUE TO NODE FAILURE ***".
SLURM_VERDICT = re.compile(r"\*\*\* (?:JOB|STEP) .*?\*\*\*")


# The first words of the line a job prints when its node lacks the training
# environment (study.jobs.node_environment_check): the record's one-line failure.
NODE_CHECK_FAILED = "trainscale environment check (node):"


def lost_job_record(settings, log_paths: list[str], time_limit_seconds: float) -> dict:
    """The record of a job that ended on its last attempt without writing one.

    The run writes its own record for every failure it sees; this is for the
    ones it cannot: SLURM ended the job (a node failure declared before the
    ranks noticed, SLURM's own time limit, scancel), or the launcher itself was
    killed. The workflow writes it once all attempts are spent, from the
    job's logs, so that the study's tables show the point instead of waiting
    for it: `timeout` when SLURM says it ended the job at its time limit
    (`time_limit_seconds`, the job's `--time`), else `failed`, with how long
    it ran unknown.
    """
    import socket

    tails = {path: log_tail(path) for path in log_paths}
    verdicts = [m.group(0) for tail in tails.values() for m in SLURM_VERDICT.finditer(tail)]
    # The line itself, not the job's shell command quoting it (SLURM's log has both).
    missing = [
        line.strip()
        for tail in tails.values()
        for line in tail.splitlines()
        if line.strip().startswith(NODE_CHECK_FAILED)
    ]
    if missing:
        status, elapsed = "failed", None
        first_line = missing[-1].strip()
    elif verdicts and "DUE TO TIME LIMIT" in verdicts[-1]:
        status, elapsed = "timeout", time_limit_seconds
        first_line = f"SLURM ended the job at its time limit: {verdicts[-1]}"
    elif verdicts:
        status, elapsed = "failed", None
        first_line = f"SLURM ended the job: {verdicts[-1]}"
    else:
        status, elapsed = "failed", None
        first_line = "the job ended without writing a record (killed outside the harness)"
    quoted = "".join(
        f"\n--- tail of {path}:\n{tail or '(empty or missing)'}" for path, tail in tails.items()
    )
    record = outcome_record(settings, status, f"{first_line}; last attempt{quoted}", elapsed)
    record["provenance"].pop("launcher_host")
    record["provenance"]["recorded_by"] = f"the workflow on {socket.gethostname()}, after the job"
    return record
