"""Studies on the SLURM lab (tests/slurm-lab, the slurm_lab fixture of
conftest.py): each in a fresh copy of the workflow, through profiles/slurm,
started in the background so that all of them share the lab at once, as a
cluster's users do (Campaign). Partition lab's nodes run the studies that
end as they should; partition faults' nodes are the ones lost under jobs.
A test waits for its study, then checks what it left."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from conftest import LAB, REPO, copy_repository, snakemake, start_snakemake

from trainscale.core.records import is_record_name


def study_config(**changes) -> dict:
    """tests/slurm-lab/study.yaml, with `section__key=value` or `key=value` changes."""
    with open(os.path.join(REPO, "tests", "slurm-lab", "study.yaml")) as handle:
        config = yaml.safe_load(handle)
    for key, value in changes.items():
        section, _, name = key.partition("__")
        if name:
            config[section][name] = value
        else:
            config[section] = value
    return config


# The lab's jobs last seconds, not a cluster's minutes: their states are read
# 3 s after a submission or an ending (the profile's 10 s suits a cluster);
# after a read that finds none ended, the plugin waits 10 s longer each time.
# The network study's test (one job at a time) took 74 s so, 84 s with 10.
LAB_STATUS_CHECKS = ["--slurm-init-seconds-before-status-checks", "3"]


def profile_args(repo: str, name: str, config: dict) -> list[str]:
    """Write `config` into the repository copy; the arguments that run it on the lab."""
    with open(os.path.join(repo, name), "w") as handle:
        yaml.safe_dump(config, handle)
    return ["--profile", "profiles/slurm", "--configfile", name, *LAB_STATUS_CHECKS]


def records(repo: str, study: str) -> dict[str, dict]:
    """The study's records, as the workflow reads them: a hidden temp file
    (records.atomic_path) that a killed attempt left beside one is not a record."""
    runs = Path(repo, "results", study, "runs")
    found = (p for p in runs.rglob("*.json") if is_record_name(p.name))
    return {str(p.relative_to(runs)): json.loads(p.read_text()) for p in found}


def assert_hosts_follow(hosts: list[str], pattern: str, in_task_order: bool = True) -> None:
    """`hosts` (a record's, rank by rank) are lab nodes laid out as `pattern`
    says: "aabb" is two ranks on one node, then two on another. With 4 nodes
    and other jobs beside it, a job gets whichever nodes SLURM picks; a driver
    that ranks its workers itself (Ray) may order them otherwise."""
    assert len(hosts) == len(pattern), (hosts, pattern)
    assert all(host.startswith("node") for host in hosts), hosts
    names = {}
    for letter, host in zip(pattern, sorted(hosts) if not in_task_order else hosts):
        assert names.setdefault(letter, host) == host, (hosts, pattern)
    assert len(set(names.values())) == len(names), (hosts, pattern)  # one node per letter


@dataclass
class LabStudy:
    """A study's Snakemake run on the lab, in the background, its output in a file."""

    repo: str
    args: list[str]
    process: subprocess.Popen
    output_file: Path
    dry_run_output: str = ""  # Snakemake's -n, with start(dry_run=True)

    @classmethod
    def start(
        cls, folder: Path, name: str, config: dict, until: str = "", dry_run: bool = False
    ) -> LabStudy:
        """`until`: run only the jobs up to that rule (Snakemake's --until);
        `args` stay the whole study's, for the test's later runs. `dry_run`:
        Snakemake's plan (-n) first, before the study has begun: a dry run
        beside the running study would see its jobs under way."""
        repo = copy_repository(str(folder / "repo"))
        args = profile_args(repo, f"{name}.yaml", config)
        dry_run_output = ""
        if dry_run:
            dry = snakemake(repo, "-n", *args)
            dry_run_output = dry.stdout + dry.stderr
        output_file = folder / "snakemake.out"
        first = [*args, "--until", until] if until else args
        with open(output_file, "w") as output:
            process = start_snakemake(repo, *first, stdout=output, stderr=subprocess.STDOUT)
        return cls(repo, args, process, output_file, dry_run_output)

    def wait(self, timeout: float = 1200) -> tuple[int, str]:
        """Its exit status and output, once it has ended."""
        try:
            self.process.wait(timeout=timeout)
        finally:
            self.stop()
        return self.process.returncode, self.output_file.read_text()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(2)  # SIGINT: Snakemake cancels its SLURM jobs
            self.process.wait(timeout=120)


def running_job(repo: str, comment: str, deadline: float) -> str:
    """The id of the job of the study in `repo` (its working directory) whose
    comment (the SLURM plugin's: its wildcards) holds `comment`, once it runs."""
    while time.monotonic() < deadline:
        queue = subprocess.run(
            ["squeue", "-h", "-o", "%i|%T|%Z|%k"], capture_output=True, text=True
        ).stdout.splitlines()
        for line in queue:
            job, state, workdir, job_comment = (line.split("|", 3) + ["", "", ""])[:4]
            if workdir == repo and comment in job_comment and state == "RUNNING":
                return job
        time.sleep(0.2)
    raise AssertionError(f"no job of {repo} with {comment!r} ran")


def in_timed_blocks(log: Path) -> bool:
    """Whether a train job's log (each attempt writes it anew) shows a timed block."""
    try:
        return "block 1/" in log.read_text()
    except OSError:
        return False


# ---------------------------------------------------------------------------
# Lost nodes (partition faults)
# ---------------------------------------------------------------------------


def node_loss_study() -> dict:
    """A 2-node Horovod job on partition faults, long enough to be running
    when a node dies, one retry."""
    study = "slurm-lab-node-loss"
    config = study_config(study=study, train_retries=1)
    config["benchmark"].update(data_dir=f"results/{study}/data", blocks=150)
    config["benchmark"]["steps_per_block"] = 20
    config["grid"].update(framework=["horovod"], nodes=[2], gpus_per_node=[1])
    config["constraints"] = {}  # the lab study's are about its own grid
    config["cluster"]["partition"] = "faults"
    return config


def elastic_node_loss_study() -> dict:
    """tests/slurm-lab/faults.yaml for torch-elastic on partition faults, the
    node fault alone (its node_fault_command loses the node)."""
    with open(os.path.join(REPO, "tests", "slurm-lab", "faults.yaml")) as handle:
        config = yaml.safe_load(handle)
    config["grid"].update(framework=["torch-elastic"], fault=["kill-node1-step12"])
    # (The repository's copy has no tests/: the lab's script where it is.)
    command = config["cluster"]["node_fault_command"]
    config["cluster"]["node_fault_command"] = command.replace("tests/slurm-lab/lab.sh", LAB)
    config["cluster"]["partition"] = "faults"
    return config


def nodes_training(repo: str) -> set[int]:
    """The lab nodes on which a `trainscale train` process of the study in
    `repo` (its working directory) runs now."""
    found = set()
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    for line in namespaces.stdout.split("\n"):
        name = line.split(" ")[0]
        if not name.startswith("tslab-node"):
            continue
        pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
        for pid in pids.stdout.split():
            try:
                training = b"trainscale\0train\0" in Path(f"/proc/{pid}/cmdline").read_bytes()
                if training and os.readlink(f"/proc/{pid}/cwd") == repo:
                    found.add(int(name.removeprefix("tslab-node")))
            except OSError:
                continue
    return found


def revive_down_nodes(partition: str = "faults") -> None:
    """A fresh slurmd on every node of `partition` that SLURM has down."""
    for node in _down_nodes(partition):
        subprocess.run([LAB, "revive-node", node], check=True, timeout=120)


def nodes_back_after_the_fault(study: LabStudy, outcome: dict) -> None:
    """Once the elastic study has ended, its lost node back: its own
    node_fault_command revives it once SLURM has it down; a node still down
    a while later is revived here."""
    study.process.wait(timeout=900)
    deadline = time.monotonic() + 120
    while _down_nodes() and time.monotonic() < deadline:
        time.sleep(0.5)
    revive_down_nodes()


def _down_nodes(partition: str = "faults") -> list[str]:
    nodes = subprocess.run(
        ["sinfo", "-h", "-N", "-p", partition, "-o", "%N %t"], capture_output=True, text=True
    ).stdout.split("\n")
    return [line.split(" ")[0] for line in nodes if line.split(" ")[-1].startswith("down")]


def kill_a_node_under_each_attempt(study: LabStudy, outcome: dict) -> None:
    """The node-loss study's job, then its retry: once each trains on 2 nodes
    (its log, written anew by each attempt, shows a timed block), kill the
    second of them (not the first: it runs the batch step, the launcher).
    Their nodes into `outcome` (or why not); the dead ones revived at the end."""
    log = Path(study.repo, "results/slurm-lab-node-loss/logs/train/horovod/small_cnn/b16")
    log = log / "n2g1r1.log"
    try:
        outcome["first"], dead = _kill_a_node_of_the_job(study, set(), log)
        # The retry, a new job: the plugin leaves both of the first's nodes out.
        outcome["retry"], _ = _kill_a_node_of_the_job(study, outcome["first"] | {dead}, log)
    except Exception as err:  # the test reports it
        outcome["error"] = f"{type(err).__name__}: {err}"
    finally:
        study.process.wait(timeout=900)
        revive_down_nodes()


def _kill_a_node_of_the_job(study: LabStudy, spared: set[int], log: Path) -> tuple[set[int], int]:
    deadline = time.monotonic() + 600
    # The log first: reading it costs nothing, asking every node's
    # namespace for its processes does.
    while not (in_timed_blocks(log) and len(nodes := nodes_training(study.repo) - spared) >= 2):
        assert time.monotonic() < deadline and study.process.poll() is None, "never trained"
        time.sleep(0.2)
    dead = max(nodes)
    subprocess.run([LAB, "kill-node", str(dead)], check=True)
    return nodes, dead


# ---------------------------------------------------------------------------
# Every study at once
# ---------------------------------------------------------------------------


@dataclass
class Campaign:
    """Studies started at once, and what threads beside them do to their jobs."""

    studies: dict[str, LabStudy] = field(default_factory=dict)
    outcomes: dict[str, dict] = field(default_factory=dict)
    threads: dict[str, threading.Thread] = field(default_factory=dict)

    def start(
        self,
        folder: Path,
        name: str,
        config: dict,
        action=None,
        until: str = "",
        dry_run: bool = False,
    ) -> LabStudy:
        """Study `name` on the lab (up to rule `until`; its plan first with
        `dry_run`); `action(study, outcome)` in a thread beside it."""
        self.studies[name] = study = LabStudy.start(folder, name, config, until, dry_run)
        if action is not None:
            self.outcomes[name] = {}
            thread = threading.Thread(target=action, args=(study, self.outcomes[name]))
            thread.start()
            self.threads[name] = thread
        return study

    def outcome(self, name: str) -> dict:
        """What the thread beside study `name` saw, once both have ended."""
        self.studies[name].wait()
        self.threads[name].join(timeout=900)
        outcome = self.outcomes[name]
        assert "error" not in outcome, outcome["error"]
        return outcome

    def stop(self) -> None:
        for study in self.studies.values():
            study.stop()
        for thread in self.threads.values():
            thread.join(timeout=900)


def lab_has_cgroups() -> bool:
    path = Path("/var/tmp/trainscale-slurm-lab/cgroups")
    return path.exists() and path.read_text().strip() == "1"


# The time-limit study's SLURM limit (side_studies; test_slurm bounds its run by it).
TIME_LIMIT_MINUTES = 4


def side_studies() -> dict[str, dict]:
    """The studies beside the lab study, each showing one way a point ends."""
    gloo = study_config(study="slurm-lab-gloo", benchmark__horovod_launcher="gloo")
    gloo["benchmark"]["data_dir"] = "results/slurm-lab-gloo/data"
    gloo["grid"].update(framework=["horovod"], nodes=[2], gpus_per_node=[2])
    # No retries here: the point is to see the failure, not to recover from it.
    cancel = study_config(study="slurm-lab-cancel", train_retries=0)
    # Long enough to be cancelled in its timed blocks, whatever this CPU's speed.
    cancel["benchmark"].update(
        data_dir="results/slurm-lab-cancel/data", blocks=100000, time_budget_seconds=10
    )
    # The 2-node job is cancelled; the 1-node one beside it ends as it should.
    cancel["grid"].update(framework=["horovod"], nodes=[1, 2], gpus_per_node=[1])
    cancel["constraints"] = {}
    # A 4-minute limit and a run that would never end: the run's watchdog
    # (the limit less a 60 s margin, at least 30 s) stops it first. Its one
    # rank freezes (SIGSTOP) a second into its timed steps, for longer than
    # the limit: a hung run reaches the limit as an endless one does, without
    # spending cores the other studies' jobs need. The watchdog's ~160 s must
    # outlast the rank's start-up to its timed steps on a loaded slow VM
    # several times over (a 2-minute limit's ~40 s did not, on a slow EPYC);
    # the frozen rank costs no CPU meanwhile.
    limit = study_config(study="slurm-lab-limit", train_retries=0)
    limit["benchmark"].update(
        data_dir="results/slurm-lab-limit/data", blocks=1000000, fault="stop-rank0-at1s-for600s"
    )
    limit["cluster"]["runtime_minutes"] = TIME_LIMIT_MINUTES
    limit["grid"].update(framework=["horovod"], nodes=[1], gpus_per_node=[1])
    limit["constraints"] = {}  # the lab study's are about its own grid
    # cluster.environment_check: node, and a training environment not there.
    noenv = study_config(study="slurm-lab-noenv", train_retries=0, train_env=".venv-absent")
    noenv["cluster"]["environment_check"] = "node"
    noenv["grid"].update(framework=["tf-mirrored"], nodes=[1], gpus_per_node=[2])
    studies = {"gloo": gloo, "cancel": cancel, "limit": limit, "noenv": noenv}
    studies["systems"] = systems_study()
    if lab_has_cgroups():
        # VGG-16 at batch 64 does not fit in 900 MB.
        oom = study_config(study="slurm-lab-oom", train_retries=0)
        oom["benchmark"]["data_dir"] = "results/slurm-lab-oom/data"
        oom["grid"].update(framework=["tf-single"], nodes=[1], gpus_per_node=[1])
        oom["grid"].update(model=["vgg16"], batch_size=[64])
        oom["cluster"]["mem_mb_per_gpu"] = 900
        studies["oom"] = oom
    return studies


# The lab's two node types (lab.sh: GRES types fakea and fakeb, partitions
# lab-a and lab-b), as a study declares a cluster's (cluster.systems).
LAB_SYSTEMS = {
    "lab-a": {"partition": "lab-a", "gpu_model": "fakea", "gpus_per_node": 2},
    "lab-b": {"partition": "lab-b", "gpu_model": "fakeb", "gpus_per_node": 2},
}


def systems_study() -> dict:
    """One DDP point on each of the lab's two systems: SLURM must send each
    to its own partition's nodes (on one machine's cores, the routing is
    proved, not a hardware difference)."""
    config = study_config(study="slurm-lab-systems", train_retries=0)
    config["benchmark"]["data_dir"] = "results/slurm-lab-systems/data"
    config["grid"].update(framework=["torch-ddp"], nodes=[1], gpus_per_node=[2])
    config["grid"]["system"] = list(LAB_SYSTEMS)
    config["constraints"] = {}  # the lab study's are about its own grid
    config["cluster"]["systems"] = LAB_SYSTEMS
    return config


def cancel_in_training(study: LabStudy, outcome: dict) -> None:
    """scancel the cancel study's 2-node Horovod job once it trains (its log,
    the train rule's, shows a timed block); its job id into `outcome`."""
    try:
        deadline = time.monotonic() + 900
        # The plugin's job comment: the wildcards' values joined by _, the
        # knobs folder's (empty: Horovod reads no knob of this grid) among them.
        victim = running_job(study.repo, "wildcards_horovod_small_cnn_16__2_1_1", deadline)
        log = Path(study.repo, "results/slurm-lab-cancel/logs/train/horovod/small_cnn/b16")
        while not in_timed_blocks(log / "n2g1r1.log"):
            assert time.monotonic() < deadline and study.process.poll() is None, "never trained"
            time.sleep(0.2)
        subprocess.run(["scancel", victim], check=True)
        outcome["job"] = victim
    except Exception as err:  # the test reports it
        outcome["error"] = f"{type(err).__name__}: {err}"


def start_campaign(new_folder) -> Campaign:
    """Every lab study of the suite, started at once (new_folder(name): a
    folder of its own for each): the lab study (tests/slurm-lab/study.yaml,
    its dry run first), the studies beside it, and the lost nodes'."""
    campaign = Campaign()
    campaign.start(new_folder("lab"), "lab", study_config(), dry_run=True)
    # The studies beside the lab study stop at what their tests read (the
    # records; the OOM study's table): the lab study runs every rule, and the
    # analyses of the others' records, on this machine's cores, would only
    # slow the lab's jobs.
    for name, config in side_studies().items():
        action = cancel_in_training if name == "cancel" else None
        until = {"oom": "tables", "systems": "systems"}.get(name, "train")
        campaign.start(new_folder(name), name, config, action, until)
    loss = node_loss_study()
    campaign.start(
        new_folder("node-loss"), "node-loss", loss, kill_a_node_under_each_attempt, "train"
    )
    elastic = elastic_node_loss_study()
    campaign.start(new_folder("elastic"), "elastic", elastic, nodes_back_after_the_fault, "train")
    return campaign
