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
from conftest import SNAKEMAKE, copy_repository
from test_slurm import LAB, _lab_is_up, profile_args, records, study_config

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


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


def test_a_lost_node_fails_the_job_and_the_retry_runs_elsewhere(lab4, tmp_path):
    repo = copy_repository(str(tmp_path / "repo"))
    config = study_config(study="slurm-lab-node-loss", train_retries=1)
    # Long enough to be running when the node dies; short on the retry.
    config["benchmark"].update(data_dir="results/slurm-lab-node-loss/data", iterations=150)
    config["benchmark"]["steps_per_iteration"] = 20
    config["grid"].update(framework=["horovod"], nodes=[2], gpus_per_node=[1])
    args = profile_args(repo, "loss.yaml", config)
    run = subprocess.Popen(
        [SNAKEMAKE, *args],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
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
    assert run.returncode == 0, output[-4000:]
    assert "NODE_FAIL" in output or "node failure" in output
    record = records(repo, "slurm-lab-node-loss")["horovod/small_cnn/b16/n2g1r1.json"]
    assert record["status"] == "ok"
    hosts = set(record["provenance"]["hosts"])
    assert len(hosts) == 2 and not hosts & {f"node{n}" for n in first_nodes}, hosts
    # The failed attempt's log is kept (the plugin deletes successful jobs' logs).
    logs = list(Path(repo, ".snakemake", "slurm_logs", "rule_train").rglob("*.log"))
    assert len(logs) == 1 and "DUE TO NODE FAILURE" in logs[0].read_text(), logs
