# The config validated, the study loaded, and the input functions. Included first.
# What a study runs and makes is decided in the package
# (trainscale.workflow.workflow_study); the rule files read STUDY.
import os
import sys

import yaml

# trainscale's TensorFlow-free modules (study, analysis) are importable from the
# checkout even where the package is not installed (e.g. a conda-only setup).
sys.path.insert(0, os.path.join(workflow.basedir, "src"))

from snakemake.exceptions import WorkflowError

from trainscale.analysis import outputs
from trainscale.network.probe import PROBE_PATTERN
from trainscale.study import workflow_hooks
from trainscale.study.schema import config_schema, validate_config
from trainscale.study.study import RECORD_PATTERN, ConfigError
from trainscale.study.study_folder import is_cache
from trainscale.workflow.workflow_study import NotInStudy, WorkflowStudy

# A study of cached records (the published ones) may name frameworks trainscale
# does not run (seed 004's Ray Train): their records are only read.
CACHED = is_cache(config.get("study"))
# The schema file, with what the settings' declarations say filled in.
SCHEMA = config_schema(
    os.path.join(workflow.basedir, "workflow", "schemas", "config.schema.yaml"),
    cached=CACHED,
)


def checked(study_config, what="Invalid study configuration"):
    """The config, validated against the schema, with its defaults filled in;
    an invalid one stops the workflow with one line naming the key."""
    try:
        return validate_config(study_config, SCHEMA)
    except ConfigError as err:
        raise WorkflowError(f"{what}: {err}") from None


def saved_config(path):
    """A study's saved config (defaults filled in), or None if it has none."""
    if not os.path.exists(path):
        return None
    with open(path) as handle:
        return checked(
            yaml.safe_load(handle), f"Invalid saved study configuration {path}"
        )


checked(config)
RESULTS = f"results/{config['study']}"
try:
    STUDY = WorkflowStudy.load(
        config,
        saved_config(f"{RESULTS}/config.yaml"),
        deployed={m.name for m in workflow.deployment_settings.deployment_method},
        # Relative to the working directory: a checkout moved with its
        # results keeps its refactoring table, which Snakemake would rerun
        # for inputs it knows by another absolute path.
        examples=os.path.relpath(os.path.join(workflow.basedir, "examples")),
        cached=CACHED,
    )
except ConfigError as err:
    raise WorkflowError(f"Invalid study configuration: {err}") from None
FILES = STUDY.outputs
GENERATED_DATA = STUDY.generated_data()

# A job step on a node (remote execution, run with --no-hooks) neither warns
# nor refuses: the walk of the study's records is not repeated in every job.
REFUSALS = [] if workflow.remote_exec else STUDY.refusals()
if REFUSALS:
    from snakemake.logging import logger

    for line in REFUSALS:
        logger.warning(f"trainscale (a real run is refused): {line}")


# Wildcards only ever take the values of this study's grid.
wildcard_constraints:
    **STUDY.wildcard_values(),
    batch_size=r"\d+",
    nodes=r"\d+",
    gpus_per_node=r"\d+",
    repeat=r"\d+",
    ranks_per_node=r"\d+",


def train_job(wildcards, attempt=1):
    """What a train job runs (WorkflowStudy.train_job) for its wildcards."""
    try:
        return STUDY.train_job(dict(wildcards.items()), attempt)
    except NotInStudy as err:
        raise WorkflowError(str(err)) from None


def slurm(wildcards, attempt=1):
    """A train job's SLURM resources (trainscale.study.jobs.slurm_resources)."""
    return train_job(wildcards, attempt)["slurm"]


def probe(wildcards):
    """What a probe job runs (WorkflowStudy.probe) for its wildcards."""
    try:
        return STUDY.probe(dict(wildcards.items()))
    except NotInStudy as err:
        raise WorkflowError(str(err)) from None


def rated_network_speeds():
    """A network's rated speed (Gbit/s) by name, where cluster.networks gives one."""
    networks = config["cluster"].get("networks") or {}
    return {
        name: network["rated_gbit_per_s"]
        for name, network in networks.items()
        if "rated_gbit_per_s" in network
    }


def on_start():
    """onstart (real runs only): refuse what a dry run warned of; save the config."""
    from snakemake.logging import logger

    try:
        workflow_hooks.on_start(REFUSALS, STUDY.folder, RESULTS, logger)
    except workflow_hooks.RunRefused as refused:
        raise WorkflowError(f"Invalid study configuration: {refused}") from None


def on_error():
    """onerror: a record for each train job lost on its last attempt."""
    from snakemake.logging import logger

    workflow_hooks.on_error(workflow, config, logger)
