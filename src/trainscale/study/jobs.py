"""What one grid point asks of a cluster: its job's shape in SLURM's terms,
the environment its ranks run with, and the check that its training
environment is there (on the submitting host, or first thing on the node).

Pure Python: the workflow (trainscale.workflow.workflow_study) reads these
for every job; a point's settings come from trainscale.study.study.run_settings.
"""

from __future__ import annotations

import os
import shlex

from trainscale.catalogue.registry import framework_spec
from trainscale.core.faults import NODE_FAULT_COMMAND, parse_fault
from trainscale.core.records import NODE_CHECK_FAILED
from trainscale.core.slurm import WORKFLOW_MEM_MB
from trainscale.study.study import GridPoint, run_settings


def missing_environment(config: dict, jobs: list[tuple[str, str]], root: str = ".") -> str:
    """'' when every training environment (train_env, torch_env: the registry
    names each framework's) that a job not yet run would run from has
    bin/trainscale here; else one line naming the key, the path and the jobs.
    `jobs`: (framework, output) of each train job and probe; one whose output
    exists has run. A dry run shows the line as a warning; a real run is
    refused with it."""
    waiting: dict[str, list[str]] = {}
    for framework, output in jobs:
        if not os.path.exists(os.path.join(root, output)):
            waiting.setdefault(framework_spec(framework).environment, []).append(framework)
    for key, frameworks in waiting.items():
        environment = config[key]
        if os.path.isfile(os.path.join(root, environment, "bin", "trainscale")):
            continue
        names = ", ".join(sorted(set(frameworks)))
        return (
            f"config key {key}: {environment!r} has no bin/trainscale, and {len(frameworks)} "
            f"job(s) not yet run ({names}) would run from it; build it "
            f"(make {key.replace('_', '-')}), name the environment that has it, or set "
            "cluster.environment_check: node where only the compute nodes have it"
        )
    return ""


def node_environment_check(trainscale: str) -> str:
    """The shell line a job runs first under cluster.environment_check: node:
    it fails the job in one line naming the path when the node lacks it (the
    workflow then records that line as the point's failure)."""
    path = shlex.quote(trainscale)
    return (
        f'test -x {path} || {{ echo "{NODE_CHECK_FAILED} {trainscale} is not there on '
        f'$(hostname)" >&2; exit 3; }}; '
    )


def network_environment(config: dict, network: str) -> dict[str, str]:
    """The environment every job over `network` runs with (cluster.networks):
    what selects its interface for NCCL, Gloo, Open MPI and Horovod."""
    if not network:
        return {}
    definition = config["cluster"]["networks"][network]
    return {name: str(value) for name, value in definition["environment"].items()}


def train_environment(config: dict, point: GridPoint) -> dict[str, str]:
    """The environment a grid point's job runs with: its network's, and the
    cluster's way of losing a node where the point's fault takes one."""
    settings = run_settings(config, point)
    environment = network_environment(config, settings.network)
    command = (config.get("cluster") or {}).get("node_fault_command")
    fault = parse_fault(settings.fault)
    if command and fault and fault.target == "node":
        environment[NODE_FAULT_COMMAND] = command
    return environment


def container_command(config: dict, point: GridPoint) -> str:
    """The command that runs one of the point's processes in its container
    (cluster.containers), with the runtime's GPU options on a GPU run; '' on
    the bare host."""
    settings = run_settings(config, point)
    if settings.container == "none":  # the bare host
        return ""
    definition = config["cluster"]["containers"][settings.container]
    command = definition["command"].strip()
    gpu = definition.get("gpu_options", "") if settings.device == "gpu" else ""
    if not gpu:
        return command  # as the study wrote it
    program, _, rest = command.partition(" ")
    return f"{program} {gpu} {rest}".strip()


def container_arguments(config: dict, point: GridPoint) -> str:
    """`trainscale run`'s --container-command for the point, shell-quoted ('' for none)."""
    command = container_command(config, point)
    return f"--container-command {shlex.quote(command)} " if command else ""


def environment_prefix(environment: dict[str, str]) -> str:
    """`env NAME=VALUE ... ` to put before a shell command ('' for none)."""
    if not environment:
        return ""
    pairs = " ".join(shlex.quote(f"{k}={v}") for k, v in sorted(environment.items()))
    return f"env {pairs} "


def point_cluster(config: dict, point: GridPoint) -> dict:
    """`cluster:` as the point's job sees it: its system's partition, GRES
    type and constraint (cluster.systems) in place of the study-wide ones."""
    cluster = dict(config.get("cluster") or {})
    system = (cluster.get("systems") or {}).get(run_settings(config, point).system) or {}
    for key in ("partition", "gpu_model", "constraint"):
        if system.get(key):
            cluster[key] = system[key]
    return cluster


def job_shape(config: dict, point: GridPoint, attempt: int = 1) -> dict:
    """Nodes, tasks, GPUs, CPUs, memory and runtime of one grid point's job.

    One task per process: Horovod one rank per GPU; MultiWorkerMirrored one
    worker per node holding its GPUs (one per replica on CPU); Mirrored and
    tf-single one process. GPUs are asked for per node: for GPU runs, and for
    CPU runs too when `cluster.request_gpus_on_cpu` is set (the SLURM lab's
    fake GPUs, to test that path).
    """
    cluster = point_cluster(config, point)
    settings = run_settings(config, point)
    tasks_per_node = settings.processes_per_node()
    asks_gpus = settings.device == "gpu" or cluster.get("request_gpus_on_cpu", False)
    gpus_per_node = point.gpus_per_node if asks_gpus else 0
    cpus_per_gpu = cluster.get("cpus_per_gpu", 4)
    runtime = cluster.get("runtime_minutes", 30) * attempt
    gres = None
    if gpus_per_node:
        model = cluster.get("gpu_model")
        gres = f"gpu:{model}:{gpus_per_node}" if model else f"gpu:{gpus_per_node}"
    return {
        "nodes": point.nodes,
        "tasks": settings.processes(),
        "tasks_per_node": tasks_per_node,
        "cpus_per_task": max(1, cpus_per_gpu * point.gpus_per_node // tasks_per_node),
        "gpus_per_node": gpus_per_node,
        "gres": gres,
        # The ranks' srun step gets mem_mb_per_gpu per GPU; the rest is the
        # batch step's (trainscale.core.slurm.WORKFLOW_MEM_MB).
        "mem_mb": cluster.get("mem_mb_per_gpu", 16000) * point.gpus_per_node + WORKFLOW_MEM_MB,
        "runtime": runtime,
        "gpu_hours": point.gpus * runtime / 60 if settings.device == "gpu" else 0.0,
    }


def slurm_resources(config: dict, point: GridPoint, attempt: int = 1) -> dict:
    """The job shape in the resource names snakemake-executor-plugin-slurm reads.

    The plugin's rules, which this encodes (its submit_string.py, v2.8):
    - a job with an `mpi` resource runs its command directly in the batch
      step; without one, the jobstep plugin wraps it in `srun -n1`, which
      would start our launcher once on one node. Multi-process points set
      mpi=srun (trainscale run then starts the ranks with srun itself); the
      plugin refuses mpi jobs of one task, so single-process points leave it
      empty and run in that one step.
    - for mpi jobs exactly one of tasks / tasks_per_node may be set (0 = unset):
      tasks_per_node when a node runs several processes, else tasks;
    - for GPU jobs it sets --ntasks-per-gpu to `tasks` unless tasks_per_gpu
      is given; 0 turns that off, so the task geometry stays ours.
    """
    shape = job_shape(config, point, attempt)
    cluster = point_cluster(config, point)
    total, per_node = shape["tasks"], shape["tasks_per_node"]
    several_per_node = total > 1 and per_node > 1
    resources = {
        "nodes": shape["nodes"],
        "tasks": 0 if several_per_node else total,
        "tasks_per_node": per_node if several_per_node else 0,
        "tasks_per_gpu": 0,
        "mpi": "srun" if total > 1 else "",
        "cpus_per_task": shape["cpus_per_task"],
        "mem_mb": shape["mem_mb"],
        "runtime": shape["runtime"],
        "gres": shape["gres"] or "",
        "slurm_partition": cluster.get("partition") or "",
        "slurm_account": cluster.get("account") or "",
        # The plugin (2.8.0) refuses --qos in slurm_extra and asks for its
        # `qos` resource; None leaves it unset (an empty one would reach sbatch
        # as --qos='').
        "qos": cluster.get("qos") or None,
        # The plugin adds -C for a constraint, and nothing for None.
        "constraint": cluster.get("constraint") or None,
        # The plugin names every job of a run alike (its run ID): a singleton
        # starts once the one before it has ended.
        "slurm_extra": " ".join(
            [*framework_spec(point.framework).launch.job_options(run_settings(config, point))]
            + (["--dependency=singleton"] if cluster.get("one_job_at_a_time") else [])
        ),
    }
    return resources
