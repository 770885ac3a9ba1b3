"""A run's processes from a test's side: started in the background, found
by their rank, killed, stopped, capped in memory (the failure tests of
tests/harness and tests/torch, and Ctrl-C in tests/workflow)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from runs import TRAINSCALE, check_may_train


class Output:
    """A running process's output, read in a thread as it comes (the pipe never
    fills), to wait for a line without blocking on a process that is hung."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._reader.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append(line)

    def wait_for(self, text: str, within: float = 600) -> None:
        deadline = time.monotonic() + within
        while not any(text in line for line in self.lines):
            seen = "".join(self.lines)[-3000:]
            assert self._reader.is_alive(), f"ended before {text!r}:\n{seen}"
            assert time.monotonic() < deadline, f"no {text!r} within {within} s:\n{seen}"
            time.sleep(0.2)

    def text(self) -> str:
        self._reader.join(timeout=30)
        return "".join(self.lines)


def sigint_as_in_a_terminal() -> None:
    """A child's preexec_fn: SIGINT back to its default action.

    A job started in the background of a shell without job control (a CI
    runner's, `cmd &`) inherits SIGINT *ignored*, down to every process it
    starts; Python then never raises KeyboardInterrupt, and a test's Ctrl-C
    would reach no one. Seen in this project's CI: the MultiWorker workers
    trained on after Ctrl-C. A program run from a terminal has the default.
    """
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_run(*args: str, **popen) -> tuple[subprocess.Popen, Output]:
    """`trainscale run` in the background; its stdout and stderr together, as
    they come. Ctrl-C (SIGINT) reaches it as from a terminal."""
    check_may_train(f"trainscale run {' '.join(args[:2])}")
    run = subprocess.Popen(
        [*TRAINSCALE, "run", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "1"},
        preexec_fn=sigint_as_in_a_terminal,
        **popen,
    )
    return run, Output(run.stdout)


# How each launcher tells its second process (rank or worker 1) apart.
SECOND_PROCESS_MARKS = (
    b"OMPI_COMM_WORLD_RANK=1\0",  # mpirun
    b"HOROVOD_RANK=1\0",  # horovodrun --gloo
    b'"index": 1}',  # TF_CONFIG
    b"\0RANK=1\0",  # torch.distributed
)


def processes_writing(output: Path) -> list[int]:
    """Pids of the training processes (any rank or worker) of the run writing `output`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        # `python -m trainscale train ...`, not mpirun or horovodrun naming it.
        training = argv[1:4] == [b"-m", b"trainscale", b"train"]
        if training and str(output).encode() in argv and state != "Z":
            found.append(int(pid))
    return found


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, theirs, ...)."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def ray_train_workers(driver: int) -> list[int]:
    """The Ray Train workers below a ray-train driver (Ray names them in their argv)."""
    workers = []
    for pid in descendants(driver):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::RayTrainWorker"):
                workers.append(pid)
        except OSError:
            continue
    return sorted(workers)


def second_process(output: Path, within: float = 240) -> int:
    """The pid of rank/worker 1 of the run writing `output`, once it trains (a
    ray-train run's second Ray Train worker: Ray starts them, slowly on 2 cores)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        time.sleep(0.2)  # between scans of /proc
        for pid in processes_writing(output):
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                continue
            if any(mark in environ for mark in SECOND_PROCESS_MARKS):
                return pid
            workers = ray_train_workers(pid)
            if len(workers) >= 2:
                return workers[1]
    raise AssertionError("rank 1 never started")


def process_in_task_order(output: Path, index: int, within: float = 240) -> int:
    """The pid of the process at `index` in the task order of a run with roles
    (TRAINSCALE_PROCESS: 0 the chief, then the servers, then the workers)."""
    mark = f"\0TRAINSCALE_PROCESS={index}\0".encode()
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        time.sleep(0.2)  # between scans of /proc
        for pid in processes_writing(output):
            try:
                if mark in b"\0" + Path(f"/proc/{pid}/environ").read_bytes():
                    return pid
            except OSError:
                continue
    raise AssertionError(f"process {index} never started")


# 2 CPU ranks of small_cnn training (nearly) for ever: only a stop ends them.
# A small batch, one warm-up step and short blocks reach the first timed
# block soon after start-up.
ENDLESS = [
    "--gpus-per-node", "2", "--model", "small_cnn", "--image-size", "32",
    "--dataset", "synthetic", "--device", "cpu", "--batch-size", "8",
    "--warmup-steps", "1", "--steps-per-block", "5", "--blocks", "100000",
]  # fmt: skip
FIRST_BLOCK = "block 1/100000"


@dataclass
class KilledRun:
    """What a run did after one of its processes was SIGKILLed in training."""

    returncode: int
    seconds_to_first_block: float  # from launch: this machine's start-up, measured
    seconds_after_kill: float  # from the kill to the launcher's exit
    record_written: bool
    printed: str


def kill_a_rank(run_args, output: Path, first_block: str, victim_of=None) -> KilledRun:
    """Start `trainscale run`, SIGKILL one of its processes (rank 1, unless
    `victim_of(output)` picks another) once it prints `first_block`, as a
    crash or a lost node would, and see how the run ends."""
    import signal

    start = time.monotonic()
    run, printed = start_run(*run_args, "--output", str(output))
    try:
        victim = (victim_of or second_process)(output)
        printed.wait_for(first_block)
        seconds_to_first_block = time.monotonic() - start
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        run.wait(timeout=300)
        seconds_after_kill = time.monotonic() - killed_at
    finally:
        run.kill()
    return KilledRun(
        run.returncode, seconds_to_first_block, seconds_after_kill, output.exists(), printed.text()
    )


def assert_it_ended_quickly_without_a_record(killed: KilledRun) -> None:
    """A killed rank ends the run within a minute, failed, with no record: no
    rank is left waiting in a collective (300 s before its timeout). The
    launcher's stop takes up to 15 s (SIGTERM's grace, then SIGKILL's
    wait); a loaded machine gets four times that."""
    assert killed.returncode != 0
    assert killed.seconds_after_kill < 60, killed.printed[-3000:]
    assert not killed.record_written
    assert "exited with" in killed.printed


def watchdog_limit(seconds_to_first_block: float) -> int:
    """A watchdog limit that falls inside training whatever this CPU's speed:
    three times this machine's start-up to the first block, measured in this
    pytest run (another run beside it may slow this one's), plus 10 s."""
    return round(max(20, 3 * seconds_to_first_block + 10))


def memory_cgroup(limit_mb: int):
    """A cgroup v1 memory group of our own with a hard limit (root only), or None."""
    folder = Path("/sys/fs/cgroup/memory") / f"trainscale-test-{os.getpid()}"
    try:
        folder.mkdir()
    except OSError:
        return None
    limit = str(limit_mb * 1024 * 1024)
    (folder / "memory.limit_in_bytes").write_text(limit)
    swap = folder / "memory.memsw.limit_in_bytes"  # RAM + swap: no escape into swap
    if swap.exists():
        swap.write_text(limit)
    return folder


def pin_this_xdist_worker() -> None:
    """A pytest-xdist worker on cores of its own, which the runs it starts
    inherit (trainscale.core.cpus reads the mask: one intra-op thread per
    core it holds). Two workers on 2 cores, each with both cores' threads,
    ran a torch process at 0.30-0.46 of its rate alone; on a core of its
    own, at 0.97-1.23 (bench/oversubscription.sh, bench/README.md)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    cpus = sorted(os.sched_getaffinity(0))
    if not worker or not count or len(cpus) < int(count):
        return  # not a worker, or fewer cores than workers: nothing to divide
    share, index = len(cpus) // int(count), int(worker.removeprefix("gw"))
    os.sched_setaffinity(0, cpus[index * share : (index + 1) * share])
