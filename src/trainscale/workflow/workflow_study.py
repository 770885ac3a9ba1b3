"""A study as the Snakemake workflow sees it: the one call common.smk makes
(`WorkflowStudy.load`), after it has validated the config.

It holds the study's grid points and folder, the data the workflow writes
itself, each job's grid point, environment, command and SLURM shape, the
network probes and their flags, what refuses a real run, and every file of
every analysis (study_outputs). The rule files read only these and the
config; what a job runs is decided here, in Python that tests can import.
"""

from __future__ import annotations

import os
import re
import shlex

from trainscale.catalogue.registry import FRAMEWORKS, framework_spec
from trainscale.core.datasets import DATASETS
from trainscale.core.imagenet import generated_marker
from trainscale.network.probe import TRANSPORTS, ProbeJob, probe_point, study_probes
from trainscale.study import jobs
from trainscale.study.study import (
    RECORD_PATTERN,
    GridPoint,
    check_config,
    knob_axes,
    record_path,
    run_settings,
    train_arguments,
)
from trainscale.study.study_folder import check_study_folder, mislabelled_records
from trainscale.workflow.study_outputs import StudyOutputs

# Snakemake's deployment methods that put `trainscale` on the job's PATH.
PROVIDED = {"CONDA", "APPTAINER"}


class NotInStudy(LookupError):
    """Wildcards that name no job of this study (only the grid's exist)."""


class WorkflowStudy:
    """`config` (validated, defaults filled in) as the workflow runs it."""

    def __init__(self, config: dict, points: list[GridPoint], folder, deployed, examples: str):
        self.config = config
        self.name = config["study"]
        self.results = f"results/{self.name}"
        self.points = points
        self.grid = set(points)
        self.knob_axes = knob_axes(config)  # the grid's, in KNOB_AXES order
        self.folder = folder  # study_folder.StudyFolder: read-only? what to save
        # A cached study's foreign frameworks have no job; the others' settings, once.
        self.runnable = {p: run_settings(config, p) for p in points if p.framework in FRAMEWORKS}
        self.probes = [] if folder.read_only else study_probes(config, points)
        probe_files = [f"{self.results}/{job.stem()}.json" for job in self.probes]
        self.outputs = StudyOutputs(config, points, self.runnable, probe_files, examples)
        # A job runs from its framework's environment unless conda or a
        # container provides it. Where that is checked is the study's choice
        # (cluster.environment_check): here (refusals), node (each job's
        # first line, node_check), or none.
        self.provided = bool(set(deployed) & PROVIDED)
        self.environment_check = config["cluster"]["environment_check"]
        self.checks_environments = not folder.read_only and not self.provided
        # Each job's answer, by its wildcards: a rule reads a dozen of its
        # fields, each through an input function of its own.
        self._jobs: dict[tuple, dict] = {}

    @classmethod
    def load(cls, config: dict, saved: dict | None, deployed, examples: str, cached: bool):
        """The study of `config`, its saved config `saved` (or None) checked
        against it: ConfigError, one line naming the key, if either refuses."""
        points = check_config(config, root=".", cached=cached)
        # The saved config must go on explaining every record of the study.
        folder = check_study_folder(config, points, saved)
        return cls(config, points, folder, deployed, examples)

    # -- the data the workflow writes itself ------------------------------

    def digits_files(self) -> list[str]:
        """The real digits in MNIST's format (rule write_digits)."""
        folder = self.config["benchmark"]["data_dir"]
        kinds = ("images-idx3", "labels-idx1")
        return [f"{folder}/{part}-{kind}-ubyte.gz" for part in ("train", "t10k") for kind in kinds]

    def generated_imagenet_marker(self) -> str:
        """The file rule generate_imagenet writes last (core.imagenet.generated_marker)."""
        return generated_marker(self.config["benchmark"]["data_dir"])

    def python_docs_files(self) -> list[str]:
        """Python's reference text in WikiText's layout (rule write_python_docs)."""
        folder = f"{self.config['benchmark']['data_dir']}/python-docs"
        return [f"{folder}/wiki.{split}.raw" for split in ("train", "valid", "test")]

    def generated_data(self) -> str | None:
        """The file a train job waits for, if the workflow writes its data:
        the digits, Python's text, ImageNet's two layouts of
        benchmark.generate_imagenet_images_per_class, or a random CIFAR-100
        archive of benchmark.generate_cifar100_images; None if the data is the user's."""
        read = {settings.dataset for settings in self.runnable.values()}
        if "digits" in read:
            return self.digits_files()[0]
        if "python-docs" in read:
            return self.python_docs_files()[0]
        if any(DATASETS[name].streams for name in read):
            per_class = self.config["benchmark"].get("generate_imagenet_images_per_class")
            return self.generated_imagenet_marker() if per_class else None
        if self.config["benchmark"].get("generate_cifar100_images"):
            return f"{self.config['benchmark']['data_dir']}/cifar-100-python.tar.gz"
        return None

    # -- wildcards --------------------------------------------------------

    def wildcard_values(self) -> dict[str, str]:
        """Each grid wildcard's regular expression: only this study's values."""
        return {
            "framework": _one_of({p.framework for p in self.points}),
            "model": _one_of({p.model for p in self.points}),
            "knobs_folder": _one_of({p.knobs_folder for p in self.points}),
            "transport": _one_of({job.transport for job in self.probes}),
            "network": _one_of({job.network for job in self.probes}),
        }

    def point_of(self, wildcards: dict) -> GridPoint:
        """The grid point a train job's wildcards name."""
        stem = RECORD_PATTERN.format(**wildcards)
        point = GridPoint.from_path(f"{stem}.json")
        if point not in self.grid:
            raise NotInStudy(f"{stem} is not a point of study {self.name}'s grid")
        return point

    def probe_job(self, wildcards: dict) -> ProbeJob:
        """The probe a probe job's wildcards name."""
        job = ProbeJob(
            wildcards["network"],
            wildcards["container"],
            wildcards["transport"],
            int(wildcards["nodes"]),
            int(wildcards["ranks_per_node"]),
        )
        if job not in self.probes:
            raise NotInStudy(f"{job.stem()} is not a probe of study {self.name}")
        return job

    # -- a train job ------------------------------------------------------

    def trainscale(self, framework: str) -> str:
        """The `trainscale` a job of `framework` runs: on PATH in a conda env
        or container, else from the environment its registry entry names."""
        if self.provided:
            return "trainscale"
        return os.path.join(self.config[framework_spec(framework).environment], "bin", "trainscale")

    def conda_file(self, environment: str) -> str:
        """An environment's conda file (relative to the rule files): its GPU
        build (envs/*-gpu.yaml, as `make setup GPU=1` installs) on GPUs."""
        build = "-gpu" if self.config["benchmark"]["device"] == "gpu" else ""
        return f"../../envs/{environment.removesuffix('_env')}{build}.yaml"

    def node_check(self, trainscale: str) -> str:
        """A job's first shell line under cluster.environment_check: node ('' else)."""
        if not self.checks_environments or self.environment_check != "node":
            return ""
        return jobs.node_environment_check(trainscale)

    def train_job(self, wildcards: dict, attempt: int = 1) -> dict:
        """What a train job's shell line and resources need: `trainscale`, the
        node check, the environment prefix (its network's, and how a node
        fault loses the node), the options, the container's arguments, the
        GPUs per node it asks SLURM for, its conda file and its SLURM resources."""
        key = ("train", *sorted(wildcards.items()), attempt)
        if key not in self._jobs:
            self._jobs[key] = self._train_job(self.point_of(wildcards), attempt)
        return self._jobs[key]

    def _train_job(self, point: GridPoint, attempt: int) -> dict:
        trainscale = self.trainscale(point.framework)
        environment = jobs.train_environment(self.config, point)
        return {
            "trainscale": trainscale,
            "node_check": self.node_check(trainscale),
            "environment": jobs.environment_prefix(environment),
            "options": train_arguments(self.config, point),
            "container": jobs.container_arguments(self.config, point),
            "gpus_per_node": jobs.job_shape(self.config, point)["gpus_per_node"],
            "conda": self.conda_file(framework_spec(point.framework).environment),
            "slurm": jobs.slurm_resources(self.config, point, attempt),
        }

    # -- a probe job ------------------------------------------------------

    def probe(self, wildcards: dict) -> dict:
        """What a probe job's shell line and resources need (as train_job)."""
        key = ("probe", *sorted(wildcards.items()))
        if key not in self._jobs:
            self._jobs[key] = self._probe(self.probe_job(wildcards))
        return self._jobs[key]

    def _probe(self, job: ProbeJob) -> dict:
        point = probe_point(self.config, job)
        settings = run_settings(self.config, point)
        trainscale = self.trainscale(TRANSPORTS[job.transport].framework)
        slurm = jobs.slurm_resources(self.config, point)
        options = [
            *("--transport", job.transport, "--nodes", job.nodes),
            *("--ranks-per-node", job.ranks_per_node, "--device", settings.device),
            *("--network-name", settings.network),
            *("--largest-message-bytes", self.config["probe"]["largest_message_bytes"]),
            *("--repetitions", self.config["probe"]["repetitions"]),
            *("--timeout", self.config["probe"]["timeout_seconds"]),
            *("--requested-gpus-per-node", jobs.job_shape(self.config, point)["gpus_per_node"]),
            *("--requested-cpus-per-task", slurm["cpus_per_task"]),
            *("--container-name", settings.container),
        ]
        quoted = " ".join(shlex.quote(str(option)) for option in options)
        network = jobs.network_environment(self.config, settings.network)
        return {
            "trainscale": trainscale,
            "node_check": self.node_check(trainscale),
            "environment": jobs.environment_prefix(network),
            "options": f"{quoted} {jobs.container_arguments(self.config, point)}",
            "slurm": slurm,
        }

    # -- what refuses a real run -------------------------------------------

    def refusals(self) -> list[str]:
        """What refuses a real run but not a dry one (-n, --dag, --summary),
        which still shows the whole plan with one warning line each."""
        found = []
        if self.checks_environments and self.environment_check == "here":
            trains = [(p.framework, record_path(self.name, p)) for p in self.runnable]
            probes = [
                (TRANSPORTS[job.transport].framework, path)
                for job, path in zip(self.probes, self.outputs.probe_files)
            ]
            found.append(jobs.missing_environment(self.config, trains + probes))
        mislabelled = [] if self.folder.read_only else mislabelled_records(self.results)
        if mislabelled:
            found.append(
                f"results/{self.name} holds {len(mislabelled)} record(s) filed in an old "
                f"layout (knobs their framework does not read, or a comma between knobs; "
                f"e.g. {mislabelled[0][0]}), which would be measured again; move them "
                f"with `trainscale relabel results/{self.name}`"
            )
        return [line for line in found if line]

    def expected_settings(self) -> dict[str, dict]:
        """What each record must have been measured with (collect refuses others)."""
        return {
            record_path(self.name, p): run_settings(self.config, p).to_dict() for p in self.points
        }

    def plan_rows(self) -> list[dict]:
        """The plan table's rows: each train job's point, SLURM shape and record."""
        return [
            {**p.as_dict(), **jobs.job_shape(self.config, p), "record": record_path(self.name, p)}
            for p in self.runnable
        ]


def _one_of(values) -> str:
    # In a group: Snakemake reads an empty constraint as none (.+), and a
    # point without knobs has '' for its knobs_folder.
    return "(?:" + "|".join(re.escape(str(value)) for value in sorted(values)) + ")"
