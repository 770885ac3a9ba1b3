"""Every torch framework through `trainscale run`, for real, on 2 CPU replicas:
each framework's shared run (runs.framework_run), its record checked here."""

import subprocess

import pytest
from runs import (
    assert_classifies_the_sky_survey,
    check_a_torch_run,
    framework_run,
    trainscale,
)

from trainscale.catalogue.launch_kinds import RAY
from trainscale.catalogue.registry import REGISTRY, framework_spec

# This environment's (.venv-torch's): lightning-horovod runs from its own
# (tests/lightning1).
TORCH_FRAMEWORKS = [spec.name for spec in REGISTRY if spec.environment == "torch_env"]
# Each framework's shared run (runs.framework_run), whose weights
# test_equivalence.py holds to torch-single's; ray-train's is checked in
# test_ray_train.py, with what is Ray's. A framework that splits a GPT runs
# in test_gpt_equivalence.py, which checks its record.
RUN_HERE = [
    name
    for name in TORCH_FRAMEWORKS
    if framework_spec(name).launch is not RAY and not framework_spec(name).splits_model
]


@pytest.mark.slow
@pytest.mark.parametrize("framework", RUN_HERE)
def test_each_torch_framework_runs_and_records_every_process(run_store, cifar_dir, framework):
    replicas = 1 if framework_spec(framework).one_device else 2
    run = framework_run(run_store, cifar_dir, framework, replicas)
    check_a_torch_run(run.record, run.stdout, replicas)
    assert run.left_in_temp() == []  # torchrun's agents' log folders among what could be


@pytest.mark.slow
def test_torch_ddp_trains_the_mlp_on_the_sky_survey_table(tmp_path):
    """Seed 004's third data set, SDSS DR17's table, in seed 004's PyTorch DDP."""
    assert_classifies_the_sky_survey(tmp_path, "torch-ddp")


def test_a_torch_framework_refuses_what_it_cannot_run(tmp_path, cifar_dir):
    result = trainscale(
        "run", "--framework", "torch-single", "--gpus-per-node", "2", "--data-dir", cifar_dir
    )
    assert result.returncode == 2
    assert "--framework torch-single runs on one device" in result.stderr


@pytest.mark.parametrize(
    ("framework", "needs", "target"),
    [
        ("tf-single", "tensorflow", "train-env"),
        ("horovod", "horovod.tensorflow (Horovod built without it)", "train-env"),
        # Lightning 1.9 is another environment's: its version, and that environment.
        ("lightning-horovod", "pytorch_lightning<2 (it has pytorch_lightning 2.6.6)",
         "lightning1-env"),
    ],
)  # fmt: skip
def test_the_torch_environment_refuses_the_frameworks_of_other_environments(
    framework, needs, target
):
    result = trainscale("run", "--framework", framework, "--dataset", "synthetic")
    assert result.returncode == 2
    assert f"--framework {framework} needs {needs}" in result.stderr
    assert f"make {target}" in result.stderr and len(result.stderr.splitlines()) == 1


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


@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed"])
def test_lightning_strategies_that_need_a_gpu_are_refused_in_lightnings_words(strategy):
    """Lightning refuses fsdp when its Trainer is made, deepspeed when its
    strategy sets up; trainscale says so before any process starts, quoting it."""
    import pytorch_lightning as pl

    from trainscale.catalogue.knobs import LIGHTNING_NEEDS_A_GPU

    with pytest.raises(Exception) as refused:
        trainer = pl.Trainer(accelerator="cpu", devices=1, strategy=strategy, logger=False)
        trainer.strategy.setup_environment()
    assert str(refused.value).startswith(LIGHTNING_NEEDS_A_GPU[strategy])
    result = trainscale(
        "run", "--framework", "lightning", "--gpus-per-node", "2", "--dataset", "synthetic",
        "--device", "cpu", "--lightning-strategy", strategy,
    )  # fmt: skip
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert LIGHTNING_NEEDS_A_GPU[strategy] in result.stderr
