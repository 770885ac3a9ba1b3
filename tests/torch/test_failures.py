"""A torch rank that dies, the watchdog and out of memory: outcomes as for
TensorFlow, never hangs, never numbers. One framework per launch kind: the
launcher ends the others. torch-ddp's runs train in accuracy mode, by epochs
on data in MNIST's real format, whose loop (epochs, evaluation) ends the same
way a throughput run's does."""

import dataclasses
import os
import resource
import subprocess
from pathlib import Path

import pytest
from run_processes import (
    ENDLESS,
    FIRST_BLOCK,
    KilledRun,
    assert_it_ended_quickly_without_a_record,
    kill_a_rank,
    memory_cgroup,
    watchdog_limit,
)
from runs import TRAINSCALE, load_json, make_mnist_dir, one_per_launch_kind, trainscale

from trainscale.catalogue.launch_kinds import RAY
from trainscale.catalogue.registry import framework_spec
from trainscale.core.supervision import OOM_SIGNS, OWN_OOM_SIGN

pytestmark = pytest.mark.slow

FIRST_EPOCH = "epoch 1/100000"


@pytest.fixture(scope="module")
def mnist_dir(run_store):
    return run_store.folder("mnist-512", lambda f: make_mnist_dir(f, train=512, test=64, seed=9))


def endless(framework: str, mnist_dir: str) -> tuple[list[str], str]:
    """2 ranks of `framework` training until stopped, and the line of their
    first timed block; torch-ddp's by epochs with no target (accuracy mode)."""
    if framework != "torch-ddp":
        return ["--framework", framework, *ENDLESS], FIRST_BLOCK
    accuracy = [
        "--framework", "torch-ddp", "--gpus-per-node", "2", "--model", "small_cnn",
        "--image-size", "28", "--dataset", "mnist", "--data-dir", mnist_dir,
        "--device", "cpu", "--batch-size", "16", "--mode", "accuracy", "--epochs", "100000",
    ]  # fmt: skip
    return accuracy, FIRST_EPOCH


# The launch kinds of both ecosystems whose failures tests/harness sees:
# one process (tf-single) and Horovod's ranks (horovod). A kind is its class:
# the launcher starts and ends the same processes whatever they import.
SEEN_IN_TENSORFLOW = {type(framework_spec(name).launch) for name in ("tf-single", "horovod")}


def new_kinds(frameworks: list[str]) -> list[str]:
    return [f for f in frameworks if type(framework_spec(f).launch) not in SEEN_IN_TENSORFLOW]


# One framework of ranks per launch kind: the launcher ends the others. An
# elastic framework survives a lost rank instead (tests/torch/test_elastic.py).
RANKS = new_kinds(
    [
        f
        for f in one_per_launch_kind("torch")
        if not framework_spec(f).one_device and not framework_spec(f).elastic
    ]
)


def killed(run_store, mnist_dir, framework: str) -> KilledRun:
    """`framework`'s rank 1 SIGKILLed in training, once for the pytest run."""
    args, first = endless(framework, mnist_dir)

    def kill(folder):
        return dataclasses.asdict(kill_a_rank(args, Path(folder, "r.json"), first))

    return KilledRun(**run_store.once(f"killed-rank-{framework}", kill))


@pytest.mark.parametrize("framework", RANKS)
def test_a_killed_rank_ends_the_run_quickly_and_leaves_no_record(run_store, mnist_dir, framework):
    """Ray's case over a minute on a slow or loaded CPU (61 s on an AVX2
    AMD EPYC, 30 s on a Zen 5 one): Ray's instance starts, then Train's
    controller actor and the workers, each a process importing torch and Ray,
    before the first step that the rank is killed in."""
    assert_it_ended_quickly_without_a_record(killed(run_store, mnist_dir, framework))


def test_the_watchdog_ends_an_accuracy_run_with_a_timeout_record(tmp_path, run_store, mnist_dir):
    # The limit falls well inside training: it is sized from the killed run's
    # start-up to its first epoch, on this machine.
    limit = watchdog_limit(killed(run_store, mnist_dir, "torch-ddp").seconds_to_first_block)
    args, first = endless("torch-ddp", mnist_dir)
    output = tmp_path / "r.json"
    result = trainscale(
        "run", *args, "--timeout", str(limit), "--output", str(output), timeout=limit + 300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    record = load_json(output)
    assert record["status"] == "timeout" and record["images_per_sec"] is None
    assert record["settings"]["mode"] == "accuracy"
    # The limit, and the stop (up to 15 s: SIGTERM's grace, SIGKILL's wait)
    # twice over, for a loaded machine.
    assert limit <= record["elapsed_seconds"] <= limit + 30
    assert first in result.stderr  # it was training when it was stopped


def _run_capped(args, address_space_mb):
    """`trainscale run` under a memory cap on its own processes (RLIMIT_AS), never the machine."""
    limit = address_space_mb * 2**20

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    command = [*TRAINSCALE, "run", *args]
    return subprocess.run(command, preexec_fn=cap, capture_output=True, text=True, timeout=600)


def _run_in_memory_cgroup(args, limit_mb):
    """`trainscale run` in a memory cgroup of its own, as under SLURM's --mem: Ray
    cannot start under RLIMIT_AS (its raylet and GCS reserve more address space:
    "The current node timed out during startup"), so the kernel ends a worker."""
    folder = memory_cgroup(limit_mb)
    if folder is None:
        pytest.skip("needs root and a writable cgroup v1 memory controller")
    try:
        return subprocess.run(
            [*TRAINSCALE, "run", *args],
            preexec_fn=lambda: (folder / "cgroup.procs").write_text(str(os.getpid())),
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        folder.rmdir()


@pytest.mark.parametrize("framework", new_kinds(one_per_launch_kind("torch")))
def test_out_of_memory_is_a_recorded_outcome(tmp_path, mnist_dir, framework):
    """Ray's case over a minute on a slow or loaded CPU (68 s on an AVX2
    AMD EPYC, 31 s on a Zen 5 one): Ray's instance starts, then Train's
    controller actor and the workers, each a process importing torch and Ray,
    before the first step that runs out of memory."""
    # torch's CPU allocator raises a RuntimeError ("DefaultCPUAllocator: can't
    # allocate memory"), torch-ddp's here; the launcher reads it from the
    # output, as for TensorFlow. VGG-16 at 224x224, batch 64, does not fit the cap.
    replicas, cap_mb = (1, 4000) if framework_spec(framework).one_device else (2, 3000)
    big = ["--model", "vgg16", "--image-size", "224", "--batch-size", "64", "--device", "cpu"]
    if framework == "torch-ddp":  # an accuracy run: MNIST's digits resized
        args = [*endless(framework, mnist_dir)[0], *big]
    else:
        args = ["--framework", framework, "--gpus-per-node", str(replicas), *big]
        args += ["--dataset", "synthetic", "--warmup-steps", "1", "--blocks", "1"]
        args += ["--steps-per-block", "1"]
    run = _run_in_memory_cgroup if framework_spec(framework).launch is RAY else _run_capped
    output = tmp_path / "r.json"
    result = run([*args, "--output", str(output)], cap_mb)
    assert result.returncode == 0, result.stderr[-3000:]
    record = load_json(output)
    assert record["status"] == "oom" and record["images_per_sec"] is None, record.get("error")
    signs = (*OOM_SIGNS, "out-of-memory handler")  # torch's words, or the kernel's
    assert any(sign in record["error"] for sign in signs)
    assert "OOM after" in result.stdout
    if run is _run_capped:
        # The rank said so itself (torch's CPU allocator raises a RuntimeError),
        # and the launcher ended the run then: an elastic agent's restarts
        # would only run out again.
        assert OWN_OOM_SIGN in record["error"], record["error"]  # horovodrun prefixes it
        assert result.stderr.count(": warm-up,") <= 1, result.stderr[-3000:]  # one attempt
    if framework == "torch-ddp":
        assert record["settings"]["mode"] == "accuracy"
