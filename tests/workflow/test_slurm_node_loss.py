"""A compute node dies under a running multi-node job, on the SLURM lab's
partition faults (conftest.slurm_lab), beside the other studies' jobs.

The job's processes on that node, its slurmd and slurmstepd are killed at once
(tests/slurm-lab/lab.sh kill-node). SLURM declares the node down and the job
NODE_FAIL; the profile's `slurm-no-requeue` leaves the retry to Snakemake.
Its SLURM plugin (2.8.0) cannot tell which node of the job failed and leaves
them all out of later submissions: the retry of a 2-node job needs 2 more.
One job, two attempts, a node lost under each (lab_studies.
kill_a_node_under_each_attempt): the retry and the record of a point lost on
its last attempt in one Snakemake run (one test, not two). And an elastic
job (torch-elastic) that a node fault takes a node from: it goes on, on the
node left (tests/slurm-lab/faults.yaml has the study).
"""

import json
from pathlib import Path

import pytest
from conftest import SNAKEMAKE
from lab_studies import records

# One lab on this machine: its tests share one pytest-xdist worker.
pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.xdist_group("slurm-lab")]


def test_a_lost_node_fails_the_job_the_retry_runs_elsewhere_and_its_loss_is_recorded(
    lab_campaign,
):
    """One retry; a node dies under each attempt. SLURM, not the run, ends the
    last one: the run cannot write its record, and Snakemake deletes the
    job's output. The workflow records the point.

    Minutes where it is the first lab test to wait (224 s at 8e58b02, when
    it was): two SLURM jobs one after the other, each losing a node and
    waiting for SLURM to declare it down, among the lab campaign's jobs."""
    import subprocess

    nodes = lab_campaign.outcome("node-loss")
    study = lab_campaign.studies["node-loss"]
    returncode, output = study.wait()
    repo, name = study.repo, "slurm-lab-node-loss"
    assert returncode != 0, output[-4000:]
    assert "NODE_FAIL" in output or "node failure" in output
    first, retry = nodes["first"], nodes["retry"]
    assert len(retry) == 2 and not retry & first, (first, retry)
    # Each attempt's SLURM log is kept (the plugin deletes successful jobs' logs).
    logs = sorted(
        Path(repo, ".snakemake", "slurm_logs", "rule_train").rglob("*.log"),
        key=lambda log: int(log.stem),
    )
    assert len(logs) == 2 and all("DUE TO NODE FAILURE" in log.read_text() for log in logs)
    assert "1 grid point(s) failed on their last attempt" in output, output[-4000:]
    record = records(repo, name)["horovod/small_cnn/b16/n2g1r1.json"]
    assert record["status"] == "failed" and record["images_per_sec"] is None
    first_line = record["error"].splitlines()[0]
    # The last attempt's words: its job, not the first's.
    assert first_line.startswith(f"SLURM ended the job: *** JOB {logs[-1].stem} ON "), first_line
    assert "DUE TO NODE FAILURE" in first_line
    assert f"--- tail of results/{name}/logs/train/horovod/" in record["error"]
    # The next run submits nothing and builds the tables with FAILED there.
    again = subprocess.run(
        [SNAKEMAKE, *study.args, "--until", "tables"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr[-4000:]
    assert "rule train:" not in again.stdout + again.stderr
    table = Path(repo, f"results/{name}/tables/table2.md").read_text()
    assert "FAILED" in table, table


def test_a_lost_node_leaves_an_elastic_run_on_the_node_left(lab_campaign):
    """The node fault runs the lab's node_fault_command on the job's second
    node: every process there dies, its slurmd too, and SLURM declares it
    down (the command brings it back then). The job was submitted
    --no-kill: torchrun's agent on the first node goes on alone from the
    last checkpoint, and the job succeeds.

    Up to two minutes where its study's job has not ended yet: the job
    trains on 2 nodes to step 12, loses one, and torchrun's agent on the
    other restarts its worker from the last checkpoint and trains to the
    end, while the lab campaign's other jobs share this machine's cores."""
    study = lab_campaign.studies["elastic"]
    returncode, output = study.wait()
    assert returncode == 0, output[-4000:]
    [record] = records(study.repo, "slurm-lab-faults").values()
    recovery = record["recovery"]
    print({k: v for k, v in recovery.items() if k != "world_sizes"})
    assert record["status"] == "ok" and recovery["fault_injected"]
    assert (recovery["world_size_before"], recovery["world_size_after"]) == (2, 1)
    assert [w["world_size"] for w in recovery["world_sizes"]] == [2, 1]
    assert recovery["steps_redone"] == 2  # saved after step 10
    # The record's hosts are the world it ended with: the first node alone.
    first = record["provenance"]["hosts"]
    assert len(first) == 1 and record["replicas"] == 1
    timeline = Path(study.repo, "results", "slurm-lab-faults", "runs").rglob("*.timeline.jsonl")
    hosts = {json.loads(line)["host"] for path in timeline for line in path.open()}
    assert len(hosts) == 2 and first[0] in hosts  # both nodes wrote, one went on
