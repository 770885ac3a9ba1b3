# Grid expansion, configuration checks and input functions. Included first.
import os
import sys

import yaml

# trainscale's TensorFlow-free modules (study, analysis) are importable from the
# checkout even where the package is not installed (e.g. a conda-only setup).
sys.path.insert(0, os.path.join(workflow.basedir, "src"))

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from trainscale.study import (
    ConfigError,
    GridPoint,
    check_config,
    check_schema,
    job_shape,
    record_path,
    run_settings,
    slurm_resources,
    train_arguments,
)

SCHEMA = os.path.join(workflow.basedir, "workflow", "schemas", "config.schema.yaml")
with open(SCHEMA) as handle:
    # One readable line naming the key first; then Snakemake's own validation,
    # which also fills in the schema's defaults.
    try:
        check_schema(config, yaml.safe_load(handle))
    except ConfigError as err:
        raise WorkflowError(f"Invalid study configuration: {err}") from None
validate(config, SCHEMA)
try:
    POINTS = check_config(config, root=".")
except ConfigError as err:
    raise WorkflowError(f"Invalid study configuration: {err}") from None

STUDY = config["study"]
RESULTS = f"results/{STUDY}"
REFERENCE = config.get("reference")
TRAIN_CONTAINER = config.get("train_container")
TRAIN_RETRIES = config["train_retries"]


def trainscale_command():
    """The harness: from the training venv, or on PATH in a conda env or container."""
    methods = {m.name for m in workflow.deployment_settings.deployment_method}
    if methods & {"CONDA", "APPTAINER"}:
        return "trainscale"
    return os.path.join(config["train_env"], "bin", "trainscale")


TRAINSCALE = trainscale_command()
WEAK_SCALING_FRAMEWORK = config["figures"]["weak_scaling_framework"]
POINT_BY_STEM = {point.stem(): point for point in POINTS}
GENERATED_DATA = (
    f"{config['benchmark']['data_dir']}/cifar-100-python.tar.gz"
    if config["benchmark"].get("generate_cifar100_images")
    else None
)


# Wildcards only ever take the values of this study's grid.
wildcard_constraints:
    framework="|".join(sorted({p.framework for p in POINTS})),
    model="|".join(sorted({p.model for p in POINTS})),
    batch_size=r"\d+",
    nodes=r"\d+",
    gpus_per_node=r"\d+",
    repeat=r"\d+",


def point_of(wildcards):
    """The grid point a train job's wildcards name (only points of the grid exist)."""
    stem = (
        f"{wildcards.framework}/{wildcards.model}/b{wildcards.batch_size}/"
        f"n{wildcards.nodes}g{wildcards.gpus_per_node}r{wildcards.repeat}"
    )
    if stem not in POINT_BY_STEM:
        raise WorkflowError(f"{stem} is not a point of study {STUDY}'s grid")
    return POINT_BY_STEM[stem]


def shape(wildcards):
    return job_shape(config, point_of(wildcards))


def slurm(wildcards, attempt=1):
    return slurm_resources(config, point_of(wildcards), attempt)


def record_files():
    return [record_path(STUDY, point) for point in POINTS]


def reference_record_files():
    """The reference study's cached records (read, never produced, by this workflow)."""
    if not REFERENCE:
        return []
    runs = f"results/{REFERENCE}/runs"
    return sorted(
        os.path.join(folder, name)
        for folder, _, names in os.walk(runs)
        for name in names
        if name.endswith(".json") and not name.startswith(".")  # not a temp file
    )


TABLES = ["table1", "table2", "efficiency"] + (["vs_reference"] if REFERENCE else [])
FIGURES = [
    "weak_scaling_hosts",
    "weak_scaling_gpus",
    "efficiency",
    "frameworks",
    "mfu",
] + (["vs_reference"] if REFERENCE else [])


def table_files(extensions=("csv", "md", "tex")):
    return [f"{RESULTS}/tables/{t}.{ext}" for t in TABLES for ext in extensions]


def figure_files(extensions=("png", "pdf")):
    return [f"{RESULTS}/figures/{f}.{ext}" for f in FIGURES for ext in extensions]


def all_outputs():
    # The records are targets themselves: Snakemake does not rebuild a missing
    # intermediate file whose consumers are up to date, and a deleted record
    # must be measured again.
    return [
        *record_files(),
        f"{RESULTS}/plan.csv",
        f"{RESULTS}/throughput.csv",
        *table_files(),
        *figure_files(),
    ]


def write_study_config():
    """Keep results/{study}/config.yaml = the config this study runs with."""
    target = os.path.abspath(f"{RESULTS}/config.yaml")
    used = [*workflow.configfiles, *(workflow.overwrite_configfiles or [])]
    if target in {os.path.abspath(path) for path in used}:
        return  # the study is being run from its own saved config
    from trainscale.records import atomic_write_text

    atomic_write_text(target, yaml.safe_dump(dict(config), sort_keys=False))
