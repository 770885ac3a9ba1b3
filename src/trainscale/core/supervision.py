"""Supervising the processes of one run: ending them all, noticing memory trouble.

trainscale.launching.launch starts the processes; this module holds what it needs to
stop every one of them (ranks that mpirun orphans included), and to tell a
run that ran out of memory from one that crashed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass


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


def stop_all(processes: list[subprocess.Popen], tree: ProcessTree, grace: float = 10.0) -> None:
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
# reads the output rather than trusting the exit code. torch raises
# torch.OutOfMemoryError ("CUDA out of memory") on GPUs and a RuntimeError
# from its CPU allocator on the host, in these words (its backend reads them too).
CPU_ALLOCATOR_OOM = "DefaultCPUAllocator: can't allocate memory"
OOM_SIGNS = (
    "trainscale train: out of memory:",  # OWN_OOM_SIGN
    "RESOURCE_EXHAUSTED",
    "OOM when allocating",
    "std::bad_alloc",
    "MemoryError",
    "CUDA_ERROR_OUT_OF_MEMORY",
    "CUDA out of memory",
    CPU_ALLOCATOR_OOM,
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


# Exit code of a training process that ran out of memory (it says so first:
# OWN_OOM_SIGN); `trainscale run` turns it into a record.
EXIT_OOM = 3
OWN_OOM_SIGN = "trainscale train: out of memory:"


def said_out_of_memory(found: list[str]) -> bool:
    """Whether a training process of the run said it ran out of memory (the
    cgroup's count of kills is not asked here: it may count another run's)."""
    return any(OWN_OOM_SIGN in line for line in found)


def relay_output(stream, sink, found: list[str]) -> None:
    """Copy a process's stderr to ours (the job log) and note the first OOM line."""
    for line in stream:
        sink.write(line)
        sink.flush()
        if not found and any(sign in line for sign in OOM_SIGNS):
            found.append(line.strip()[:500])
        elif OWN_OOM_SIGN in line and not said_out_of_memory(found):
            found.append(line.strip()[:500])  # the launcher ends the run on it


def mark_first_to_die() -> None:
    """Make the kernel's OOM killer pick this training process before its
    launcher, srun or mpirun, so they live to record `oom` (raising one's own
    oom_score_adj needs no privilege)."""
    try:
        with open("/proc/self/oom_score_adj", "w") as handle:
            handle.write("1000")
    except OSError:
        pass
