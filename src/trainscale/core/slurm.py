"""What trainscale knows of SLURM, in one place: the srun step of a grid
point inside its job (each launch kind adds its own options), what each rank
reads from SLURM's task variables, the job's hosts, ports and time left, and
why SLURM is ending it.

Imports neither TensorFlow nor torch (the ranks of both read it).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess


def in_slurm_job() -> bool:
    return "SLURM_JOB_ID" in os.environ


# What a job asks beyond its ranks' memory, for the workflow's own processes
# in its batch step (Snakemake, twice, and this launcher: about 330 MB of RSS
# in the SLURM lab). The ranks' srun step is held to the job's memory less
# this, so a rank over its memory is killed by its step's own cgroup. Were
# the step allowed the job's whole memory, the job's cgroup would be the one
# at its limit, and the kernel, while it is still freeing the rank it killed,
# can pick a second victim there: Snakemake itself (seen in the lab).
WORKFLOW_MEM_MB = 768
_MEMORY_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def step_memory_mb() -> int:
    """The memory per node this SLURM job's ranks' step may use: the job's
    per-node memory less WORKFLOW_MEM_MB (0: not in a job, no per-node
    memory asked for, or too little to hold anything back)."""
    if not in_slurm_job():
        return 0
    job = _ask_slurm(["scontrol", "show", "job", "-o", os.environ["SLURM_JOB_ID"]])
    # Per node only: a job sized per CPU (--mem-per-cpu) says MinMemoryCPU.
    found = re.search(r"\bMinMemoryNode=([0-9.]+)([KMGT]?)\b", job)
    if not found:
        return 0
    job_mb = int(float(found[1]) * _MEMORY_UNITS[found[2] or "M"])
    return job_mb - WORKFLOW_MEM_MB if job_mb >= 2 * WORKFLOW_MEM_MB else 0


def srun_command(
    nodes: int,
    processes_per_node: int,
    requested_gpus_per_node: int,
    cpus_per_task: int = 0,
    tasks: int = 0,
) -> list[str]:
    """The srun step of a grid point inside its SLURM job, before the launch
    kind's own options (trainscale.catalogue.launch_kinds).

    The job's shape (nodes, tasks, GPUs, CPUs per task) was set at submission
    from the grid point; the step asks for it again explicitly, because
    Snakemake's jobstep plugin (0.6.1) strips the SLURM_* variables srun
    would otherwise inherit, and srun since SLURM 22.05 no longer takes the
    job's --cpus-per-task anyway (its release notes). Without it each rank
    gets one CPU, and no SLURM_CPUS_PER_TASK to size its threads by
    (trainscale.core.cpus.cpu_share). `tasks` (default: nodes x processes_per_node) may be
    fewer, where the processes do not fill every node alike: then SLURM takes
    --ntasks-per-node as the most a node runs.
    """
    # Even one process runs as a step of its own, not in the batch step: when
    # SLURM's cgroup kills it for memory, that marks the step OUT_OF_MEMORY
    # and srun says so, while the batch step (this launcher) lives to record
    # `oom` and the job completes; Snakemake would delete the record of a job
    # SLURM calls OUT_OF_MEMORY.
    srun = [
        "srun",
        f"--nodes={nodes}",
        f"--ntasks={tasks or nodes * processes_per_node}",
        f"--ntasks-per-node={processes_per_node}",
        # One dead rank must end the step, not leave the others spinning in
        # a collective until the time limit.
        "--kill-on-bad-exit=1",
        "--export=ALL",
    ]
    if requested_gpus_per_node:
        srun.append(f"--gres=gpu:{requested_gpus_per_node}")
    if cpus_per_task:
        srun.append(f"--cpus-per-task={cpus_per_task}")
    memory = step_memory_mb()
    if memory:
        srun.append(f"--mem={memory}M")
    return srun


def _ask_slurm(argv: list[str], timeout: float = 30) -> str:
    """What a SLURM command prints, or '' if it cannot say."""
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def parse_slurm_duration(text: str) -> float | None:
    """Seconds in SLURM's [days-]hours:minutes:seconds (or minutes:seconds) form."""
    text = text.strip()
    if not text or text in ("UNLIMITED", "NOT_SET", "INVALID"):
        return None
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    hours, minutes, seconds = parts
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


def slurm_watchdog(margin: float = 60.0, minimum: float = 30.0) -> float:
    """A watchdog that fires before SLURM's time limit does, so the run can record
    `timeout` itself (SLURM's kill would leave no record), or 0 if unknown."""
    left = _ask_slurm(["squeue", "-h", "-j", os.environ["SLURM_JOB_ID"], "-o", "%L"])
    seconds = parse_slurm_duration(left)
    return max(minimum, seconds - margin) if seconds else 0.0


_rendezvous_servers: list = []  # kept alive until the process exits


def job_hosts() -> list[str]:
    """The host names of this SLURM job's nodes, in order."""
    job = os.environ["SLURM_JOB_ID"]
    nodelist = subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%N"], capture_output=True, text=True, check=True
    ).stdout.strip()
    hosts = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True
    ).stdout.split()
    if not hosts:
        raise RuntimeError(f"SLURM job {job} has no nodes (squeue said {nodelist!r})")
    return hosts


def start_gloo_rendezvous(nodes: int, processes_per_node: int) -> dict[str, str]:
    """Start Horovod's Gloo rendezvous server here; return what every rank needs.

    Each rank derives its own HOROVOD_RANK, LOCAL_RANK, ... from SLURM's
    task variables (horovod_env_from_slurm).
    """
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousServer

    hosts = job_hosts()[:nodes]
    slots = get_host_assignments(
        parse_hosts(",".join(f"{h}:{processes_per_node}" for h in hosts)),
        nodes * processes_per_node,
    )
    server = RendezvousServer(verbose=0)
    port = server.start()
    server.init(slots)
    _rendezvous_servers.append(server)
    return {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": socket.gethostbyname(socket.gethostname()),
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        # Both are needed: with either missing Horovod calls MPI_Init and fails.
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "TRAINSCALE_HOROVOD_GLOO_FROM_SLURM": "1",
    }


def torch_rendezvous() -> dict[str, str]:
    """What every torch.distributed rank of this job needs beyond its SLURM task
    variables (rank_env_from_slurm): rank 0's host and a port of this job's own."""
    return {
        "MASTER_ADDR": job_hosts()[0],
        "MASTER_PORT": str(slurm_port_base(os.environ["SLURM_JOB_ID"])),
        "TRAINSCALE_TORCH_FROM_SLURM": "1",
    }


def rank_env_from_slurm(env=None) -> dict[str, str]:
    """torch.distributed's per-rank variables (the env:// rendezvous), from
    SLURM's task variables, as horovod_env_from_slurm derives Horovod's."""
    env = os.environ if env is None else env
    horovod = horovod_env_from_slurm(env)
    return {
        "RANK": horovod["HOROVOD_RANK"],
        "WORLD_SIZE": horovod["HOROVOD_SIZE"],
        "LOCAL_RANK": horovod["HOROVOD_LOCAL_RANK"],
        "LOCAL_WORLD_SIZE": horovod["HOROVOD_LOCAL_SIZE"],
    }


def slurm_job_reason() -> str:
    """Why SLURM is ending this job, as squeue says while it completes:
    `TimeLimit` at the time limit, `None` after scancel, others on node failure."""
    if not in_slurm_job():
        return ""
    # Asked while SLURM's SIGTERM grace runs: a shorter wait than the others.
    return _ask_slurm(["squeue", "-h", "-j", os.environ["SLURM_JOB_ID"], "-o", "%r"], 10).strip()


def _tasks_per_node(spec: str) -> list[int]:
    """Expand SLURM's tasks-per-node syntax: "2(x3),1" -> [2, 2, 2, 1]."""
    counts = []
    for part in spec.split(","):
        if "(x" in part:
            count, repeat = part.rstrip(")").split("(x")
            counts += [int(count)] * int(repeat)
        else:
            counts.append(int(part))
    return counts


def horovod_env_from_slurm(env=None) -> dict[str, str]:
    """Horovod's per-rank Gloo variables, derived from SLURM's task variables.

    srun starts every rank with the same environment; each rank works out its
    own place from what SLURM set for its task.
    """
    env = os.environ if env is None else env
    node = int(env["SLURM_NODEID"])
    per_node = _tasks_per_node(env["SLURM_STEP_TASKS_PER_NODE"])
    return {
        "HOROVOD_RANK": env["SLURM_PROCID"],
        "HOROVOD_SIZE": env["SLURM_STEP_NUM_TASKS"],
        "HOROVOD_LOCAL_RANK": env["SLURM_LOCALID"],
        "HOROVOD_LOCAL_SIZE": str(per_node[node]),
        "HOROVOD_CROSS_RANK": str(node),
        "HOROVOD_CROSS_SIZE": env["SLURM_STEP_NUM_NODES"],
        "HOROVOD_HOSTNAME": env["SLURMD_NODENAME"],
    }


def slurm_port_base(job_id: str) -> int:
    """A port base per SLURM job, so two jobs sharing a node never both bind 8888."""
    return 20000 + (int(job_id) % 2000) * 16
