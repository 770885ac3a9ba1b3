"""The study through profiles/slurm on a real SLURM cluster started by the tests
themselves (conftest.slurm_lab).

tests/slurm-lab/lab.sh brings up slurmdbd, slurmctld and 4 compute nodes, each
in its own network namespace with its own address, host name and slurmd, and
2 fake GPUs. The jobs train on the CPU; Horovod's and TensorFlow's traffic
between ranks crosses between the nodes' addresses.

Every study of the lab's tests starts at once (conftest.lab_campaign): SLURM
queues their jobs on the lab's nodes as a cluster would, and each test
waits for its own.
"""

import subprocess
from pathlib import Path

import pandas as pd
import pytest
from conftest import snakemake, train_jobs
from lab_studies import TIME_LIMIT_MINUTES, assert_hosts_follow, records, study_config
from runs import show_in_the_log

from trainscale.catalogue.registry import REGISTRY, framework_spec
from trainscale.core.faults import read_timeline
from trainscale.core.slurm import WORKFLOW_MEM_MB

# One lab on this machine: its tests share one pytest-xdist worker.
pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.xdist_group("slurm-lab")]

# The lab study's points (tests/slurm-lab/study.yaml: one framework of each
# launch kind, and CentralStorageStrategy): the nodes of their processes, in
# rank order ("aabb": two on one node, then two on another), and replicas.
# One process per replica on the CPU, but one for MirroredStrategy and
# CentralStorageStrategy, and tf-ps's chief.
EXPECTED = {
    "horovod/small_cnn/b16/n2g2r1.json": ("aabb", 4),
    "tf-multiworker/small_cnn/b16/n2g2r1.json": ("aabb", 4),
    "tf-mirrored/small_cnn/b16/n1g2r1.json": ("a", 2),
    # One process too, its variables on the host's CPU (issue 31's second).
    "tf-central-storage/small_cnn/b16/n1g2r1.json": ("a", 2),
    "torch-ddp/small_cnn/b16/n2g2r1.json": ("aabb", 4),
    "ray-train/small_cnn/b16/n2g2r1.json": ("aabb", 4),
    # One torchrun agent per node; the rendezvous ranks the agents as they join.
    "torch-elastic/small_cnn/b16/n2g2r1.json": ("aabb", 4),
    # Horovod's elastic driver, one task of one node.
    "horovod-torch-elastic/small_cnn/b16/n1g2r1.json": ("aa", 2),
    # The chief runs the loop; its record names every role's host.
    "tf-ps/small_cnn/b16/n2g1r1.json": ("a", 2),
}
# tf-ps's roles, one srun step in task order, node by node: the chief and
# the server on the job's first node, both workers on its second.
PARAMETER_SERVER_HOSTS = "aabb"
TORCH = [s.name for s in REGISTRY if s.ecosystem == "torch"]


def test_the_lab_study_has_one_framework_of_each_launch_kind():
    """Every kind of srun step is tried: a launch kind added to the registry
    needs its framework in the lab study (and its point in EXPECTED)."""
    frameworks = study_config()["grid"]["framework"]
    assert sorted(frameworks) == sorted({name.split("/")[0] for name in EXPECTED})
    kinds = {str(type(framework_spec(name).launch)) for name in frameworks}
    assert kinds == {str(type(spec.launch)) for spec in REGISTRY}


def test_each_launch_kind_through_the_slurm_profile(lab_campaign, record_property):
    """Minutes: it waits for the lab study's 9 jobs, which SLURM runs beside
    every other lab study's (about 20 jobs in all, 2 to 8 ranks each, on
    this machine's cores); the other lab tests then find theirs done."""
    study = lab_campaign.studies["lab"]
    assert train_jobs(study.dry_run_output) == len(EXPECTED), study.dry_run_output[-3000:]
    returncode, output = study.wait()
    assert returncode == 0, output[-4000:]

    got = records(study.repo, "slurm-lab")
    assert set(got) == set(EXPECTED)
    job_ids = []
    for name, (pattern, replicas) in EXPECTED.items():
        record = got[name]
        provenance = record["provenance"]
        assert record["status"] == "ok" and record["replicas"] == replicas, name
        if record["framework"] in TORCH:
            assert record["processes"] == replicas and provenance["torch"].startswith("2.13.0")
        in_task_order = framework_spec(record["framework"]).launch.ranks_in_task_order
        assert_hosts_follow(provenance["hosts"], pattern, in_task_order)
        cluster = record["framework_config"].get("cluster")
        if cluster:  # tf-ps's roles: chief, server, then the workers
            hosts = [a.split(":")[0] for role in ("chief", "ps", "worker") for a in cluster[role]]
            assert_hosts_follow(hosts, PARAMETER_SERVER_HOSTS)
            assert hosts[0] == provenance["hosts"][0]
        # Every process saw the fake GPUs its job asked for.
        for process in provenance["processes"]:
            assert process["cuda_visible_devices"], name
        job_ids.append(provenance["slurm"]["job_id"])
        print(name, provenance["hosts"])

    # SLURM's accounting knows every job, and they all completed.
    sacct = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(job_ids)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert sorted(line.split("|")[1] for line in sacct) == ["COMPLETED"] * len(EXPECTED)

    folder = Path(study.repo, "results", "slurm-lab")
    tidy = pd.read_csv(folder / "throughput.csv")
    assert len(tidy) == len(EXPECTED) and set(tidy["status"]) == {"ok"}
    for name in ("table1", "table2", "efficiency"):
        assert (folder / "tables" / f"{name}.md").stat().st_size > 0
    for name in ("weak_scaling_hosts", "weak_scaling_gpus", "efficiency", "frameworks"):
        assert (folder / "figures" / f"{name}.png").stat().st_size > 1000
    # The step model's held-out check on the lab (CPU "GPUs" over veth links,
    # not the paper's hardware): computed and printed, whatever it shows.
    holdout = pd.read_csv(folder / "tables" / "predicted_holdout.csv")
    assert set(holdout["framework"]) >= {"horovod", "tf-multiworker", "torch-ddp"}
    tables = [
        (folder / "tables" / f"{name}.md").read_text()
        for name in ("predicted_holdout", "predicted_parameters")
    ]
    show_in_the_log(record_property, "\n".join(tables))


def test_horovod_over_gloo_across_nodes(lab_campaign):
    """Over a minute: it waits for its study's one job (Horovod over Gloo, 2
    nodes of 2 ranks), which SLURM runs among the lab's other jobs
    (conftest.lab_campaign), all on this machine's cores."""
    study = lab_campaign.studies["gloo"]
    returncode, output = study.wait()
    assert returncode == 0, output[-4000:]
    (record,) = records(study.repo, "slurm-lab-gloo").values()
    assert_hosts_follow(record["provenance"]["hosts"], "aabb")
    assert record["settings"]["horovod_launcher"] == "gloo"


def test_each_system_runs_on_its_own_partition_and_the_table_puts_them_side_by_side(
    lab_campaign, record_property
):
    """cluster.systems on the lab's two node types (lab_studies.systems_study):
    a point of each reached its partition's nodes only, and the systems table
    compares them. One machine's cores: this proves the routing, not a
    difference of hardware. Over a minute where it is the first lab test to
    wait (100 s in CI): its two jobs run among the lab's other jobs
    (conftest.lab_campaign), on this machine's cores."""
    study = lab_campaign.studies["systems"]
    returncode, output = study.wait()
    assert returncode == 0, output[-4000:]
    got = records(study.repo, "slurm-lab-systems")
    assert len(got) == 2
    partition_nodes = {"lab-a": {"node1", "node2"}, "lab-b": {"node3", "node4"}}
    jobs = {}
    for record in got.values():
        system = record["settings"]["system"]
        assert (
            record["status"] == "ok"
            and set(record["provenance"]["hosts"]) <= partition_nodes[system]
        )
        jobs[record["provenance"]["slurm"]["job_id"]] = system
    sacct = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-o", "JobID,Partition", "-j", ",".join(jobs)],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert {line.split("|")[0]: line.split("|")[1] for line in sacct} == jobs
    table = pd.read_csv(Path(study.repo, "results/slurm-lab-systems/tables/systems.csv"))
    assert list(table["system"]) == ["lab-a", "lab-b"]
    assert list(table["partition"]) == ["lab-a", "lab-b"]
    assert table["of_first_system"].iloc[0] == 1.0 and table["of_first_system"].iloc[1] > 0
    for hosts, system in zip(table["hosts"], table["system"], strict=True):
        assert set(hosts.split(",")) <= partition_nodes[system]
    figure = Path(study.repo, "results/slurm-lab-systems/figures/systems.png")
    assert figure.stat().st_size > 1000
    tables = Path(study.repo, "results/slurm-lab-systems/tables")
    show_in_the_log(record_property, (tables / "systems.md").read_text())


def test_a_cancelled_job_fails_alone_and_a_rerun_plans_only_that_point(lab_campaign):
    """Over a minute where the cancel study's other job has not ended: it
    waits for it among the lab's, then two dry runs."""
    # lab_studies.cancel_in_training cancelled its 2-node job as it trained.
    victim = lab_campaign.outcome("cancel")["job"]
    study = lab_campaign.studies["cancel"]
    returncode, output = study.wait()
    assert returncode != 0
    assert "Error in rule train" in output and "n2g1r1.json" in output
    state = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-o", "State", "-j", victim], capture_output=True, text=True
    ).stdout.strip()
    assert state.startswith("CANCELLED")
    # Its last attempt: the workflow recorded it as failed, from SLURM's log.
    got = records(study.repo, "slurm-lab-cancel")
    cancelled_record = got.pop("horovod/small_cnn/b16/n2g1r1.json")
    assert cancelled_record["status"] == "failed"
    assert cancelled_record["error"].startswith(f"SLURM ended the job: *** JOB {victim} ON ")
    assert "CANCELLED AT" in cancelled_record["error"].splitlines()[0]
    assert [r["status"] for r in got.values()] == ["ok"]

    # Retrying it is the user's call: delete its record, and only it would
    # train. (Not run: a job through the SLURM profile is the lab study's,
    # and a deleted record retrained, the local study's.)
    repo, args = study.repo, study.args
    record = Path(repo, "results/slurm-lab-cancel/runs/horovod/small_cnn/b16/n2g1r1.json")
    assert train_jobs(snakemake(repo, "-n", *args).stdout) == 0
    record.unlink()
    dry = snakemake(repo, "-n", *args)
    output = dry.stdout + dry.stderr
    assert train_jobs(output) == 1 and "n2g1r1.json" in output


def test_a_run_that_would_hit_the_slurm_time_limit_records_a_timeout(lab_campaign):
    """The run's watchdog writes the record that SLURM's own kill would never
    leave.

    Over a minute where its study's job has not ended yet: the run's rank
    freezes in its timed steps and the watchdog waits out its limit (at
    least 30 s) before it writes the record."""
    study = lab_campaign.studies["limit"]
    returncode, output = study.wait()
    assert returncode == 0, output[-4000:]
    record = records(study.repo, "slurm-lab-limit")["horovod/small_cnn/b16/n1g1r1.json"]
    assert record["status"] == "timeout" and record["images_per_sec"] is None
    # At least the floor, and ended well before the limit (240 s: under 200).
    assert 30 <= record["elapsed_seconds"] < 60 * TIME_LIMIT_MINUTES - 40
    # Its rank froze in its timed steps (the study's stop fault) and never woke.
    runs = Path(study.repo, "results/slurm-lab-limit/runs/horovod/small_cnn/b16")
    events = [e["event"] for e in read_timeline(str(runs / "n1g1r1.json.timeline.jsonl"))]
    assert "fault_injected" in events and "fault_ended" not in events, events


def test_a_node_without_the_training_environment_fails_its_point_naming_the_path(lab_campaign):
    """cluster.environment_check: node. Snakemake's side trusts the path; the
    job checks it on its node first, and its one line becomes the record.

    Up to a minute: its study's job queues among the lab campaign's others
    (conftest.lab_campaign), and this test waits for its study to end."""
    study = lab_campaign.studies["noenv"]
    returncode, output = study.wait()
    assert returncode != 0 and "a real run is refused" not in output
    record = records(study.repo, "slurm-lab-noenv")["tf-mirrored/small_cnn/b16/n1g2r1.json"]
    assert record["status"] == "failed"
    first = record["error"].splitlines()[0]
    assert first.startswith(
        "trainscale environment check (node): .venv-absent/bin/trainscale is not there on node"
    ), first


def test_a_job_over_its_slurm_memory_is_recorded_as_oom(lab_campaign):
    # The lab's cgroup plugin (ConstrainRAMSpace) enforces --mem as real
    # clusters do: the kernel kills the training process inside its srun
    # step. The launcher, outside that step, records `oom`, and the job
    # completes, so Snakemake keeps it.
    if "oom" not in lab_campaign.studies:
        pytest.skip("the lab runs without cgroups here (no writable cgroup v1 memory)")
    study = lab_campaign.studies["oom"]
    returncode, output = study.wait()
    assert returncode == 0, output[-4000:]
    record = records(study.repo, "slurm-lab-oom")["tf-single/vgg16/b64/n1g1r1.json"]
    assert record["status"] == "oom" and record["images_per_sec"] is None
    assert "oom-kill event" in record["error"]  # SLURM's own words, relayed by srun
    job = record["provenance"]["slurm"]["job_id"]
    sacct = subprocess.run(
        ["sacct", "-n", "-P", "-o", "JobID,State,AllocTRES", "-j", job],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    steps = {step: fields for step, *fields in (line.split("|") for line in sacct)}
    assert steps[job][0] == "COMPLETED" and steps[f"{job}.0"][0] == "OUT_OF_MEMORY", steps
    # The step was held to mem_mb_per_gpu, the job asked that and the
    # workflow's share: the kernel's kill stayed in the step, where only the
    # training process was (core.slurm.WORKFLOW_MEM_MB).
    assert "mem=900M" in steps[f"{job}.0"][1].split(","), steps
    assert f"mem={900 + WORKFLOW_MEM_MB}M" in steps[job][1].split(","), steps
    table = Path(study.repo, "results", "slurm-lab-oom", "tables", "table1.md").read_text()
    assert "| vgg16 | 64 | 1 | OOM |" in table
    # Not trained again: the outcome is the result.
    again = snakemake(study.repo, "-n", *study.args)
    assert train_jobs(again.stdout + again.stderr) == 0
