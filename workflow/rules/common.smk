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

from trainscale.study.study import (
    RECORD_PATTERN,
    ConfigError,
    GridPoint,
    check_config,
    record_path,
    run_settings,
    train_arguments,
)
from trainscale.study.jobs import (
    container_arguments,
    environment_prefix,
    job_shape,
    missing_environment,
    network_environment,
    node_environment_check,
    slurm_resources,
    train_environment,
)
from trainscale.study.schema import config_schema, validate_config
from trainscale.catalogue.registry import (
    FRAMEWORKS,
    base_of,
    framework_spec,
    table_order,
)
from trainscale.core.records import record_paths
from trainscale.network.probe import (
    PROBE_PATTERN,
    TRANSPORTS,
    ProbeJob,
    probe_point,
    study_probes,
)
from trainscale.analysis import outputs
from trainscale.launching.examples import examples_of
from trainscale.core.gpt import TEXT_MODELS
from trainscale.study import workflow_hooks
from trainscale.study.study_folder import (
    check_study_folder,
    is_cache,
    mislabelled_records,
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
    # (trainscale.study.study_folder): refused here, before anything runs.
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
    """The conda env file of a train job's framework (the registry names its
    environment's key): envs/train.yaml for train_env, envs/torch.yaml for
    torch_env."""
    return conda_file(framework_spec(point_of(wildcards).framework).environment)


def conda_file(environment):
    """An environment's conda file: its GPU build (envs/*-gpu.yaml, as `make
    setup GPU=1` installs) for a study on GPUs."""
    build = "-gpu" if config["benchmark"]["device"] == "gpu" else ""
    return f"../../envs/{environment.removesuffix('_env')}{build}.yaml"


WEAK_SCALING_FRAMEWORK = config["figures"]["weak_scaling_framework"]
GRID = set(POINTS)
DATA_DIR = config["benchmark"]["data_dir"]
# The data the workflow writes itself, if any: the real digits in MNIST's
# format (write_digits), Python's reference in WikiText's (write_python_docs),
# or a random CIFAR-100 of generate_cifar100_images.
DIGITS_FILES = [
    f"{DATA_DIR}/{prefix}-{kind}-ubyte.gz"
    for prefix in ("train", "t10k")
    for kind in ("images-idx3", "labels-idx1")
]
# The grid points trainscale runs (a cached study may name other frameworks),
# and the data sets they read: benchmark.dataset, or the grid's dataset axis.
RUNNABLE = [p for p in POINTS if p.framework in FRAMEWORKS]
READ_DATASETS = {run_settings(config, p).dataset for p in RUNNABLE}
PYTHON_DOCS_FILES = [
    f"{DATA_DIR}/python-docs/wiki.{split}.raw" for split in ("train", "valid", "test")
]
if "digits" in READ_DATASETS:
    GENERATED_DATA = DIGITS_FILES[0]
elif "python-docs" in READ_DATASETS:
    GENERATED_DATA = PYTHON_DOCS_FILES[0]
elif config["benchmark"].get("generate_cifar100_images"):
    GENERATED_DATA = f"{DATA_DIR}/cifar-100-python.tar.gz"
else:
    GENERATED_DATA = None


def _one_of(values):
    # In a group: Snakemake reads an empty constraint as none (.+), and a
    # point without knobs has '' for its knobs_folder.
    return "(?:" + "|".join(re.escape(str(value)) for value in sorted(values)) + ")"


# The network probes this study runs (config `probe`; trainscale.network.probe).
PROBES = study_probes(config, POINTS) if not FOLDER.read_only else []


def probe_files():
    return [f"{RESULTS}/{job.stem()}.json" for job in PROBES]


def environment_jobs():
    """(framework, output) of each train job and probe: whose environment each needs."""
    trains = [(p.framework, record_path(STUDY, p)) for p in RUNNABLE]
    probes = zip((TRANSPORTS[j.transport].framework for j in PROBES), probe_files())
    return trains + list(probes)


# A train job runs from its framework's environment unless conda or a
# container provides it (trainscale_command). Where it is checked is the
# study's choice (cluster.environment_check): here, as below; node, each job
# checks first (node_check); none, nowhere.
DEPLOYED = {m.name for m in workflow.deployment_settings.deployment_method}
ENVIRONMENT_CHECK = config["cluster"]["environment_check"]
CHECKS_ENVIRONMENTS = not FOLDER.read_only and not DEPLOYED & {"CONDA", "APPTAINER"}


def refusals():
    """What refuses a real run but not a dry one (-n, --dag, --rulegraph,
    --summary, --report), which still shows the whole plan with one warning
    line each; a real run is refused in onstart, before any job starts."""
    found = []
    if CHECKS_ENVIRONMENTS and ENVIRONMENT_CHECK == "here":
        found.append(missing_environment(config, environment_jobs()))
    mislabelled = [] if FOLDER.read_only else mislabelled_records(RESULTS)
    if mislabelled:
        found.append(
            f"results/{STUDY} holds {len(mislabelled)} record(s) filed in an old layout "
            f"(knobs their framework does not read, or a comma between knobs; e.g. "
            f"{mislabelled[0][0]}), which would be measured again; move them with "
            f"`trainscale relabel results/{STUDY}`"
        )
    return [line for line in found if line]


# A job step on a node (remote execution, run with --no-hooks) neither warns
# nor refuses: the walk of the study's records is not repeated in every job.
REFUSALS = [] if workflow.remote_exec else refusals()
if REFUSALS:
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
    stem = RECORD_PATTERN.format(**dict(wildcards.items()))
    point = GridPoint.from_path(f"{stem}.json")
    if point not in GRID:
        raise WorkflowError(f"{stem} is not a point of study {STUDY}'s grid")
    return point


def train_environment_prefix(wildcards):
    """`env NAME=VALUE ... ` for a train job: its network's, and how a node
    fault loses the node ('' for neither)."""
    return environment_prefix(train_environment(config, point_of(wildcards)))


def shape(wildcards):
    return job_shape(config, point_of(wildcards))


def slurm(wildcards, attempt=1):
    return slurm_resources(config, point_of(wildcards), attempt)


def probe_job(wildcards):
    """The probe a probe job's wildcards name (only the study's probes exist)."""
    job = ProbeJob(
        wildcards.network,
        wildcards.container,
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
        *("--container-name", settings.container),
    ]
    quoted = " ".join(shlex.quote(str(option)) for option in options)
    return f"{quoted} {container_arguments(config, point)}"


def network_table_files():
    return outputs.table_files(RESULTS, [outputs.NETWORK])


def network_outputs():
    """The probes, and the table and figure made of them (none without probes)."""
    if not PROBES:
        return []
    figures = outputs.figure_files(RESULTS, [outputs.NETWORK])
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
    return record_paths(f"results/{REFERENCE}/runs")


# The file names of every table and figure: trainscale.analysis.outputs.
TABLES = outputs.study_tables(bool(REFERENCE))
FIGURES = outputs.study_figures(bool(REFERENCE))

# The refactoring analysis: the study's frameworks and each one's
# single-device base (what its example changes), in table order. Only
# trainscale's own have examples (RUNNABLE).
REFACTORED = sorted(
    {p.framework for p in RUNNABLE} | {base_of(p.framework) for p in RUNNABLE},
    key=table_order,
)


def example_files():
    # Relative to the working directory: a checkout moved with its results
    # (or copied) keeps its refactoring table, which Snakemake would rerun
    # for inputs it knows by another absolute path.
    examples = os.path.relpath(os.path.join(workflow.basedir, "examples"))
    return [example.path(examples) for f in REFACTORED for example in examples_of(f)]


def refactoring_files():
    """refactoring.{csv,md,tex}, and a side-by-side diff per example that is not a base."""
    tables = outputs.table_files(RESULTS, [outputs.REFACTORING])
    diffs = [
        f"{RESULTS}/{outputs.REFACTORING}/{example.name}.html"
        for f in REFACTORED
        for example in examples_of(f)
        if not example.is_base
    ]
    return tables, diffs


def probe_comparison_files():
    return outputs.table_files(RESULTS, [outputs.PREDICTED_VS_PROBE])


def predicted_table_files():
    return outputs.table_files(RESULTS, outputs.PREDICTED_TABLES)


def figure_file(name, ext):
    """One figure's file: results/{study}/figures/NAME.EXT."""
    return outputs.figure_files(RESULTS, [name], (ext,))[0]


def table_files():
    return outputs.table_files(RESULTS, TABLES)


def figure_files(formats=outputs.FIGURE_FORMATS):
    return outputs.figure_files(RESULTS, FIGURES, formats)


ACCURACY = config["benchmark"]["mode"] == "accuracy"


def accuracy_files():
    """(tables, figures) of an accuracy study; none for a throughput study."""
    if not ACCURACY:
        return [], []
    tables = outputs.table_files(RESULTS, [outputs.ACCURACY, outputs.RANKS])
    return tables, outputs.figure_files(RESULTS, [outputs.ACCURACY])


# A study whose grid injects a fault (trainscale.core.faults) measures recovery.
FAULTED = any(run_settings(config, p).fault != "none" for p in RUNNABLE)


# A study of text models at 2 or more sizes is a sharding-memory study.
SHARDED = len({p.model for p in RUNNABLE if p.model in TEXT_MODELS}) >= 2


# A study whose grid runs points in a container compares the runtimes.
CONTAINED = any(run_settings(config, p).container != "none" for p in RUNNABLE)


def containers_files():
    """(tables, figures) of what each container cost; none without one."""
    if not CONTAINED:
        return [], []
    tables = outputs.table_files(RESULTS, [outputs.CONTAINERS])
    return tables, outputs.figure_files(RESULTS, [outputs.CONTAINERS])


def sharding_files():
    """(tables, figures) of the memory study; none without two text model sizes."""
    if not SHARDED:
        return [], []
    tables = outputs.table_files(
        RESULTS, [outputs.SHARDING_MEMORY, outputs.SHARDING_CROSSOVER]
    )
    return tables, outputs.figure_files(RESULTS, [outputs.SHARDING_MEMORY])


def recovery_files():
    """(tables, figures) of what the faults cost; none without a fault."""
    if not FAULTED:
        return [], []
    tables = outputs.table_files(RESULTS, [outputs.RECOVERY, outputs.GOODPUT])
    return tables, outputs.figure_files(RESULTS, [outputs.RECOVERY_TIMELINE])


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
        figure_file(outputs.PREDICTED, "png"),
        figure_file(outputs.PREDICTED, "pdf"),
        *figure_files(),
        *accuracy_files()[0],
        *accuracy_files()[1],
        *network_outputs(),
        *recovery_files()[0],
        *recovery_files()[1],
        *sharding_files()[0],
        *sharding_files()[1],
        *containers_files()[0],
        *containers_files()[1],
    ]


def on_start():
    """onstart (real runs only): refuse what a dry run warned of; save the config."""
    from snakemake.logging import logger

    try:
        workflow_hooks.on_start(REFUSALS, FOLDER, RESULTS, logger)
    except workflow_hooks.RunRefused as refused:
        raise WorkflowError(f"Invalid study configuration: {refused}") from None


def on_error():
    """onerror: a record for each train job lost on its last attempt."""
    from snakemake.logging import logger

    workflow_hooks.on_error(workflow, config, logger)
