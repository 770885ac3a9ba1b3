"""Run records: one JSON file per run, written atomically, and their provenance.

No TensorFlow here: the analysis environment reads records with this module.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import tempfile

SCHEMA_VERSION = 1
STATUSES = ("ok", "oom", "failed", "timeout")


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def atomic_write_json(path: str, payload: dict) -> None:
    """Write `payload` to `path` so that readers see the old file or the whole new one.

    The temp file lives in the target folder (rename is only atomic within a
    file system) and is fsynced before the rename, so a crash or kill never
    leaves a half-written record that would later parse as a result.
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=folder)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(payload, handle, indent=2, sort_keys=False)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


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
    }
