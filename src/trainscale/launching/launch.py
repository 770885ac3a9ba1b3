"""`trainscale run`: start every process of one grid point and wait.

The framework's launch kind (trainscale.catalogue.launch_kinds) says which processes:
on a machine of its own, its local plan (mpirun or horovodrun --gloo for
Horovod ranks, one TF_CONFIG worker or torch.distributed rank per process, or
one process); more than one node is refused. Inside a SLURM job (what the
SLURM profile submits): its srun step across the job's nodes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from trainscale.catalogue.launch_kinds import Plan, process_index
from trainscale.catalogue.options import RunOptions
from trainscale.catalogue.registry import framework_spec
from trainscale.catalogue.settings import RunSettings, SettingsError
from trainscale.core.records import LAUNCHED_AT
from trainscale.core.slurm import in_slurm_job, slurm_watchdog
from trainscale.core.supervision import (
    EXIT_OOM,
    LaunchResult,
    MemoryCgroup,
    ProcessTree,
    relay_output,
    said_out_of_memory,
    stop_all,
)
from trainscale.launching.containers import (
    in_container,
    prepare_container,
    runtime_name,
    with_docker_environment,
)


def _train_command(
    settings: RunSettings, options: RunOptions, expect_cuda_devices: int
) -> list[str]:
    command = [sys.executable, "-m", "trainscale", "train", *settings.to_cli_args()]
    command += ["--output", options.output, "--collective-timeout", str(options.collective_timeout)]
    if options.save_weights:
        command += ["--save-weights", options.save_weights]
    if expect_cuda_devices:
        command += ["--expect-cuda-devices", str(expect_cuda_devices)]
    return command


def process_plan(settings: RunSettings, options: RunOptions) -> Plan:
    """The (argv, extra environment) of every process `run` starts.

    Inside a SLURM job the processes are job steps started with srun across
    the job's nodes; elsewhere they are local processes on this one machine.
    """
    kind = framework_spec(settings.framework).launch
    processes_per_node = kind.processes_per_node(settings.gpus_per_node, settings.device)
    # Each process must see the GPUs it drives (checked before any timing).
    requested = options.requested_gpus_per_node
    expect = requested // processes_per_node if requested else 0
    train_command = _train_command(settings, options, expect)
    return rank_plan(
        settings,
        train_command,
        requested,
        options.requested_cpus_per_task,
        options.container_command,
    )


def rank_plan(
    settings: RunSettings,
    command: list[str],
    requested_gpus_per_node: int,
    requested_cpus_per_task: int = 0,
    container_command: str = "",
) -> Plan:
    """`command` started as the ranks of `settings.framework` on its nodes and
    GPUs: its launch kind's srun step inside a SLURM job, else its local plan
    (the training processes of `run`; the probe's ranks, trainscale.network.probe);
    each rank inside the container `container_command` runs processes in."""
    kind = framework_spec(settings.framework).launch
    command = in_container(command, container_command)
    if in_slurm_job():
        plan = kind.slurm_plan(settings, command, requested_gpus_per_node, requested_cpus_per_task)
    elif settings.nodes != 1:
        raise SettingsError(
            f"--nodes {settings.nodes}: `trainscale` launches on this machine only; "
            "run multi-node points with `snakemake --profile profiles/slurm`"
        )
    else:
        processes_per_node = kind.processes_per_node(settings.gpus_per_node, settings.device)
        plan = kind.local_plan(processes_per_node, command, settings)
    if container_command and runtime_name(container_command) == "docker":
        plan = with_docker_environment(plan, settings.framework)
    return plan


def run_role(settings: RunSettings) -> str:
    """What this process of the run runs: "" the training loop, or the
    "module:function" of its role (a parameter server's), from its place in
    the launch kind's task order."""
    kind = framework_spec(settings.framework).launch
    roles = kind.roles(settings)
    if len(roles) == 1:  # every process runs it: its index is not needed
        return roles[0].runs
    role, _ = kind.role_of(settings, process_index())
    return role.runs


def launch(settings: RunSettings, options: RunOptions) -> LaunchResult:
    """Run every process of the grid point and wait for all of them.

    One process that fails ends the others (they would wait in a collective
    forever); the watchdog ends them all after `options.timeout` seconds.
    """
    prepare_container(settings.container, options.container_command, in_slurm_job())
    timeout = options.timeout
    if in_slurm_job():
        # SLURM's time limit, minus a margin, unless a shorter watchdog is set.
        limit = slurm_watchdog()
        timeout = min(t for t in (timeout, limit) if t) if (timeout or limit) else 0
    plan = process_plan(settings, options)
    # Every process inherits it (mpirun's and srun's, and a container's
    # through its command): rank 0 times its first step from here.
    os.environ[LAUNCHED_AT] = repr(time.time())
    return run_plan(plan, timeout)


def _start_processes(plan: Plan, processes: list, relays: list, oom_lines: list) -> None:
    """Each process of `plan` into `processes`, a thread in `relays` relaying
    its stderr (and keeping its out-of-memory lines in `oom_lines`)."""
    for process in plan:
        proc = subprocess.Popen(
            process.argv,
            env={**os.environ, **process.env},
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
        )
        processes.append(proc)
        relay = threading.Thread(target=relay_output, args=(proc.stderr, sys.stderr, oom_lines))
        relay.start()
        relays.append(relay)


def _cgroup_oom_kill(cgroup, kills_before) -> list[str]:
    """The line saying the kernel killed a process of this memory cgroup for
    memory since it counted `kills_before`; none if it did not."""
    if not cgroup or (cgroup.oom_kills() or 0) <= kills_before:
        return []
    limit = cgroup.limit_mib()
    return [
        "killed by the kernel's out-of-memory handler: memory cgroup "
        f"{cgroup.folder} (limit {f'{limit:.0f} MiB' if limit else 'unknown'})"
    ]


def run_plan(plan: Plan, timeout: float) -> LaunchResult:
    """Start every process of `plan` and wait for all of them, `timeout` seconds
    at most (0: no limit); one that fails ends the others."""
    processes, relays, oom_lines = [], [], []
    tree = ProcessTree()
    cgroup = MemoryCgroup.of_this_process()
    oom_kills_before = cgroup.oom_kills() if cgroup else None
    terminated = threading.Event()
    start = time.monotonic()

    def finish(code, timed_out=False):
        stop_all(processes, tree)
        for relay in relays:
            relay.join(timeout=5)
        if code and not oom_lines:
            oom_lines.extend(_cgroup_oom_kill(cgroup, oom_kills_before))
        seconds = time.monotonic() - start
        oom = oom_lines[0] if oom_lines else ""
        return LaunchResult(code, seconds, timed_out, oom, terminated.is_set())

    # SLURM ends a job (time limit, scancel, node failure) with SIGTERM to every
    # process of the step, then SIGKILL after KillWait: note it and stop cleanly.
    in_main_thread = threading.current_thread() is threading.main_thread()
    if in_main_thread:
        previous_handler = signal.signal(signal.SIGTERM, lambda *_: terminated.set())
    try:
        _start_processes(plan, processes, relays, oom_lines)
        # A process that serves until it is ended (a parameter server) is
        # ended once every process that ends by itself has ended; one the run
        # does not need (an elastic framework's other agents) may fail.
        ending = [process.ends_by_itself for process in plan]
        required = [process.required for process in plan]
        while True:
            codes = [proc.poll() for proc in processes]
            tree.update(processes)
            failed = [c for c, needed in zip(codes, required) if needed and c not in (None, 0)]
            if terminated.is_set():
                return finish(failed[0] if failed else -signal.SIGTERM)
            if failed:
                # The same SIGTERM may have reached a child first; let ours land.
                terminated.wait(0.5)
                return finish(failed[0])
            if said_out_of_memory(oom_lines):
                # The grid point's result: an elastic agent's restart (torchrun
                # restarts a rank that ran out) would only run out again.
                return finish(EXIT_OOM)
            ended = [c is not None and (c == 0 or not needed) for c, needed in zip(codes, required)]
            if all(done for done, ends in zip(ended, ending) if ends):
                return finish(0)
            if timeout and time.monotonic() - start > timeout:
                return finish(-1, timed_out=True)
            time.sleep(0.2)
    except BaseException:
        stop_all(processes, tree)
        raise
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous_handler)
