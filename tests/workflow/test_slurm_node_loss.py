"""A compute node dies under a running multi-node job, on a 4-node SLURM lab.

The job's processes on that node, its slurmd and slurmstepd are killed at once
(tests/slurm-lab/lab.sh kill-node). SLURM declares the node down and the job
NODE_FAIL; the profile's `slurm-no-requeue` leaves the retry to Snakemake.
Its SLURM plugin (2.8.0) cannot tell which node of the job failed and leaves
them all out of later submissions: the retry of a 2-node job needs 2 more.
One job, two attempts, a node lost under each: the retry and the record of
a point lost on its last attempt in one Snakemake run (one test, not two).
And an elastic job (torch-elastic) that a node fault takes a node from: it
goes on, on the node left (tests/slurm-lab/faults.yaml has the study).
"""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml
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


def _kill_a_node_of_the_job(run: subprocess.Popen, spared: set[int]) -> tuple[set[int], int]:
    """Once the job trains on 2 nodes outside `spared`, kill the second of them
    (not the first: it runs the batch step, the launcher). Its nodes, and the dead one."""
    deadline = time.monotonic() + 300
    while len(nodes_training() - spared) < 2:
        assert time.monotonic() < deadline and run.poll() is None, "the job never trained"
        time.sleep(1)
    time.sleep(5)
    nodes = nodes_training() - spared
    dead = max(nodes)
    subprocess.run([LAB, "kill-node", str(dead)], check=True)
    return nodes, dead


def node_loss_study(study: str, train_retries: int) -> dict:
    config = study_config(study=study, train_retries=train_retries)
    # Long enough to be running when the node dies.
    config["benchmark"].update(data_dir=f"results/{study}/data", blocks=150)
    config["benchmark"]["steps_per_block"] = 20
    config["grid"].update(framework=["horovod"], nodes=[2], gpus_per_node=[1])
    config["constraints"] = {}  # the lab study's are about its own grid
    return config


def test_a_lost_node_fails_the_job_the_retry_runs_elsewhere_and_its_loss_is_recorded(
    lab4, tmp_path
):
    # One retry; a node dies under each attempt. SLURM, not the run, ends the
    # last one: the run cannot write its record, and Snakemake deletes the
    # job's output. The workflow records the point.
    repo = copy_repository(str(tmp_path / "repo"))
    study = "slurm-lab-node-loss"
    args = profile_args(repo, "loss.yaml", node_loss_study(study, 1))
    run = start_snakemake(repo, *args)
    dead = []
    try:
        first, killed = _kill_a_node_of_the_job(run, spared=set())
        dead.append(killed)
        # The retry, a new job: the plugin leaves both of the first's nodes out.
        retry, killed = _kill_a_node_of_the_job(run, spared=first)
        dead.append(killed)
        output, _ = run.communicate(timeout=480)
    finally:
        if run.poll() is None:
            run.kill()
        for node in dead:
            subprocess.run([LAB, "revive-node", str(node)], check=True, timeout=120)
    assert run.returncode != 0, output[-4000:]
    assert "NODE_FAIL" in output or "node failure" in output
    assert len(retry) == 2 and not retry & first, (first, retry)
    # Each attempt's SLURM log is kept (the plugin deletes successful jobs' logs).
    logs = sorted(
        Path(repo, ".snakemake", "slurm_logs", "rule_train").rglob("*.log"),
        key=lambda log: int(log.stem),
    )
    assert len(logs) == 2 and all("DUE TO NODE FAILURE" in log.read_text() for log in logs)
    assert "1 grid point(s) failed on their last attempt" in output, output[-4000:]
    record = records(repo, study)["horovod/small_cnn/b16/n2g1r1.json"]
    assert record["status"] == "failed" and record["images_per_sec"] is None
    first_line = record["error"].splitlines()[0]
    # The last attempt's words: its job, not the first's.
    assert first_line.startswith(f"SLURM ended the job: *** JOB {logs[-1].stem} ON "), first_line
    assert "DUE TO NODE FAILURE" in first_line
    assert f"--- tail of results/{study}/logs/train/horovod/" in record["error"]
    # The next run submits nothing and builds the tables with FAILED there.
    again = subprocess.run(
        [SNAKEMAKE, *args], cwd=repo, capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0, again.stderr[-4000:]
    assert "rule train:" not in again.stdout + again.stderr
    table = Path(repo, f"results/{study}/tables/table2.md").read_text()
    assert "FAILED" in table, table


def faults_study(frameworks: list[str]) -> dict:
    """tests/slurm-lab/faults.yaml for `frameworks`, the node fault alone."""
    with open(Path(__file__).parents[1] / "slurm-lab" / "faults.yaml") as handle:
        config = yaml.safe_load(handle)
    config["grid"].update(framework=frameworks, fault=["kill-node1-step12"])
    # (The repository's copy has no tests/: the lab's script where it is.)
    command = config["cluster"]["node_fault_command"]
    config["cluster"]["node_fault_command"] = command.replace("tests/slurm-lab/lab.sh", LAB)
    return config


def test_a_lost_node_leaves_an_elastic_run_on_the_node_left(lab4, tmp_path):
    # The node fault runs the lab's node_fault_command on the job's second
    # node: every process there dies, its slurmd too, and SLURM declares it
    # down. The job was submitted --no-kill: torchrun's agent on the first
    # node goes on alone from the last checkpoint, and the job succeeds.
    repo = copy_repository(str(tmp_path / "repo"))
    study = "slurm-lab-faults"
    args = profile_args(repo, "faults.yaml", faults_study(["torch-elastic"]))
    try:
        run = subprocess.run(
            [SNAKEMAKE, *args], cwd=repo, capture_output=True, text=True, timeout=600
        )
    finally:
        for node in (1, 2, 3, 4):  # back, if its reboot is still under way
            subprocess.run([LAB, "revive-node", str(node)], capture_output=True, timeout=120)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    [record] = records(repo, study).values()
    recovery = record["recovery"]
    print({k: v for k, v in recovery.items() if k != "world_sizes"})
    assert record["status"] == "ok" and recovery["fault_injected"]
    assert (recovery["world_size_before"], recovery["world_size_after"]) == (2, 1)
    assert [w["world_size"] for w in recovery["world_sizes"]] == [2, 1]
    assert recovery["steps_redone"] == 2  # saved after step 10
    # The record's hosts are the world it ended with: the first node alone.
    first = record["provenance"]["hosts"]
    assert len(first) == 1 and record["replicas"] == 1
    timeline = Path(repo, "results", study, "runs").rglob("*.timeline.jsonl")
    hosts = {json.loads(line)["host"] for path in timeline for line in path.open()}
    assert len(hosts) == 2 and first[0] in hosts  # both nodes wrote, one went on
