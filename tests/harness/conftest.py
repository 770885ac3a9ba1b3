"""Shared helpers: the tests run the real `trainscale` command in subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# The interpreter running the tests is the training environment's (make test
# uses .venv-train/bin/python), so `-m trainscale` is the installed harness.
TRAINSCALE = [sys.executable, "-m", "trainscale"]

# Tiny but real: every run below trains for real on the CPU.
TINY = [
    "--device",
    "cpu",
    "--image-size",
    "32",
    "--warmup-steps",
    "1",
    "--iterations",
    "2",
    "--steps-per-iteration",
    "2",
]


def trainscale(*args: str, timeout: float = 300, check: bool = False, env=None):
    """Run the CLI; return the CompletedProcess (stdout and stderr as text)."""
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    result = subprocess.run(
        [*TRAINSCALE, *args], capture_output=True, text=True, timeout=timeout, env=full_env
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"trainscale {' '.join(args)} exited {result.returncode}\n"
            f"stdout:\n{result.stdout}\nstderr:\n{result.stderr[-4000:]}"
        )
    return result


def load_json(path) -> dict:
    with open(path) as handle:
        return json.load(handle)


@pytest.fixture(scope="session")
def cifar_dir(tmp_path_factory):
    """A small data set in the real cifar-100-python format (the folder form)."""
    from trainscale.data import generate_cifar100

    root = tmp_path_factory.mktemp("cifar")
    generate_cifar100(str(root), num_images=256, seed=7)
    return str(root)
