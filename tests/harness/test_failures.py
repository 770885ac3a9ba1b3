"""Out of memory, the watchdog, and a rank that dies: outcomes, never hangs, never numbers."""

import contextlib
import dataclasses
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from run_processes import (
    ENDLESS,
    FIRST_BLOCK,
    KilledRun,
    assert_it_ended_quickly_without_a_record,
    kill_a_rank,
    memory_cgroup,
    process_in_task_order,
    processes_writing,
    second_process,
    start_run,
    watchdog_limit,
)
from runs import TRAINSCALE, load_json

from trainscale.core.supervision import OOM_SIGNS, ProcessTree, stop_all

pytestmark = pytest.mark.slow

BIG = [
    "--model",
    "vgg16",
    "--image-size",
    "224",
    "--batch-size",
    "64",
    "--dataset",
    "synthetic",
    "--device",
    "cpu",
    "--warmup-steps",
    "1",
    "--blocks",
    "1",
    "--steps-per-block",
    "1",
]


def run_capped(args, address_space_mb, timeout=300):
    """`trainscale run` under a memory cap on its own processes (RLIMIT_AS), never the machine."""
    limit = address_space_mb * 1024 * 1024

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "1"}
    return subprocess.run(
        [sys.executable, "-m", "trainscale", "run", *args],
        preexec_fn=cap,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


@pytest.mark.parametrize(
    ("framework", "replicas", "cap_mb"),
    [
        # TensorFlow's oneDNN kernel reports RESOURCE_EXHAUSTED, then the process crashes.
        ("tf-single", 1, 4000),
        # Both Horovod ranks run out (where depends on the allocator's order).
        ("horovod", 2, 3000),
    ],
)
def test_out_of_memory_is_a_recorded_outcome(tmp_path, framework, replicas, cap_mb):
    output = tmp_path / "r.json"
    result = run_capped(
        ["--framework", framework, "--gpus-per-node", str(replicas), *BIG, "--output", str(output)],
        cap_mb,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    record = load_json(output)
    assert record["status"] == "oom"
    # Where memory runs out first varies (input batch, weights, activations);
    # the record keeps the first line that said so, whichever it was.
    assert any(s in record["error"] for s in OOM_SIGNS) and "\n" not in record["error"]
    assert record["images_per_sec"] is None  # no number for what was not measured
    assert record["elapsed_seconds"] > 0
    assert "OOM after" in result.stdout


def test_a_kernel_oom_kill_in_a_memory_cgroup_is_a_recorded_outcome(tmp_path):
    # What SLURM's --mem with ConstrainRAMSpace (or a container's limit) does:
    # the kernel SIGKILLs the biggest process, which prints nothing. The
    # launcher counts its cgroup's OOM kills; the training process made itself
    # the kernel's first choice (oom_score_adj), so the launcher survives.
    folder = memory_cgroup(1500)
    if folder is None:
        pytest.skip("needs root and a writable cgroup v1 memory controller")
    output = tmp_path / "r.json"
    try:
        result = subprocess.run(
            [*TRAINSCALE, "run", "--framework", "tf-single", *BIG, "--output", str(output)],
            preexec_fn=lambda: (folder / "cgroup.procs").write_text(str(os.getpid())),
            capture_output=True,
            text=True,
            timeout=300,
        )
        oom_kills = (folder / "memory.oom_control").read_text()
    finally:
        folder.rmdir()
    assert "oom_kill 1" in oom_kills  # the kernel, not TensorFlow, ended it
    assert result.returncode == 0, result.stderr[-3000:]
    record = load_json(output)
    assert record["status"] == "oom" and record["images_per_sec"] is None
    assert "out-of-memory handler" in record["error"] and "limit 1500 MiB" in record["error"]


# Horovod on 2 CPU ranks training (nearly) forever: only a stop ends it.
ENDLESS_HOROVOD = ["--framework", "horovod", *ENDLESS]


# Every bound below that must fall inside training (not start-up) is sized
# from how long start-up takes on this machine, measured by the killed-rank
# run: the same step runs up to 7x slower on one CPU than another, and a
# fixed 20 s ended one run still in warm-up on a slow Xeon. Hang bounds are
# generous for the same reason.


@pytest.fixture(scope="module")
def killed_horovod_rank(run_store) -> KilledRun:
    """Horovod's rank 1 SIGKILLed in its first timed block, once for the
    pytest run: how the run ended, and this machine's start-up to that block
    (mpirun, imports, tracing, warm-up), measured rather than assumed."""

    def killed(folder):
        return dataclasses.asdict(kill_a_rank(ENDLESS_HOROVOD, Path(folder, "r.json"), FIRST_BLOCK))

    return KilledRun(**run_store.once("killed-horovod-rank", killed))


def test_a_killed_rank_ends_the_run_quickly_and_leaves_no_record(killed_horovod_rank):
    assert_it_ended_quickly_without_a_record(killed_horovod_rank)


@pytest.mark.parametrize(
    ("launch_options", "status", "sign"),
    [
        # MultiWorkerMirrored: the collective timeout (or TF's heartbeat check,
        # whichever is first) fails the waiting worker.
        (
            ["--framework", "tf-multiworker", "--collective-timeout", "10"],
            "failed",
            ("Collective has timed out", "heartbeat timeout"),
        ),
        # Horovod over Gloo: Gloo's own timeout, from --collective-timeout.
        (
            ["--framework", "horovod", "--horovod-launcher", "gloo", "--collective-timeout", "10"],
            "failed",
            ("Application timeout caused pair closure", "Timed out"),
        ),
        # Horovod over MPI has no collective timeout: the watchdog ends it
        # (--timeout set below, from this machine's start-up time), and its
        # record says so.
        (["--framework", "horovod"], "timeout", ("stopped by the watchdog",)),
    ],
    ids=["multiworker", "horovod-gloo", "horovod-mpi"],
)
def test_a_stalled_rank_ends_the_run_within_its_bound(
    tmp_path, killed_horovod_rank, launch_options, status, sign
):
    """SIGSTOP: the process lives, holds its sockets, and never answers.

    Up to about 70 s in a loaded suite: the run starts and trains to its
    first block, then the stall must last out the bound (the watchdog's
    limit, 3x this machine's start-up to the first block plus 10 s, or the
    10 s collective timeout) and the launcher's stop of a frozen process."""
    output = tmp_path / "r.json"
    endless = [*ENDLESS, "--attempts", "1"]  # the same training, any framework
    limit = watchdog_limit(killed_horovod_rank.seconds_to_first_block)
    if status == "timeout":
        endless += ["--timeout", str(limit)]
    start = time.monotonic()
    run, printed = start_run(*launch_options, *endless, "--output", str(output))
    try:
        victim = second_process(output)
        printed.wait_for(FIRST_BLOCK)  # into the timed blocks
        os.kill(victim, signal.SIGSTOP)
        stopped_at = time.monotonic()
        run.wait(timeout=300)
    finally:
        run.kill()
    ended_after, wall = time.monotonic() - stopped_at, time.monotonic() - start
    printed = printed.text()
    print(f"{' '.join(launch_options)}: ended {ended_after:.1f} s after the stop")
    record = load_json(output)
    assert record["status"] == status and record["images_per_sec"] is None
    assert any(s in printed or s in record["error"] for s in sign), printed[-6000:]
    if status == "timeout":
        # The watchdog's limit from launch, plus its stop (up to 15 s: SIGTERM's
        # grace, SIGKILL's wait) twice over, for a loaded machine.
        assert limit <= record["elapsed_seconds"] <= limit + 30
        assert wall < limit + 45
    else:
        # The 10 s timeout, then up to 15 s to stop a process that ignores
        # SIGTERM, with room for a loaded machine; a hung run waits 300 s.
        assert ended_after < 120


# A chief, a parameter server, two workers: each role is a process of its own.
ENDLESS_PARAMETER_SERVER = ["--framework", "tf-ps", *ENDLESS]


@pytest.mark.parametrize(("role", "index"), [("chief", 0), ("server", 1), ("worker", 2)])
def test_a_killed_process_of_any_role_ends_a_parameter_server_run(tmp_path, role, index):
    """A server or a worker never ends by itself: the launcher must not wait
    for it, nor for a chief that waits on a lost one.

    Up to about a minute in a loaded suite: four TensorFlow processes (chief,
    server, two workers) start and reach the first timed block before the
    kill, and the others are then stopped."""
    killed = kill_a_rank(
        ENDLESS_PARAMETER_SERVER,
        tmp_path / "r.json",
        FIRST_BLOCK,
        victim_of=lambda output: process_in_task_order(output, index),
    )
    assert_it_ended_quickly_without_a_record(killed)


def test_stopping_a_run_ends_and_waits_for_an_orphan_deaf_to_sigterm():
    # A child that leaves a grandchild ignoring SIGTERM behind: what a rank is
    # to the launcher once mpirun has gone, if the rank is hung.
    child = subprocess.Popen(["sh", "-c", "sh -c 'trap \"\" TERM; sleep 600' & wait"])
    tree = ProcessTree()
    deadline = time.monotonic() + 10
    while len(tree.start_times) < 2:  # the inner shell and its sleep
        assert time.monotonic() < deadline, "the grandchild never started"
        tree.update([child])
        time.sleep(0.1)
    grandchildren = tree.alive()
    start = time.monotonic()
    stop_all([child], tree, grace=1)
    assert child.returncode is not None
    assert tree.alive() == [] and len(grandchildren) == 2
    assert time.monotonic() - start < 1 + 5  # the grace, then SIGKILL's wait


@pytest.mark.parametrize(
    "launch_options",
    [
        ["--framework", "horovod"],
        ["--framework", "horovod", "--horovod-launcher", "gloo"],
        ["--framework", "tf-multiworker"],
    ],
    ids=["horovod-mpi", "horovod-gloo", "multiworker"],
)
def test_ctrl_c_ends_every_rank_before_the_launcher_returns(tmp_path, launch_options):
    # Ctrl-C reaches the terminal's process group: the launcher and mpirun, but
    # not the ranks, which mpirun starts in process groups of their own. mpirun
    # exits at once and its ranks train on as orphans; Snakemake, seeing the
    # job end, would exit with them still running. The launcher must return
    # only when every process of the run is gone.
    output = tmp_path / "r.json"
    run, printed = start_run(
        *launch_options,
        *ENDLESS,
        "--output",
        str(output),
        start_new_session=True,  # a terminal of its own, to press Ctrl-C in
    )
    try:
        second_process(output)
        printed.wait_for(FIRST_BLOCK)  # into the training
        assert len(processes_writing(output)) == 2
        os.killpg(run.pid, signal.SIGINT)
        interrupted_at = time.monotonic()
        run.wait(timeout=60)
        returned_after = time.monotonic() - interrupted_at
        left = processes_writing(output)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
    print(f"{' '.join(launch_options)}: returned {returned_after:.1f} s after Ctrl-C")
    assert run.returncode != 0
    assert left == [], f"trainings still running after the launcher returned: {left}"
    # 10 s for SIGTERM, then SIGKILL and its 5 s, with room for a loaded machine.
    assert returned_after < 45
    assert not output.exists()


def test_concurrent_runs_on_one_machine_do_not_collide_and_stop_at_their_time_budget(
    tmp_path, cifar_dir
):
    """Two MultiWorker and two Horovod runs of the same study at once, as the
    local executor or SLURM packing small jobs on a node would start them:
    no port, temp file or record may be shared. Each is bounded by a 2 s
    time budget, which both processes of a run must stop at after the same
    block (else one waits for ever in the next block's collective).

    Over a minute on a slow or loaded CPU (up to 93 s seen): 8 TensorFlow
    processes start at once on this machine's cores, and each reads the
    CIFAR-100-format data before its first block."""
    runs = []
    for i, framework in enumerate(["tf-multiworker", "tf-multiworker", "horovod", "horovod"]):
        output = tmp_path / f"{framework}-{i}.json"
        args = [
            *("--framework", framework, "--gpus-per-node", "2", "--model", "small_cnn"),
            *("--image-size", "32", "--batch-size", "8", "--device", "cpu"),
            *("--dataset", "cifar100", "--data-dir", cifar_dir),
            *("--warmup-steps", "1", "--steps-per-block", "2"),
            *("--blocks", "100000", "--time-budget-seconds", "2"),
            *("--timeout", "900"),  # a hang bound: four 2-process runs share 2 cores
            *("--output", str(output)),
        ]
        command = [sys.executable, "-m", "trainscale", "run", *args]
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        runs.append(
            (
                output,
                subprocess.Popen(
                    command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
                ),
            )
        )
    for output, proc in runs:
        _, stderr = proc.communicate(timeout=1000)
        assert proc.returncode == 0, stderr[-3000:]
        record = load_json(output)
        assert record["status"] == "ok" and record["replicas"] == 2
        blocks = record["blocks"]
        assert record["settings"]["time_budget_seconds"] == 2.0
        assert 2 <= blocks < 100000 and len(record["images_per_sec"]["samples"]) == blocks
        # The budget is counted on the slowest process; each step's
        # all-reduce keeps the processes in step, so the chief's own blocks
        # took about as long.
        slowest_block = record["step_time_ms"]["p99"] * 2 / 1000  # 2 steps a block
        assert 1.5 <= record["timed_seconds"] <= 2.0 + 2 * slowest_block + 0.5
        assert f"block {blocks}/100000" in stderr
        assert f"block {blocks + 1}/100000" not in stderr
    # Each run's record and its own timeline (trainscale.core.faults), nothing else.
    expected = [name for o, _ in runs for name in (o.name, f"{o.name}.timeline.jsonl")]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(expected)
