"""A compute node dies under a running multi-node job, on a 4-node SLURM lab.

The job's processes on that node, its slurmd and slurmstepd are killed at once
(tests/slurm-lab/lab.sh kill-node). SLURM declares the node down and the job
NODE_FAIL; the profile's `slurm-no-requeue` leaves the retry to Snakemake.
Its SLURM plugin (2.8.0) cannot tell which node of the job failed and leaves
them all out of later submissions: the retry of a 2-node job needs 2 more.
"""

import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import SNAKEMAKE, copy_repository, start_snakemake
from test_slurm import LAB, _lab_is_up, profile_args, records, study_config

# One lab on this machine: its tests run one after the other (pytest-xdist).
pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.xdist_group("slurm-lab")]


@pytest.fixture(scope="module")
def lab4():
    if not Path("/usr/sbin/slurmctld").exists() or os.geteuid() != 0:
        pytest.skip("needs root and SLURM (tools/install-slurm.sh); CI has both")
    if _lab_is_up():
        subprocess.run([LAB, "down"], check=True, timeout=120)
    subprocess.run([LAB, "up", "4"], check=True, timeout=300)
    yield
    subprocess.run([LAB, "down"], check=True, timeout=120)


def nodes_training() -> set[int]:
    """The lab nodes on which a `trainscale train` process runs now."""
    found = set()
    for node in (1, 2, 3, 4):
        pids = subprocess.run(
            ["ip", "netns", "pids", f"tslab-node{node}"], capture_output=True, text=True
        ).stdout.split()
        for pid in pids:
            try:
                if b"trainscale\0train\0" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.add(node)
            except OSError:
                continue
    return found


def run_and_lose_a_node(repo: str, args: list[str]) -> tuple[subprocess.Popen, str, set[int]]:
    """Run Snakemake; once its job trains on 2 nodes, kill the second of them."""
    run = start_snakemake(repo, *args)
    dead = None
    try:
        deadline = time.monotonic() + 300
        while len(nodes_training()) < 2:
            assert time.monotonic() < deadline and run.poll() is None, "the job never trained"
            time.sleep(1)
        time.sleep(5)
        first_nodes = nodes_training()
        # Not the job's first node: that one runs the batch step (the launcher).
        dead = max(first_nodes)
        subprocess.run([LAB, "kill-node", str(dead)], check=True)
        output, _ = run.communicate(timeout=480)
    finally:
        if run.poll() is None:
            run.kill()
        if dead:
            subprocess.run([LAB, "revive-node", str(dead)], check=True, timeout=120)
    return run, output, first_nodes


def node_loss_study(study: str, train_retries: int) -> dict:
    config = study_config(study=study, train_retries=train_retries)
    # Long enough to be running when the node dies; short on the retry.
    config["benchmark"].update(data_dir=f"results/{study}/data", iterations=150)
    config["benchmark"]["steps_per_iteration"] = 20
    config["grid"].update(framework=["horovod"], nodes=[2], gpus_per_node=[1])
    return config


def test_a_lost_node_fails_the_job_and_the_retry_runs_elsewhere(lab4, tmp_path):
    repo = copy_repository(str(tmp_path / "repo"))
    args = profile_args(repo, "loss.yaml", node_loss_study("slurm-lab-node-loss", 1))
    run, output, first_nodes = run_and_lose_a_node(repo, args)
    assert run.returncode == 0, output[-4000:]
    assert "NODE_FAIL" in output or "node failure" in output
    record = records(repo, "slurm-lab-node-loss")["horovod/small_cnn/b16/n2g1r1.json"]
    assert record["status"] == "ok"
    hosts = set(record["provenance"]["hosts"])
    assert len(hosts) == 2 and not hosts & {f"node{n}" for n in first_nodes}, hosts
    # The failed attempt's log is kept (the plugin deletes successful jobs' logs).
    logs = list(Path(repo, ".snakemake", "slurm_logs", "rule_train").rglob("*.log"))
    assert len(logs) == 1 and "DUE TO NODE FAILURE" in logs[0].read_text(), logs


def test_a_node_lost_on_the_last_attempt_is_recorded_as_failed(lab4, tmp_path):
    # SLURM, not the run, ends this job: the run cannot write its record, and
    # Snakemake deletes the job's output. The workflow records the point.
    repo = copy_repository(str(tmp_path / "repo"))
    study = "slurm-lab-node-lost"
    args = profile_args(repo, "lost.yaml", node_loss_study(study, 0))
    run, output, _ = run_and_lose_a_node(repo, args)
    assert run.returncode != 0, output[-4000:]
    assert "1 grid point(s) failed on their last attempt" in output, output[-4000:]
    record = records(repo, study)["horovod/small_cnn/b16/n2g1r1.json"]
    assert record["status"] == "failed" and record["images_per_sec"] is None
    first_line = record["error"].splitlines()[0]
    assert first_line.startswith("SLURM ended the job: *** JOB "), first_line
    assert "DUE TO NODE FAILURE" in first_line
    assert "--- tail of results/slurm-lab-node-lost/logs/train/horovod/" in record["error"]
    # The next run submits nothing and builds the tables with FAILED there.
    again = subprocess.run(
        [SNAKEMAKE, *args], cwd=repo, capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0, again.stderr[-4000:]
    assert "rule train:" not in again.stdout + again.stderr
    table = Path(repo, f"results/{study}/tables/table2.md").read_text()
    assert "FAILED" in table, table
