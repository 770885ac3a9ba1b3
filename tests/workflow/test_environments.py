"""The training environments' GPU builds (make setup GPU=1; a conda study on
GPUs): their pins, envs/train-gpu.yaml's and envs/torch-gpu.yaml's, resolved
against PyPI as pip would install them, so that they cannot rot on a machine
without a GPU. `pip install --dry-run --report` reads the packages' metadata
(PyPI serves it apart from the wheels): no gigabyte is downloaded."""

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

# Network, not training: with the suites that take minutes.
pytestmark = pytest.mark.slow

PINS = os.path.join(REPO, "tools", "environment-pins.py")


def resolved(environment: str, tmp_path) -> dict[str, str]:
    """What pip would install for the environment file's pins on this
    machine's Python 3.11 ({name: version}), from the index alone: local
    folders of wheels (pip's find-links) replaced by an empty one."""
    pins = subprocess.run(
        [sys.executable, PINS, os.path.join(REPO, "envs", environment)],
        capture_output=True, text=True, check=True,
    ).stdout.split("\n")  # fmt: skip
    report = tmp_path / f"{environment}.json"
    env = {**os.environ, "PIP_FIND_LINKS": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--report", str(report), *[pin for pin in pins if pin]],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    installs = json.loads(report.read_text())["install"]
    return {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in installs}


def test_the_tensorflow_gpu_build_resolves_with_cuda(tmp_path):
    packages = resolved("train-gpu.yaml", tmp_path)
    assert packages["tensorflow"] == "2.15.1" and "tensorflow-cpu" not in packages
    # tensorflow[and-cuda]: NVIDIA's CUDA 12 libraries, as wheels.
    assert {"nvidia-cudnn-cu12", "nvidia-cublas-cu12", "nvidia-nccl-cu12"} <= set(packages)
    assert packages["keras"].startswith("2.15.") and packages["numpy"].startswith("1.")


def test_the_torch_gpu_build_is_pypis_cuda_build(tmp_path):
    packages = resolved("torch-gpu.yaml", tmp_path)
    # PyPI's torch for Linux x86_64 is the CUDA build (no +cpu), with its libraries.
    assert packages["torch"] == "2.13.0"
    assert any(name.startswith("nvidia-cuda-runtime") for name in packages), sorted(packages)
    assert any(name.startswith("nvidia-nccl") for name in packages)
    assert packages["ray"] == "2.60.0" and packages["numpy"].startswith("1.")


def test_the_install_scripts_read_each_environment_files_pins_as_conda_does():
    # make setup GPU=1 installs what tools/environment-pins.py reads from the
    # conda file (no YAML library there): the same list a YAML parser finds.
    import yaml

    for environment in ("train.yaml", "torch.yaml", "train-gpu.yaml", "torch-gpu.yaml",
                        "lightning1.yaml"):  # fmt: skip
        path = os.path.join(REPO, "envs", environment)
        with open(path) as handle:
            dependencies = yaml.safe_load(handle)["dependencies"]
        (pip,) = [item["pip"] for item in dependencies if isinstance(item, dict)]
        pins = subprocess.run(
            [sys.executable, PINS, path], capture_output=True, text=True, check=True
        ).stdout.split()
        assert pins == pip, environment
