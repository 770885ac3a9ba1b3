"""`trainscale run`: start every process of one grid point on THIS machine and wait.

Horovod ranks come from mpirun (or horovodrun --gloo), MultiWorkerMirrored
workers from N local processes each given its TF_CONFIG, and the other
frameworks from one process. A cluster run across nodes is the SLURM
profile's job, never this module's.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

from trainscale.settings import RunSettings, SettingsError


def _train_command(settings: RunSettings, output: str, weights_file: str | None) -> list[str]:
    command = [sys.executable, "-m", "trainscale", "train", *settings.to_cli_args()]
    command += ["--output", output]
    if weights_file:
        command += ["--save-weights", weights_file]
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
        raise SettingsError("--horovod-launcher mpirun: no mpirun on PATH (install openmpi-bin)")
    command = [mpirun, "-np", ranks, "--bind-to", "none", "--map-by", "slot", "--oversubscribe"]
    if os.geteuid() == 0:
        command.append("--allow-run-as-root")
    # Containers often forbid the cross-memory-attach syscalls Open MPI's
    # shared-memory transport tries first; falling back costs nothing here.
    command += ["--mca", "btl_vader_single_copy_mechanism", "none"]
    return command + train_command


def process_plan(
    settings: RunSettings, output: str, weights_file: str | None = None
) -> list[tuple[list[str], dict[str, str]]]:
    """The (argv, extra environment) of every process `run` starts."""
    if settings.nodes != 1:
        raise SettingsError(
            f"--nodes {settings.nodes}: `trainscale run` launches on this machine only; "
            "run multi-node points with `snakemake --profile profiles/slurm`"
        )
    train_command = _train_command(settings, output, weights_file)
    if settings.framework == "horovod":
        return [(horovod_command(settings, train_command), {})]
    if settings.framework == "tf-multiworker":
        workers = settings.processes_per_node()
        addresses = [f"localhost:{port}" for port in free_ports(workers)]
        plan = []
        for index in range(workers):
            task = {"type": "worker", "index": index}
            tf_config = {"cluster": {"worker": addresses}, "task": task}
            plan.append((train_command, {"TF_CONFIG": json.dumps(tf_config)}))
        return plan
    return [(train_command, {})]


def _stop(processes: list[subprocess.Popen], grace: float = 10.0) -> None:
    """Terminate what still runs; kill what ignores it (a hung TF worker ignores SIGTERM)."""
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


def launch(settings: RunSettings, output: str, weights_file: str | None = None) -> int:
    """Run every process of the grid point; return 0 when all succeeded."""
    plan = process_plan(settings, output, weights_file)
    processes = []
    try:
        for argv, extra_env in plan:
            processes.append(subprocess.Popen(argv, env={**os.environ, **extra_env}))
        while True:
            codes = [proc.poll() for proc in processes]
            failed = [code for code in codes if code not in (None, 0)]
            if failed:
                # One dead process leaves the others waiting in a collective.
                _stop(processes)
                return failed[0]
            if all(code == 0 for code in codes):
                return 0
            time.sleep(0.2)
    except BaseException:
        _stop(processes)
        raise
