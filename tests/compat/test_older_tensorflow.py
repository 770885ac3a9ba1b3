"""The harness on an older stack than .venv-train's: `make test-compat` runs this
file with .venv-compat's Python (3.8, TensorFlow 2.11.0, Horovod 0.28.1 built
against it: what NVIDIA's tensorflow:23.03-tf2-py3 image carries, and
EasyBuild's Horovod-0.28.1-foss-2022a-...-TensorFlow-2.11.0). One tiny real run
per framework, and the mixed-precision paths that differ on older Keras."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

TINY = [
    "--model", "small_cnn", "--batch-size", "16", "--image-size", "32", "--device", "cpu",
    "--warmup-steps", "1", "--blocks", "2", "--steps-per-block", "2",
]  # fmt: skip


@pytest.fixture(scope="module")
def cifar_dir(tmp_path_factory):
    from trainscale.core.datasets import generate_cifar100

    root = tmp_path_factory.mktemp("cifar")
    generate_cifar100(str(root), num_images=256, seed=7)
    return str(root)


def run(tmp_path, cifar_dir, *args):
    output = tmp_path / "record.json"
    result = subprocess.run(
        [sys.executable, "-m", "trainscale", "run", *TINY, "--data-dir", cifar_dir, *args,
         "--output", str(output)],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    with open(output) as handle:
        return json.load(handle)


@pytest.mark.parametrize(
    "args",
    [
        ["--framework", "tf-single"],
        ["--framework", "horovod", "--gpus-per-node", "2"],
        ["--framework", "horovod", "--gpus-per-node", "2", "--horovod-launcher", "gloo"],
        ["--framework", "tf-mirrored", "--gpus-per-node", "2"],
        ["--framework", "tf-multiworker", "--gpus-per-node", "2"],
        # Older Keras: AutoCastVariable cannot be broadcast as is, and
        # LossScaleOptimizerV3 cannot list its variables
        # (trainscale.frameworks.tensorflow.strategies).
        [
            "--framework",
            "horovod",
            "--gpus-per-node",
            "2",
            "--precision",
            "fp16",
            "--horovod-compression",
            "fp16",
        ],
        ["--framework", "horovod", "--gpus-per-node", "2", "--precision", "bf16"],
        ["--framework", "tf-mirrored", "--gpus-per-node", "2", "--precision", "fp16"],
    ],  # fmt: skip
    ids=lambda args: "-".join(a.lstrip("-") for a in args if a not in ("--gpus-per-node", "2")),
)
def test_every_framework_runs_on_the_older_stack(tmp_path, cifar_dir, args):
    import tensorflow as tf

    record = run(tmp_path, cifar_dir, *args)
    assert record["status"] == "ok" and record["images_per_sec"]["mean"] > 0
    assert len(record["images_per_sec"]["samples"]) == 2
    provenance = record["provenance"]
    # The record names the stack it ran on: this interpreter's, not .venv-train's.
    assert provenance["python"] == platform.python_version()
    assert provenance["tensorflow"] == tf.__version__ != "2.15.1"
    assert provenance["horovod"] == "0.28.1"
