# Grid expansion, configuration checks and input functions. Included first.
import os
import re
import shlex
import sys

import yaml

# trainscale's TensorFlow-free modules (study, analysis) are importable from the
# checkout even where the package is not installed (e.g. a conda-only setup).
sys.path.insert(0, os.path.join(workflow.basedir, "src"))

from snakemake.exceptions import WorkflowError

from trainscale.study import (
    RECORD_PATTERN,
    ConfigError,
    GridPoint,
    check_config,
    missing_environment,
    environment_prefix,
    job_shape,
    network_environment,
    node_environment_check,
    record_path,
    run_settings,
    slurm_resources,
    train_arguments,
)
from trainscale.schema import config_schema, validate_config
from trainscale.registry import FRAMEWORKS, base_of, framework_spec, table_order
from trainscale.records import is_record_name
from trainscale.probe import (
    PROBE_PATTERN,
    TRANSPORTS,
    ProbeJob,
    probe_point,
    study_probes,
)
from trainscale.study_folder import (
    check_study_folder,
    is_cache,
    mislabelled_records,
    save_study_config,
)

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
STUDY = config["study"]
RESULTS = f"results/{STUDY}"
try:
    POINTS = check_config(config, root=".", cached=CACHED)
    # The saved config must go on explaining every record of the study
    # (trainscale.study_folder): refused here, before anything runs.
    FOLDER = check_study_folder(config, POINTS, saved_config(f"{RESULTS}/config.yaml"))
except ConfigError as err:
    raise WorkflowError(f"Invalid study configuration: {err}") from None

REFERENCE = config.get("reference")
TRAIN_CONTAINER = config.get("train_container")
TRAIN_RETRIES = config["train_retries"]


def trainscale_command(wildcards):
    """The harness for a train job: on PATH in a conda env or container, else
    from the environment the registry names for its framework (train_env)."""
    if DEPLOYED & {"CONDA", "APPTAINER"}:
        return "trainscale"
    environment = framework_spec(point_of(wildcards).framework).environment
    return os.path.join(config[environment], "bin", "trainscale")


def node_check(command):
    """A job's first shell line under cluster.environment_check: node ('' else),
    for the trainscale `command(wildcards)` names."""

    def line(wildcards):
        if not CHECKS_ENVIRONMENTS or ENVIRONMENT_CHECK != "node":
            return ""
        return node_environment_check(command(wildcards))

    return line


def conda_env(wildcards):
    """The conda env file of a train job's framework: envs/train.yaml for
    train_env, envs/torch.yaml for torch_env (the registry names the key)."""
    environment = framework_spec(point_of(wildcards).framework).environment
    return f"../../envs/{environment.removesuffix('_env')}.yaml"


WEAK_SCALING_FRAMEWORK = config["figures"]["weak_scaling_framework"]
GRID = set(POINTS)
DATA_DIR = config["benchmark"]["data_dir"]
# The data the workflow writes itself, if any: the real digits in MNIST's
# format (write_digits), or a random CIFAR-100 of generate_cifar100_images.
DIGITS_FILES = [
    f"{DATA_DIR}/{prefix}-{kind}-ubyte.gz"
    for prefix in ("train", "t10k")
    for kind in ("images-idx3", "labels-idx1")
]
# The grid points trainscale runs (a cached study may name other frameworks),
# and the data sets they read: benchmark.dataset, or the grid's dataset axis.
RUNNABLE = [p for p in POINTS if p.framework in FRAMEWORKS]
READ_DATASETS = {run_settings(config, p).dataset for p in RUNNABLE}
if "digits" in READ_DATASETS:
    GENERATED_DATA = DIGITS_FILES[0]
elif config["benchmark"].get("generate_cifar100_images"):
    GENERATED_DATA = f"{DATA_DIR}/cifar-100-python.tar.gz"
else:
    GENERATED_DATA = None


# A record's path below runs/ (and its log's below logs/train/), as wildcards:
# knobs_folder is '' or a folder naming the knobs the point's framework reads.
RECORD_STEM = RECORD_PATTERN


def _one_of(values):
    # In a group: Snakemake reads an empty constraint as none (.+), and a
    # point without knobs has '' for its knobs_folder.
    return "(?:" + "|".join(re.escape(str(value)) for value in sorted(values)) + ")"


# The network probes this study runs (config `probe`; trainscale.probe).
PROBES = study_probes(config, POINTS) if not FOLDER.read_only else []


def environment_jobs():
    """(framework, output) of each train job and probe: whose environment each needs."""
    trains = [(p.framework, record_path(STUDY, p)) for p in RUNNABLE]
    probes = [
        (TRANSPORTS[j.transport].framework, f"{RESULTS}/{j.stem()}.json")
        for j in PROBES
    ]
    return trains + probes


# A train job runs from its framework's environment unless conda or a
# container provides it (trainscale_command). Where it is checked is the
# study's choice (cluster.environment_check): here, as below; node, each job
# checks first (node_check); none, nowhere.
DEPLOYED = {m.name for m in workflow.deployment_settings.deployment_method}
ENVIRONMENT_CHECK = config["cluster"]["environment_check"]
CHECKS_ENVIRONMENTS = not FOLDER.read_only and not DEPLOYED & {"CONDA", "APPTAINER"}
MISLABELLED = [] if FOLDER.read_only else mislabelled_records(RESULTS)
# What refuses a real run but not a dry one (-n, --dag, --rulegraph,
# --summary, --report), which still shows the whole plan with one warning line
# each; a real run is refused in onstart, before any job starts.
REFUSALS = [
    (
        missing_environment(config, environment_jobs())
        if CHECKS_ENVIRONMENTS and ENVIRONMENT_CHECK == "here"
        else ""
    ),
    (
        f"results/{STUDY} holds {len(MISLABELLED)} record(s) filed under knobs their "
        f"framework does not read (e.g. {MISLABELLED[0][0]}), which would be measured "
        f"again; move them with `trainscale relabel results/{STUDY}`"
        if MISLABELLED
        else ""
    ),
]
REFUSALS = [line for line in REFUSALS if line]
if not workflow.remote_exec:
    from snakemake.logging import logger

    for line in REFUSALS:
        logger.warning(f"trainscale (a real run is refused): {line}")


# Wildcards only ever take the values of this study's grid.
wildcard_constraints:
    framework=_one_of({p.framework for p in POINTS}),
    model=_one_of({p.model for p in POINTS}),
    knobs_folder=_one_of({p.knobs_folder for p in POINTS}),
    batch_size=r"\d+",
    nodes=r"\d+",
    gpus_per_node=r"\d+",
    repeat=r"\d+",
    transport=_one_of({job.transport for job in PROBES}),
    network=_one_of({job.network for job in PROBES}),
    ranks_per_node=r"\d+",


def point_of(wildcards):
    """The grid point a train job's wildcards name (only points of the grid exist)."""
    stem = RECORD_STEM.format(**dict(wildcards.items()))
    point = GridPoint.from_path(f"{stem}.json")
    if point not in GRID:
        raise WorkflowError(f"{stem} is not a point of study {STUDY}'s grid")
    return point


def network_prefix(wildcards):
    """`env NAME=VALUE ... ` for a train job's network ('' for the default route)."""
    network = run_settings(config, point_of(wildcards)).network
    return environment_prefix(network_environment(config, network))


def shape(wildcards):
    return job_shape(config, point_of(wildcards))


def slurm(wildcards, attempt=1):
    return slurm_resources(config, point_of(wildcards), attempt)


def probe_job(wildcards):
    """The probe a probe job's wildcards name (only the study's probes exist)."""
    job = ProbeJob(
        wildcards.network,
        wildcards.transport,
        int(wildcards.nodes),
        int(wildcards.ranks_per_node),
    )
    if job not in PROBES:
        raise WorkflowError(f"{job.stem()} is not a probe of study {STUDY}")
    return job


def probe_slurm(wildcards):
    return slurm_resources(config, probe_point(config, probe_job(wildcards)))


def probe_command(wildcards):
    """The probe's trainscale: its transport's framework's environment (as train jobs)."""
    if DEPLOYED & {"CONDA", "APPTAINER"}:
        return "trainscale"
    environment = framework_spec(TRANSPORTS[wildcards.transport].framework).environment
    return os.path.join(config[environment], "bin", "trainscale")


def probe_network_prefix(wildcards):
    settings = run_settings(config, probe_point(config, probe_job(wildcards)))
    return environment_prefix(network_environment(config, settings.network))


def probe_options(wildcards):
    """`trainscale probe`'s options for a probe job, each shell-quoted."""
    job, probe = probe_job(wildcards), config["probe"]
    point = probe_point(config, job)
    settings = run_settings(config, point)
    options = [
        *("--transport", job.transport, "--nodes", job.nodes),
        *("--ranks-per-node", job.ranks_per_node, "--device", settings.device),
        *("--network-name", settings.network),
        *("--largest-message-bytes", probe["largest_message_bytes"]),
        *("--repetitions", probe["repetitions"], "--timeout", probe["timeout_seconds"]),
        *("--requested-gpus-per-node", job_shape(config, point)["gpus_per_node"]),
        *("--requested-cpus-per-task", probe_slurm(wildcards)["cpus_per_task"]),
    ]
    return " ".join(shlex.quote(str(option)) for option in options)


def probe_files():
    return [f"{RESULTS}/{job.stem()}.json" for job in PROBES]


def network_table_files():
    return [f"{RESULTS}/tables/network.{ext}" for ext in ("csv", "md", "tex")]


def network_outputs():
    """The probes, and the table and figure made of them (none without probes)."""
    if not PROBES:
        return []
    figures = [f"{RESULTS}/figures/network.{ext}" for ext in ("png", "pdf")]
    return [*probe_files(), *network_table_files(), *figures]


def rated_network_speeds():
    """A network's rated speed (Gbit/s) by name, where cluster.networks gives one."""
    networks = config["cluster"].get("networks") or {}
    return {
        name: network["rated_gbit_per_s"]
        for name, network in networks.items()
        if "rated_gbit_per_s" in network
    }


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
        if is_record_name(name)
    )


TABLES = ["table1", "table2", "efficiency", "cross_ecosystem"] + (
    ["vs_reference"] if REFERENCE else []
)
FIGURES = [
    "weak_scaling_hosts",
    "weak_scaling_gpus",
    "efficiency",
    "frameworks",
    "mfu",
    "memory",
    "refactoring_tradeoff",
] + (["vs_reference"] if REFERENCE else [])

# The refactoring analysis: the study's frameworks and each one's
# single-device base (what its example changes), in table order. Only
# trainscale's own have examples (RUNNABLE).
REFACTORED = sorted(
    {p.framework for p in RUNNABLE} | {base_of(p.framework) for p in RUNNABLE},
    key=table_order,
)


def example_files():
    return [
        os.path.join(workflow.basedir, "examples", framework_spec(f).example)
        for f in REFACTORED
    ]


def refactoring_files():
    """refactoring.{csv,md,tex}, and a side-by-side diff per framework that is not a base."""
    tables = [f"{RESULTS}/tables/refactoring.{ext}" for ext in ("csv", "md", "tex")]
    diffs = [f"{RESULTS}/refactoring/{f}.html" for f in REFACTORED if base_of(f) != f]
    return tables, diffs


PREDICTED_TABLES = ["predicted", "predicted_parameters", "predicted_holdout"]


def probe_comparison_files():
    return [
        f"{RESULTS}/tables/predicted_vs_probe.{ext}" for ext in ("csv", "md", "tex")
    ]


def predicted_table_files():
    return [
        f"{RESULTS}/tables/{t}.{ext}"
        for t in PREDICTED_TABLES
        for ext in ("csv", "md", "tex")
    ]


def table_files(extensions=("csv", "md", "tex")):
    return [f"{RESULTS}/tables/{t}.{ext}" for t in TABLES for ext in extensions]


def figure_files(extensions=("png", "pdf")):
    return [f"{RESULTS}/figures/{f}.{ext}" for f in FIGURES for ext in extensions]


ACCURACY = config["benchmark"]["mode"] == "accuracy"


def accuracy_files():
    """(tables, figures) of an accuracy study; none for a throughput study."""
    if not ACCURACY:
        return [], []
    tables = [
        f"{RESULTS}/tables/{t}.{ext}"
        for t in ("accuracy", "ranks")
        for ext in ("csv", "md", "tex")
    ]
    return tables, [f"{RESULTS}/figures/accuracy.{ext}" for ext in ("png", "pdf")]


def all_outputs():
    # The records are targets themselves: Snakemake does not rebuild a missing
    # intermediate file whose consumers are up to date, and a deleted record
    # must be measured again.
    return [
        *record_files(),
        f"{RESULTS}/plan.csv",
        f"{RESULTS}/throughput.csv",
        *table_files(),
        *refactoring_files()[0],
        *refactoring_files()[1],
        *predicted_table_files(),
        *probe_comparison_files(),
        f"{RESULTS}/figures/predicted.png",
        f"{RESULTS}/figures/predicted.pdf",
        *figure_files(),
        *accuracy_files()[0],
        *accuracy_files()[1],
        *network_outputs(),
    ]


def refuse_a_real_run():
    """onstart (real runs only): what a dry run only warns of."""
    if REFUSALS:
        raise WorkflowError(f"Invalid study configuration: {REFUSALS[0]}")


def write_study_config():
    """onstart: results/{study}/config.yaml = the union of the grids this study
    has run (checked at parse time); the version it replaces goes to
    config.history/. Never in a read-only (cached) study."""
    from snakemake.logging import logger

    if FOLDER.config_to_save is None:
        return
    text = yaml.safe_dump(FOLDER.config_to_save, sort_keys=False)
    kept = save_study_config(RESULTS, text)
    if kept:
        logger.info(
            f"trainscale: {RESULTS}/config.yaml extended; the previous one is {kept}"
        )


def last_slurm_log(job):
    """The SLURM log of a job's last attempt (a list of none or one), where the
    SLURM plugin keeps them: .snakemake/slurm_logs/rule_<rule>/<wildcard values
    joined by _>/<SLURM job id>.log, one per attempt.
    """
    folder = os.path.join(
        ".snakemake",
        "slurm_logs",
        f"rule_{job.rule.name}",
        "_".join(job.wildcards).replace(os.sep, "_"),
    )
    if not os.path.isdir(folder):
        return []
    logs = [
        os.path.join(folder, name)
        for name in os.listdir(folder)
        if name.endswith(".log")
    ]
    return [max(logs, key=os.path.getmtime)] if logs else []


def record_lost_train_jobs():
    """onerror: a record (`failed`, or `timeout` at SLURM's time limit) for each
    train job that ended on its last attempt without writing one (SLURM ended
    it, or its launcher was killed).

    The run records every failure it sees itself; these are the ones Snakemake
    saw instead, and it deletes a failed job's output. Only jobs whose retries
    are spent count: Snakemake's scheduler keeps exactly those in `failed`; jobs
    it cancelled on Ctrl-C are not there and stay unrecorded (rerun them with
    --rerun-incomplete). The next run builds the tables with FAILED there.
    """
    from snakemake.logging import logger
    from trainscale.records import atomic_write_json, lost_job_record

    failed = getattr(getattr(workflow, "scheduler", None), "failed", None)
    if failed is None:
        logger.warning(
            "trainscale: this Snakemake does not say which jobs failed; "
            "train jobs that failed on their last attempt have no record"
        )
        return
    written = []
    for job in failed:
        if job.rule.name != "train" or os.path.exists(job.output.record):
            continue
        settings = run_settings(config, point_of(job.wildcards))
        logs = [*job.log, *last_slurm_log(job)]
        time_limit_seconds = slurm(job.wildcards, job.attempt)["runtime"] * 60
        record = lost_job_record(settings, logs, time_limit_seconds)
        atomic_write_json(job.output.record, record)
        written.append(job.output.record)
    if written:
        logger.error(
            f"trainscale: {len(written)} grid point(s) failed on their last attempt; "
            "recorded from their logs (the tables will show FAILED or TIMEOUT): "
            + ", ".join(written)
            + ". Run the same command again to build the tables; to retry those "
            "points instead, delete their records."
        )
