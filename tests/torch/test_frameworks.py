"""Every torch framework through `trainscale run`, for real, on 2 CPU replicas."""

import os
import resource
import subprocess

import pytest
from runs import (
    TINY,
    TRAINSCALE,
    check_a_torch_run,
    load_json,
    memory_cgroup,
    one_per_launch_kind,
    trainscale,
)

from trainscale.core.supervision import OOM_SIGNS
from trainscale.study.launch_kinds import RAY
from trainscale.study.registry import REGISTRY, framework_spec

TORCH_FRAMEWORKS = [spec.name for spec in REGISTRY if spec.ecosystem == "torch"]
# ray-train's run of this shape is test_ray_train.py's, which asserts all of
# the test below and what is Ray's: one Ray start in the suite, not two.
# A framework that splits a GPT runs in test_gpt_equivalence.py, which checks its record.
RUN_HERE = [
    name
    for name in TORCH_FRAMEWORKS
    if framework_spec(name).launch is not RAY and not framework_spec(name).splits_model
]


def _run(tmp_path, cifar_dir, framework, replicas, *options):
    output = tmp_path / f"{framework}.json"
    result = trainscale(
        "run",
        *("--framework", framework, "--gpus-per-node", str(replicas), "--model", "small_cnn"),
        *("--data-dir", cifar_dir, "--batch-size", "16", "--output", str(output)),
        *TINY,
        *options,
        check=True,
    )
    return load_json(output), result


@pytest.mark.slow
@pytest.mark.parametrize("framework", RUN_HERE)
def test_each_torch_framework_runs_and_records_every_process(tmp_path, cifar_dir, framework):
    replicas = 1 if framework_spec(framework).one_device else 2
    record, result = _run(tmp_path, cifar_dir, framework, replicas)
    check_a_torch_run(record, result, replicas)


@pytest.mark.slow
def test_the_torch_knobs_run_and_are_recorded(tmp_path, cifar_dir):
    record, _ = _run(
        tmp_path,
        cifar_dir,
        "torch-single",
        1,
        *("--compile", "--channels-last", "--precision", "bf16"),
    )
    settings = record["settings"]
    assert settings["compile"] is True and settings["channels_last"] is True
    assert settings["precision"] == "bf16" and record["status"] == "ok"


def test_a_torch_framework_refuses_what_it_cannot_run(tmp_path, cifar_dir):
    result = trainscale(
        "run", "--framework", "torch-single", "--gpus-per-node", "2", "--data-dir", cifar_dir
    )
    assert result.returncode == 2
    assert "--framework torch-single runs on one device" in result.stderr


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


@pytest.mark.slow
@pytest.mark.parametrize("framework", one_per_launch_kind("torch"))
def test_out_of_memory_is_a_recorded_outcome(tmp_path, framework):
    # torch's CPU allocator raises a RuntimeError ("DefaultCPUAllocator: can't
    # allocate memory"); the launcher reads it from the output, as for TensorFlow.
    replicas, cap_mb = (1, 4000) if framework_spec(framework).one_device else (2, 3000)
    output = tmp_path / "r.json"
    big = [
        "--model",
        "vgg16",
        "--image-size",
        "224",
        "--batch-size",
        "64",
        "--dataset",
        "synthetic",
    ]
    one_step = [
        "--device",
        "cpu",
        "--warmup-steps",
        "1",
        "--blocks",
        "1",
        "--steps-per-block",
        "1",
    ]
    args = ["--framework", framework, "--gpus-per-node", str(replicas), *big, *one_step]
    run = _run_in_memory_cgroup if framework_spec(framework).launch is RAY else _run_capped
    result = run([*args, "--output", str(output)], cap_mb)
    assert result.returncode == 0, result.stderr[-3000:]
    record = load_json(output)
    assert record["status"] == "oom" and record["images_per_sec"] is None
    signs = (*OOM_SIGNS, "out-of-memory handler")  # torch's words, or the kernel's
    assert any(sign in record["error"] for sign in signs)
    assert "OOM after" in result.stdout


@pytest.mark.parametrize(
    ("framework", "needs"),
    [("tf-single", "tensorflow"), ("horovod", "horovod.tensorflow (Horovod built without it)")],
)
def test_the_torch_environment_refuses_the_tensorflow_frameworks(framework, needs):
    result = trainscale("run", "--framework", framework, "--dataset", "synthetic")
    assert result.returncode == 2
    assert f"--framework {framework} needs {needs}" in result.stderr
    assert "make train-env" in result.stderr and len(result.stderr.splitlines()) == 1


def test_the_tensorflow_environment_refuses_horovod_torch(tensorflow_python):
    result = subprocess.run(
        [
            tensorflow_python,
            "-m",
            "trainscale",
            "run",
            "--framework",
            "horovod-torch",
            "--dataset",
            "synthetic",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "needs horovod.torch (Horovod built without it)" in result.stderr
    assert "make torch-env" in result.stderr


def test_the_registry_names_each_torch_frameworks_backend():
    import importlib

    from trainscale.harness.backend import Backend

    for name in TORCH_FRAMEWORKS:
        module, _, cls = framework_spec(name).backend.partition(":")
        assert issubclass(getattr(importlib.import_module(module), cls), Backend), name
