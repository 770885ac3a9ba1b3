"""Helpers for the workflow tests: real Snakemake, in a fresh copy of the repository."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SNAKEMAKE = os.path.join(os.path.dirname(sys.executable), "snakemake")
# What a fresh clone has that the workflow needs (the published cache included).
WORKFLOW_FILES = [
    "Snakefile",
    "config.yaml",
    "workflow",
    "src",
    "profiles",
    "envs",
    "examples",
    "studies",
]
# The published studies' caches a clone ships (seeds 000 and 004).
CACHED_STUDIES = ["published", "seed004"]


def load_yaml(path):
    with open(path) as handle:
        return yaml.safe_load(handle)


def copy_repository(target: str, training_envs: bool = True) -> str:
    """A copy of the workflow as a fresh clone has it, sharing the training venvs
    (none with `training_envs` False: a login node's or a laptop's clone)."""
    os.makedirs(target, exist_ok=True)
    for name in WORKFLOW_FILES:
        source = os.path.join(REPO, name)
        if os.path.isdir(source):
            shutil.copytree(
                source,
                os.path.join(target, name),
                ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
            )
        else:
            shutil.copy2(source, target)
    for study in CACHED_STUDIES:
        cache = os.path.join(target, "results", study)
        shutil.copytree(os.path.join(REPO, "results", study, "runs"), os.path.join(cache, "runs"))
        shutil.copy2(os.path.join(REPO, "results", study, "config.yaml"), cache)
    for venv in (".venv-train", ".venv-torch") if training_envs else ():
        os.symlink(os.path.join(REPO, venv), os.path.join(target, venv))
    return target


def local_study(repo: str, study: dict) -> list[str]:
    """Write `study` into the repository copy; the arguments that run it locally."""
    name = f"{study['study']}.yaml"
    with open(os.path.join(repo, name), "w") as handle:
        yaml.safe_dump(study, handle)
    return ["--profile", "profiles/local", "--configfile", name]


def run_study_in_a_copy(folder: str, study: dict, timeout: float = 1200) -> str:
    """`study` run through the local profile in a fresh copy of the workflow
    under `folder`, which must succeed; its results folder."""
    repo = copy_repository(os.path.join(folder, "repo"))
    result = snakemake(repo, *local_study(repo, study), timeout=timeout)
    assert result.returncode == 0, result.stderr[-4000:]
    return os.path.join(repo, "results", study["study"])


def start_snakemake(workdir: str, *args: str, **popen) -> subprocess.Popen:
    """Snakemake running in the background (to be interrupted, or a node killed under it);
    its output as text on stdout unless `popen` says otherwise. Ctrl-C (SIGINT)
    reaches it as from a terminal (runs.sigint_as_in_a_terminal says why)."""
    from runs import sigint_as_in_a_terminal

    popen = {
        "stdout": subprocess.PIPE,
        "stderr": subprocess.STDOUT,
        "preexec_fn": sigint_as_in_a_terminal,
        **popen,
    }
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.Popen([SNAKEMAKE, *args], cwd=workdir, text=True, env=env, **popen)


def snakemake(workdir: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    # SIGINT, not SIGTERM, on timeout: Snakemake ignores SIGTERM while it waits on jobs.
    return subprocess.run(
        ["timeout", "-s", "INT", str(int(timeout)), SNAKEMAKE, *args],
        cwd=workdir,
        capture_output=True,
        text=True,
        env=env,
    )


def train_jobs(dry_run_output: str) -> int:
    return dry_run_output.count("rule train:")


@pytest.fixture()
def repo_copy(tmp_path):
    return copy_repository(str(tmp_path / "repo"))


def pytest_terminal_summary(terminalreporter):
    from runs import print_shown

    print_shown(terminalreporter)
