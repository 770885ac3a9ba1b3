"""The example scripts (examples/) run for real and train as the harness does.

Collected by both training suites (make test): in .venv-train the TensorFlow
examples, in .venv-torch the torch ones; every framework of an ecosystem this
Python runs, so one its environment lacks fails here rather than vanishing.

Each runs 2 steps on a generated CIFAR-100-format archive, on 2 CPU replicas
where its framework is distributed, through `trainscale example` (the
harness's own local launcher); and on the harness's synthetic batch with SGD
it reaches the harness's loss (the checks are in tests/runs.py).
"""

import pytest
from runs import (
    check_example_matches_the_harness,
    check_example_trains_on_the_archive,
    example_frameworks,
)

FRAMEWORKS = example_frameworks()


@pytest.fixture(scope="module")
def archive_dir(tmp_path_factory):
    from trainscale.data import generate_cifar100

    folder = str(tmp_path_factory.mktemp("archive"))
    generate_cifar100(folder, num_images=64, seed=3, archive=True)
    return folder


def test_this_python_runs_some_examples():
    assert FRAMEWORKS, "this Python has neither TensorFlow nor torch: run it from .venv-train"


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_example_trains_on_the_cifar100_archive(framework, archive_dir):
    check_example_trains_on_the_archive(framework, archive_dir)


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_example_reaches_the_harness_loss(framework, tmp_path):
    check_example_matches_the_harness(framework, tmp_path)
