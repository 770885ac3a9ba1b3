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


def run_study_in_a_copy(
    run_store, study: dict, until: tuple[str, ...], timeout: float = 1200
) -> str:
    """`study` run through the local profile in a fresh copy of the workflow
    up to the rules `until` (the analyses its tests read: the local study
    runs every rule), once for the pytest run (its tests on either
    pytest-xdist worker read it), which must succeed; its results folder."""

    def run(folder: str) -> dict:
        repo = copy_repository(os.path.join(folder, "repo"))
        args = [*local_study(repo, study), "--until", *until]
        result = snakemake(repo, *args, timeout=timeout)
        assert result.returncode == 0, result.stderr[-4000:]
        return {"results": os.path.join(repo, "results", study["study"])}

    return run_store.once(f"study-{study['study']}", run)["results"]


def start_snakemake(workdir: str, *args: str, **popen) -> subprocess.Popen:
    """Snakemake running in the background (to be interrupted, or a node killed under it);
    its output as text on stdout unless `popen` says otherwise. Ctrl-C (SIGINT)
    reaches it as from a terminal (run_processes.sigint_as_in_a_terminal says why)."""
    from run_processes import sigint_as_in_a_terminal

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


LAB = os.path.join(REPO, "tests", "slurm-lab", "lab.sh")
# The SLURM lab's nodes (lab.sh up LAB_NODES FAULT_NODES): partition lab's,
# and partition faults', where nodes are lost beside the others' jobs: a
# 2-node job, its retry on 2 others, and an elastic job's 2 (lab_studies.py).
LAB_NODES, FAULT_NODES = 4, 6


def lab_nodes() -> int:
    """How many nodes the SLURM lab on this machine has up (0: none)."""
    if subprocess.run(["scontrol", "ping"], capture_output=True).returncode != 0:
        return 0
    answer = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True)
    return len(set(answer.stdout.split())) if answer.returncode == 0 else 0


@pytest.fixture(scope="session")
def slurm_lab():
    """The SLURM lab (tests/slurm-lab/lab.sh) with LAB_NODES + FAULT_NODES
    nodes, for every lab test of the pytest run (they share one xdist worker:
    xdist_group slurm-lab), brought up once and down at the end if it was
    started here."""
    if shutil.which("slurmctld") is None or os.geteuid() != 0:
        pytest.skip("needs root and SLURM (tools/install-slurm.sh); CI has both")
    up = lab_nodes()
    if up not in (0, LAB_NODES + FAULT_NODES):
        subprocess.run([LAB, "down"], check=True, timeout=120)
    started_here = up != LAB_NODES + FAULT_NODES
    if started_here:
        subprocess.run([LAB, "up", str(LAB_NODES), str(FAULT_NODES)], check=True, timeout=300)
    yield LAB
    if started_here:
        subprocess.run([LAB, "down"], check=True, timeout=120)


@pytest.fixture(scope="session")
def lab_campaign(slurm_lab, tmp_path_factory):
    """Every study of the lab's tests, started at once on the lab
    (lab_studies.start_campaign); each test waits for its own."""
    from lab_studies import start_campaign

    campaign = start_campaign(tmp_path_factory.mktemp)
    yield campaign
    campaign.stop()


def rebuilt_cache(run_store, study: str) -> dict:
    """A fresh copy of the workflow that rebuilt cached study `study`'s tables,
    figures and analyses from its records (trainscale trains nothing there),
    once for the whole pytest run: {"repo", "output" (Snakemake's), "seconds"}."""
    import time

    def rebuild(folder: str) -> dict:
        repo = copy_repository(os.path.join(folder, "repo"))
        start = time.monotonic()
        run = snakemake(repo, "--cores", "1", "--configfile", f"results/{study}/config.yaml")
        seconds = time.monotonic() - start
        assert run.returncode == 0, run.stderr[-3000:]
        return {"repo": repo, "output": run.stdout + run.stderr, "seconds": seconds}

    return run_store.once(f"rebuilt-{study}", rebuild)


@pytest.fixture()
def repo_copy(tmp_path):
    return copy_repository(str(tmp_path / "repo"))
