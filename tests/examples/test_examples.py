"""The example scripts (examples/) run for real and train as the harness does.

Collected by both training suites (make test): in .venv-train the TensorFlow
examples, in .venv-torch the torch ones; every framework of an ecosystem this
Python runs, so one its environment lacks fails here rather than vanishing.

Each runs 2 steps on a generated CIFAR-100-format archive, on 2 CPU replicas
where its framework is distributed, through `trainscale example` (the
harness's own local launcher); and on the harness's synthetic batch with SGD
it reaches the harness's loss at step 2.
"""

import math
import re

import pytest
from runs import (
    EXAMPLE_LOSS_TOLERANCE,
    example_archive_run,
    example_frameworks,
    example_synthetic_run,
    harness_synthetic_loss,
)

FRAMEWORKS = example_frameworks()


@pytest.fixture(scope="module")
def archive_dir(tmp_path_factory):
    from trainscale.core.datasets import generate_cifar100

    folder = str(tmp_path_factory.mktemp("archive"))
    generate_cifar100(folder, num_images=64, seed=3, archive=True)
    return folder


def test_this_python_runs_some_examples():
    assert FRAMEWORKS, "this Python has neither TensorFlow nor torch: run it from .venv-train"


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_example_trains_on_the_cifar100_archive(framework, archive_dir):
    losses, stdout = example_archive_run(framework, archive_dir)
    assert len(losses) == 2, stdout  # the chief prints each step; the other ranks do not
    assert all(math.isfinite(loss) and loss > 0 for loss in losses), losses
    assert re.search(r"^images/sec: \d", stdout, re.M), stdout


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_example_reaches_the_harness_loss(framework, tmp_path):
    # Same seed, synthetic batch and plain SGD: the same loss at step 2
    # (after one update), so the examples and the measured code cannot drift apart
    # (ray-train's measured code is torch-ddp's: runs.harness_framework).
    losses, stdout = example_synthetic_run(framework)
    harness = harness_synthetic_loss(framework, tmp_path / "harness.json")
    assert len(losses) == 2, stdout
    print(f"{framework}: example {losses[1]:.6f}, harness {harness:.6f}")
    assert abs(losses[0] - losses[1]) > 100 * EXAMPLE_LOSS_TOLERANCE  # the step moved it
    assert abs(losses[1] - harness) <= EXAMPLE_LOSS_TOLERANCE
