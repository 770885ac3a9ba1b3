"""`trainscale run`: start every process of one grid point and wait.

On a machine of its own: Horovod ranks come from mpirun (or horovodrun
--gloo), MultiWorkerMirrored workers from N local processes each given its
TF_CONFIG, the other frameworks from one process; more than one node is
refused. Inside a SLURM job (what the SLURM profile submits): the same
processes as srun job steps across the job's nodes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from trainscale.registry import framework_spec
from trainscale.settings import RunSettings, SettingsError


def _train_command(
    settings: RunSettings,
    output: str,
    weights_file: str | None,
    expect_cuda_devices: int = 0,
    collective_timeout: float | None = None,
) -> list[str]:
    command = [sys.executable, "-m", "trainscale", "train", *settings.to_cli_args()]
    command += ["--output", output]
    if collective_timeout is not None:
        command += ["--collective-timeout", str(collective_timeout)]
    if weights_file:
        command += ["--save-weights", weights_file]
    if expect_cuda_devices:
        command += ["--expect-cuda-devices", str(expect_cuda_devices)]
    return command


def free_ports(count: int) -> list[int]:
    """Ports the kernel says are free now (held open together so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def horovod_command(settings: RunSettings, train_command: list[str]) -> list[str]:
    ranks = str(settings.replicas)
    if settings.horovod_launcher == "gloo":
        return [
            sys.executable,
            "-m",
            "horovod.runner.launch",
            "--gloo",
            "-np",
            ranks,
            "-H",
            f"localhost:{ranks}",
            *train_command,
        ]
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise SettingsError("--horovod-launcher mpi: no mpirun on PATH (install openmpi-bin)")
    command = [mpirun, "-np", ranks, "--bind-to", "none", "--map-by", "slot", "--oversubscribe"]
    if os.geteuid() == 0:
        command.append("--allow-run-as-root")
    # Containers often forbid the cross-memory-attach syscalls Open MPI's
    # shared-memory transport tries first; falling back costs nothing here.
    command += ["--mca", "btl_vader_single_copy_mechanism", "none"]
    return command + train_command


def in_slurm_job() -> bool:
    return "SLURM_JOB_ID" in os.environ


def process_plan(
    settings: RunSettings,
    output: str,
    weights_file: str | None = None,
    requested_gpus_per_node: int = 0,
    collective_timeout: float | None = None,
) -> list[tuple[list[str], dict[str, str]]]:
    """The (argv, extra environment) of every process `run` starts.

    Inside a SLURM job the processes are job steps started with srun across
    the job's nodes; elsewhere they are local processes on this one machine.
    """
    processes_per_node = settings.processes_per_node()
    # Each process must see the GPUs it drives (checked before any timing).
    expect = requested_gpus_per_node // processes_per_node if requested_gpus_per_node else 0
    train_command = _train_command(settings, output, weights_file, expect, collective_timeout)
    if in_slurm_job():
        return slurm_plan(settings, train_command, requested_gpus_per_node)
    if settings.nodes != 1:
        raise SettingsError(
            f"--nodes {settings.nodes}: `trainscale run` launches on this machine only; "
            "run multi-node points with `snakemake --profile profiles/slurm`"
        )
    launch = framework_spec(settings.framework).launch
    if launch == "horovod":
        return [(horovod_command(settings, train_command), {})]
    if launch == "multiworker":
        addresses = [f"localhost:{port}" for port in free_ports(processes_per_node)]
        plan = []
        for index in range(processes_per_node):
            task = {"type": "worker", "index": index}
            tf_config = {"cluster": {"worker": addresses}, "task": task}
            plan.append((train_command, {"TF_CONFIG": json.dumps(tf_config)}))
        return plan
    return [(train_command, {})]


def slurm_plan(
    settings: RunSettings, train_command: list[str], requested_gpus_per_node: int
) -> list[tuple[list[str], dict[str, str]]]:
    """srun steps for a grid point inside its SLURM job.

    The job's shape (nodes, tasks, GPUs) was set at submission from the grid
    point; the step asks for it again explicitly, because Snakemake's jobstep
    plugin strips the SLURM_* variables srun would otherwise inherit.
    """
    processes_per_node = settings.processes_per_node()
    tasks = settings.nodes * processes_per_node
    # Even one process runs as a step of its own, not in the batch step: when
    # SLURM's cgroup kills it for memory, that marks the step OUT_OF_MEMORY
    # and srun says so, while the batch step (this launcher) lives to record
    # `oom` and the job completes; Snakemake would delete the record of a job
    # SLURM calls OUT_OF_MEMORY.
    srun = [
        "srun",
        f"--nodes={settings.nodes}",
        f"--ntasks={tasks}",
        f"--ntasks-per-node={processes_per_node}",
        # One dead rank must end the step, not leave the others spinning in
        # a collective until the time limit.
        "--kill-on-bad-exit=1",
        "--export=ALL",
    ]
    if requested_gpus_per_node:
        srun.append(f"--gres=gpu:{requested_gpus_per_node}")
    extra_env: dict[str, str] = {}
    if framework_spec(settings.framework).launch == "horovod":
        if settings.horovod_launcher == "mpi":
            # Debian's Open MPI can be started by srun only through PMIx.
            srun.append("--mpi=pmix")
        else:
            extra_env = start_gloo_rendezvous(settings)
    return [(srun + train_command, extra_env)]


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
    try:
        left = subprocess.run(
            ["squeue", "-h", "-j", os.environ["SLURM_JOB_ID"], "-o", "%L"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 0.0
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


def start_gloo_rendezvous(settings: RunSettings) -> dict[str, str]:
    """Start Horovod's Gloo rendezvous server here; return what every rank needs.

    Each rank derives its own HOROVOD_RANK, LOCAL_RANK, ... from SLURM's
    task variables (trainscale.frameworks.horovod_env_from_slurm).
    """
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousServer

    hosts = job_hosts()[: settings.nodes]
    per_node = settings.processes_per_node()
    slots = get_host_assignments(
        parse_hosts(",".join(f"{h}:{per_node}" for h in hosts)), settings.replicas
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


def slurm_job_reason() -> str:
    """Why SLURM is ending this job, as squeue says while it completes:
    `TimeLimit` at the time limit, `None` after scancel, others on node failure."""
    try:
        return subprocess.run(
            ["squeue", "-h", "-j", os.environ["SLURM_JOB_ID"], "-o", "%r"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError, KeyError):
        return ""


class ProcessTree:
    """Every process started under the launcher's children, remembered by pid and start time.

    On Ctrl-C, mpirun exits at once and its ranks (each in a process group of
    its own) train on for a moment as orphans of init, out of reach of
    Popen.wait: the launcher would return, and Snakemake with it, while they
    still run. Remembering them lets the launcher end and wait for them too.
    The start time tells a remembered process from a later one given its pid.
    """

    def __init__(self) -> None:
        self.start_times: dict[int, str] = {}

    @staticmethod
    def _state_and_start_time(pid: int) -> tuple[str, str] | None:
        """From /proc/<pid>/stat; None once the process is gone."""
        try:
            with open(f"/proc/{pid}/stat") as stat:
                # Fields after the command name, which may hold spaces: state is
                # the first, the start time the 20th.
                fields = stat.read().rsplit(")", 1)[1].split()
            return fields[0], fields[19]
        except (OSError, IndexError):
            return None

    @staticmethod
    def _children(pid: int) -> list[int]:
        children = []
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as listing:
                    children += [int(child) for child in listing.read().split()]
        except OSError:
            pass  # ended meanwhile, or a kernel without the children file
        return children

    def update(self, processes: list[subprocess.Popen]) -> None:
        """Remember the descendants of the still-running processes."""
        # Walk the whole tree each time: a process seen before may have
        # started children since (horovodrun's middleman, then the rank).
        pending = [proc.pid for proc in processes if proc.returncode is None]
        while pending:
            for child in self._children(pending.pop()):
                found = self._state_and_start_time(child)
                if found:
                    self.start_times.setdefault(child, found[1])
                    pending.append(child)

    def alive(self) -> list[int]:
        """The remembered processes still running (a zombie has ended)."""
        running = []
        for pid, start_time in self.start_times.items():
            found = self._state_and_start_time(pid)
            if found and found[1] == start_time and found[0] not in "ZX":
                running.append(pid)
        return running

    def signal(self, number: int) -> None:
        for pid in self.alive():
            with contextlib.suppress(OSError):  # ended meanwhile
                os.kill(pid, number)


def _stop(processes: list[subprocess.Popen], tree: ProcessTree, grace: float = 10.0) -> None:
    """End every process of the run, and return only when all are gone.

    Terminate the children first (mpirun passes it on to its ranks); then any
    descendant they left behind; kill what ignores it (a hung TF worker
    ignores SIGTERM).
    """
    tree.update(processes)
    for proc in processes:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in processes:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    tree.signal(signal.SIGTERM)
    while tree.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    tree.signal(signal.SIGKILL)
    while tree.alive() and time.monotonic() < deadline + 5:
        time.sleep(0.1)


# How running out of memory shows in a process's output. TensorFlow on CPU
# often crashes instead of raising (oneDNN kernels segfault after
# "RESOURCE_EXHAUSTED"; Eigen ones abort with std::bad_alloc), so the launcher
# reads the output rather than trusting the exit code.
OOM_SIGNS = (
    "trainscale train: out of memory:",
    "RESOURCE_EXHAUSTED",
    "OOM when allocating",
    "std::bad_alloc",
    "MemoryError",
    "CUDA_ERROR_OUT_OF_MEMORY",
    # SLURM's cgroup plugin, for tasks of an srun step (on any node):
    # "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=12.0 ..."
    "oom-kill event",
)


class MemoryCgroup:
    """This process's memory cgroup (v1 or v2), where SLURM's `--mem` is enforced.

    When a job goes over its memory, the kernel kills a process in it with
    SIGKILL: nothing is printed, so the launcher counts the cgroup's OOM kills.
    """

    def __init__(self, folder: str):
        self.folder = folder

    @classmethod
    def of_this_process(cls) -> MemoryCgroup | None:
        try:
            with open("/proc/self/cgroup") as handle:
                lines = handle.read().splitlines()
        except OSError:
            return None
        candidates = []
        for line in lines:
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):  # v1
                candidates.append(os.path.join("/sys/fs/cgroup/memory", path.lstrip("/")))
            elif controllers == "":  # v2 (unified), alone or beside v1
                for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
                    candidates.append(os.path.join(root, path.lstrip("/")))
        for folder in candidates:
            cgroup = cls(folder)
            if cgroup.oom_kills() is not None:
                return cgroup
        return None

    def _read(self, *names: str) -> str | None:
        for name in names:
            try:
                with open(os.path.join(self.folder, name)) as handle:
                    return handle.read()
            except OSError:
                continue
        return None

    def oom_kills(self) -> int | None:
        text = self._read("memory.events", "memory.oom_control")
        for line in (text or "").splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return None

    def limit_mib(self) -> float | None:
        """The tightest limit on this group or a parent (SLURM sets it on the job)."""
        limits, folder = [], self.folder
        while folder.count("/") > 3:
            text = (MemoryCgroup(folder)._read("memory.max", "memory.limit_in_bytes") or "").strip()
            if text.isdigit() and int(text) < 2**62:  # not "max", nor v1's "no limit"
                limits.append(int(text) / 2**20)
            folder = os.path.dirname(folder)
        return min(limits, default=None)


@dataclass
class LaunchResult:
    code: int  # 0, a process's exit code, or -signal
    seconds: float
    timed_out: bool = False
    out_of_memory: str = ""  # the first output line that said so
    terminated: bool = False  # SIGTERM reached the launcher (SLURM ending the job, a kill)


def _relay(stream, sink, found: list[str]) -> None:
    """Copy a process's stderr to ours (the job log) and note the first OOM line."""
    for line in stream:
        sink.write(line)
        sink.flush()
        if not found and any(sign in line for sign in OOM_SIGNS):
            found.append(line.strip()[:500])


def launch(
    settings: RunSettings,
    output: str,
    weights_file: str | None = None,
    requested_gpus_per_node: int = 0,
    timeout: float = 0,
    collective_timeout: float | None = None,
) -> LaunchResult:
    """Run every process of the grid point and wait for all of them.

    One process that fails ends the others (they would wait in a collective
    forever); the watchdog ends them all after `timeout` seconds.
    """
    plan = process_plan(settings, output, weights_file, requested_gpus_per_node, collective_timeout)
    if in_slurm_job():
        # SLURM's time limit, minus a margin, unless a shorter watchdog is set.
        limit = slurm_watchdog()
        timeout = min(t for t in (timeout, limit) if t) if (timeout or limit) else 0
    processes, relays, oom_lines = [], [], []
    tree = ProcessTree()
    cgroup = MemoryCgroup.of_this_process()
    oom_kills_before = cgroup.oom_kills() if cgroup else None
    terminated = threading.Event()
    start = time.monotonic()

    def finish(code, timed_out=False):
        _stop(processes, tree)
        for relay in relays:
            relay.join(timeout=5)
        if code and not oom_lines and cgroup and (cgroup.oom_kills() or 0) > oom_kills_before:
            limit = cgroup.limit_mib()
            oom_lines.append(
                "killed by the kernel's out-of-memory handler: memory cgroup "
                f"{cgroup.folder} (limit {f'{limit:.0f} MiB' if limit else 'unknown'})"
            )
        seconds = time.monotonic() - start
        oom = oom_lines[0] if oom_lines else ""
        return LaunchResult(code, seconds, timed_out, oom, terminated.is_set())

    # SLURM ends a job (time limit, scancel, node failure) with SIGTERM to every
    # process of the step, then SIGKILL after KillWait: note it and stop cleanly.
    in_main_thread = threading.current_thread() is threading.main_thread()
    if in_main_thread:
        previous_handler = signal.signal(signal.SIGTERM, lambda *_: terminated.set())
    try:
        for argv, extra_env in plan:
            proc = subprocess.Popen(
                argv,
                env={**os.environ, **extra_env},
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
            )
            processes.append(proc)
            relay = threading.Thread(target=_relay, args=(proc.stderr, sys.stderr, oom_lines))
            relay.start()
            relays.append(relay)
        while True:
            codes = [proc.poll() for proc in processes]
            tree.update(processes)
            failed = [code for code in codes if code not in (None, 0)]
            if terminated.is_set():
                return finish(failed[0] if failed else -signal.SIGTERM)
            if failed:
                # The same SIGTERM may have reached a child first; let ours land.
                terminated.wait(0.5)
                return finish(failed[0])
            if all(code == 0 for code in codes):
                return finish(0)
            if timeout and time.monotonic() - start > timeout:
                return finish(-1, timed_out=True)
            time.sleep(0.2)
    except BaseException:
        _stop(processes, tree)
        raise
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous_handler)
