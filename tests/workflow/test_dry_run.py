"""Inspecting a study's DAG where no training environment exists (a laptop, a
login node whose compute nodes alone mount the environments): a dry run shows
the whole plan with one warning line; a real run is refused before any job."""

import os

import pytest
import yaml
from conftest import copy_repository, load_yaml, snakemake, train_jobs

# The first environment missing is named (seed 003's: torch_env's).
MISSING = "' has no bin/trainscale"
# (study, its arguments, train jobs its dry run plans: its grid, all unmeasured).
STUDIES = [
    ("the paper's SLURM study", [], 48),
    ("seed 002", ["--configfile", "studies/seed002.yaml"], 112),
    ("seed 003", ["--configfile", "studies/seed003.yaml"], 72),
]


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """The workflow with .venv alone: no .venv-train, no .venv-torch."""
    repo = copy_repository(str(tmp_path_factory.mktemp("clone") / "repo"), training_envs=False)
    assert not os.path.exists(os.path.join(repo, ".venv-train"))
    return repo


@pytest.mark.parametrize(("study", "args", "jobs"), STUDIES, ids=[s[0] for s in STUDIES])
def test_a_dry_run_shows_the_plan_and_warns_once(clone, study, args, jobs):
    result = snakemake(clone, "-n", "--profile", "profiles/slurm", *args, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert train_jobs(output) == jobs
    warnings = [line for line in output.splitlines() if MISSING in line]
    assert len(warnings) == 1 and warnings[0].startswith("trainscale (a real run is refused)")


def test_the_input_pipeline_study_generates_imagenet_and_builds_its_table(clone):
    args = ["--profile", "profiles/local", "--configfile", "profiles/local/input-pipeline.yaml"]
    result = snakemake(clone, "-n", *args, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    # 2 frameworks x 3 inputs, less torch on TFRecord shards (excluded).
    assert (
        train_jobs(output) == 5
        and "torch-ddp/small_cnn/b16/dataset=imagenet-tfrecord" not in output
    )
    assert output.count("rule generate_imagenet:") == output.count("rule input_pipeline:") == 1


@pytest.mark.parametrize("inspection", ["--dag", "--rulegraph", "--summary"])
def test_the_dag_renders_without_the_environment(clone, inspection):
    result = snakemake(clone, inspection, "--profile", "profiles/slurm", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    # The plan on stdout, the warning on stderr: `--dag | dot` still reads a graph.
    assert MISSING not in result.stdout and MISSING in result.stderr
    if inspection != "--summary":
        assert result.stdout.startswith("digraph snakemake_dag {")
    else:
        assert "results/paper-vgg16/runs/horovod/vgg16/b64/n4g3r1.json" in result.stdout


def test_the_published_cache_rebuilds_its_tables_dry_with_no_warning(clone):
    result = snakemake(clone, "-n", "--configfile", "results/published/config.yaml")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert train_jobs(output) == 0 and "tables" in output and MISSING not in output


def test_a_real_run_is_refused_before_any_job(clone):
    result = snakemake(clone, "--cores", "1", timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    refusals = [line for line in output.splitlines() if line.startswith("Invalid study")]
    assert refusals == [f"Invalid study configuration: {refusals[0].split(': ', 1)[1]}"]
    assert MISSING in refusals[0]
    assert "rule train:" not in output
    assert not os.path.exists(os.path.join(clone, "results", "paper-vgg16"))


def test_environment_check_node_or_none_leaves_the_login_side_silent(clone):
    config = load_yaml(os.path.join(clone, "config.yaml"))
    for where in ("node", "none"):
        config["cluster"]["environment_check"] = where
        with open(os.path.join(clone, f"{where}.yaml"), "w") as handle:
            yaml.safe_dump(config, handle)
        result = snakemake(
            clone, "-n", "-p", "--profile", "profiles/slurm", "--configfile", f"{where}.yaml"
        )
        output = result.stdout + result.stderr
        assert result.returncode == 0, output[-3000:]
        assert MISSING not in output and train_jobs(output) == 48
        checks = output.count("; test -x .venv-")
        # Each train job and each network probe checks its node first.
        assert checks == (48 + output.count("rule probe:") if where == "node" else 0)


def test_the_node_checks_line_is_the_record_of_its_failure(tmp_path):
    # The job's log has the check's own line; SLURM's log has the job's shell
    # command too, which quotes the same words: the record takes the line.
    from trainscale.catalogue.settings import RunSettings
    from trainscale.core.records import lost_job_record
    from trainscale.study.jobs import node_environment_check

    command = node_environment_check(".venv-absent/bin/trainscale")
    job_log, slurm_log = tmp_path / "job.log", tmp_path / "slurm.log"
    said = "trainscale environment check (node): .venv-absent/bin/trainscale is not there on node1"
    job_log.write_text(f"{said}\n")
    slurm_log.write_text(f"Shell command: exec > job.log 2>&1; {command}...\nError in rule train\n")
    settings = RunSettings(framework="tf-single", device="cpu")
    record = lost_job_record(settings, [str(job_log), str(slurm_log)], 600)
    assert record["status"] == "failed"
    assert record["error"].splitlines()[0] == f"{said}; last attempt"
