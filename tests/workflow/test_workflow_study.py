"""What the workflow reads of a study (trainscale.workflow.WorkflowStudy), from
the package alone: each job's command, environment and SLURM shape, the
probes' flags, which analyses a study has and their files. The dry-run tests
(test_dry_run.py) see the same through Snakemake."""

import os

import pytest
import yaml
from conftest import REPO

from trainscale.study.schema import config_schema, validate_config
from trainscale.study.study import record_path
from trainscale.workflow.workflow_study import NotInStudy, WorkflowStudy


def load(path: str, deployed=(), **changes) -> WorkflowStudy:
    """The study of the config file at `path` (below the repository), as
    common.smk loads it: validated, nothing saved yet, from the checkout."""
    with open(os.path.join(REPO, path)) as handle:
        config = {**yaml.safe_load(handle), **changes}
    schema = config_schema(os.path.join(REPO, "workflow", "schemas", "config.schema.yaml"))
    config = validate_config(config, schema)
    cwd = os.getcwd()
    os.chdir(REPO)  # the study's paths are the working directory's, as Snakemake's
    try:
        return WorkflowStudy.load(config, None, deployed, "examples", cached=False)
    finally:
        os.chdir(cwd)


def test_a_train_job_runs_its_point_from_its_frameworks_environment():
    study = load("tests/slurm-lab/network.yaml", study="workflow-study-test")
    wildcards = {
        "framework": "torch-ddp",
        "model": "small_cnn",
        "batch_size": "16",
        "knobs_folder": "network=shaped/",
        "nodes": "2",
        "gpus_per_node": "2",
        "repeat": "1",
    }
    job = study.train_job(wildcards)
    assert job["trainscale"] == ".venv-torch/bin/trainscale"
    assert "--framework torch-ddp" in job["options"] and "--nodes 2" in job["options"]
    assert "GLOO_SOCKET_IFNAME=eth1" in job["environment"]  # the shaped network's
    assert job["slurm"]["nodes"] == 2 and job["slurm"]["tasks_per_node"] == 2
    assert job["slurm"]["slurm_partition"] == "lab"
    assert job["conda"] == "../../envs/torch.yaml"
    assert study.train_job(wildcards) is job  # once per job, however many fields a rule reads
    # Conda or a container puts trainscale on PATH.
    provided = load("tests/slurm-lab/network.yaml", deployed={"CONDA"}, study="w")
    assert provided.train_job({**wildcards})["trainscale"] == "trainscale"
    with pytest.raises(NotInStudy, match="is not a point of study workflow-study-test"):
        study.train_job({**wildcards, "nodes": "3"})


def test_a_probe_job_has_its_transport_its_network_and_its_shape():
    study = load("tests/slurm-lab/network.yaml", study="workflow-study-test")
    (job,) = [j for j in study.probes if j.network == "shaped"]
    wildcards = {
        "network": job.network,
        "container": job.container,
        "transport": job.transport,
        "nodes": str(job.nodes),
        "ranks_per_node": str(job.ranks_per_node),
    }
    probe = study.probe(wildcards)
    assert probe["trainscale"] == ".venv-torch/bin/trainscale"
    assert f"--transport {job.transport} --nodes 2 --ranks-per-node 1" in probe["options"]
    assert "--network-name shaped" in probe["options"]
    assert "--largest-message-bytes 1048576" in probe["options"]
    assert "GLOO_SOCKET_IFNAME=eth1" in probe["environment"]
    assert probe["slurm"]["nodes"] == 2
    assert f"{study.results}/{job.stem()}.json" in study.outputs.all_outputs()


def test_a_study_has_the_analyses_its_grid_asks_for_and_no_others():
    faults = load("profiles/local/faults.yaml")
    accuracy = load("profiles/local/accuracy.yaml")
    sharding = load("profiles/local/sharding-memory.yaml")
    for study, has in ((faults, "faulted"), (accuracy, "accuracy"), (sharding, "sharded")):
        flags = {f: getattr(study.outputs, f) for f in ("faulted", "accuracy", "sharded")}
        assert flags == {f: f == has for f in flags}, study.name
    tables, figures = faults.outputs.recovery_files()
    assert f"{faults.results}/tables/goodput.csv" in tables and figures
    assert accuracy.outputs.recovery_files() == ([], [])
    everything = accuracy.outputs.all_outputs()
    assert set(accuracy.outputs.accuracy_files()[0]) <= set(everything)
    # Every record is a target itself, and the study's data is the digits it writes.
    assert {record_path(accuracy.name, p) for p in accuracy.points} <= set(everything)
    assert accuracy.generated_data() == accuracy.digits_files()[0]
