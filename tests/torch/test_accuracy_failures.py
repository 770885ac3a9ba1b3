"""Accuracy runs fail as throughput runs do: out of memory, the watchdog and a
killed rank each end in the outcome a throughput run gets (PyTorch DDP, 2 CPU
ranks, on data in MNIST's real format)."""

import resource
import subprocess

import pytest
from runs import (
    TRAINSCALE,
    assert_a_killed_rank_ends_the_run,
    load_json,
    make_mnist_dir,
    trainscale,
    watchdog_limit,
)

pytestmark = pytest.mark.slow

FIRST_EPOCH = "epoch 1/100000"


@pytest.fixture(scope="module")
def mnist_dir(tmp_path_factory):
    return make_mnist_dir(tmp_path_factory.mktemp("mnist"), train=512, test=64, seed=9)


def endless(mnist_dir, model="small_cnn", size=28, batch=16) -> list[str]:
    """2 ranks training by epochs with no target: only a stop ends them."""
    return [
        "--framework", "torch-ddp", "--gpus-per-node", "2", "--model", model,
        "--image-size", str(size), "--dataset", "mnist", "--data-dir", mnist_dir,
        "--device", "cpu", "--batch-size", str(batch), "--mode", "accuracy", "--epochs", "100000",
    ]  # fmt: skip


def test_a_killed_rank_ends_an_accuracy_run_and_leaves_no_record(tmp_path, mnist_dir):
    assert_a_killed_rank_ends_the_run(endless(mnist_dir), tmp_path / "r.json", FIRST_EPOCH)


def test_the_watchdog_ends_an_accuracy_run_with_a_timeout_record(tmp_path, mnist_dir):
    limit = watchdog_limit(endless(mnist_dir), tmp_path / "startup.json", FIRST_EPOCH)
    output = tmp_path / "r.json"
    result = trainscale(
        "run", *endless(mnist_dir), "--timeout", str(limit), "--output", str(output),
        timeout=limit + 300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    record = load_json(output)
    assert record["status"] == "timeout" and record["images_per_sec"] is None
    assert record["settings"]["mode"] == "accuracy"
    assert FIRST_EPOCH in result.stderr  # it was training when it was stopped


def test_running_out_of_memory_in_an_accuracy_run_is_a_recorded_outcome(tmp_path, mnist_dir):
    # VGG-16 at 224x224 (the digits resized) does not fit in a 3 GB address space.
    args = endless(mnist_dir, model="vgg16", size=224, batch=64)
    limit = 3000 * 2**20

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    output = tmp_path / "r.json"
    result = subprocess.run(
        [*TRAINSCALE, "run", *args, "--output", str(output)],
        preexec_fn=cap, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    record = load_json(output)
    assert record["status"] == "oom", record.get("error")
    assert record["settings"]["mode"] == "accuracy" and record["images_per_sec"] is None
