"""The example scripts (examples/) run for real and train as the harness does.

Collected by both training suites (make test): in .venv-train the TensorFlow
examples, in .venv-torch the torch ones; every framework of an ecosystem this
Python runs, so one its environment lacks fails here rather than vanishing.

Each runs 2 steps on real data (an image example on a generated
CIFAR-100-format archive, a text example on a text file), on 2 CPU replicas
where its framework is distributed, through `trainscale example` (the
harness's own local launcher), once per data-reading code; and each, on the
harness's synthetic batch with SGD
it reaches the harness's loss at step 2: an image example that of one
harness run per ecosystem and replica count, a text example its framework's
shared GPT run (tests/torch/test_gpt_equivalence.py).
"""

import math
import re

import pytest
from example_runs import (
    EXAMPLE_LOSS_TOLERANCE,
    data_run_cases,
    example_cases,
    example_data_run,
    example_synthetic_run,
    harness_reference_loss,
)

EXAMPLES = example_cases()
IDS = [example.name for example in EXAMPLES]
RATE = {"image": "images/sec", "text": "tokens/sec"}


@pytest.fixture(scope="module")
def archive_dir(tmp_path_factory):
    from trainscale.core.datasets import generate_cifar100

    folder = str(tmp_path_factory.mktemp("archive"))
    generate_cifar100(folder, num_images=64, seed=3, archive=True)
    return folder


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    # Real English: this checkout's README, as UTF-8 bytes.
    from trainscale.launching.examples import REPOSITORY

    path = tmp_path_factory.mktemp("text") / "readme.txt"
    with open(f"{REPOSITORY}/README.md", "rb") as readme:
        path.write_bytes(readme.read())
    return str(path)


def test_this_python_runs_some_examples():
    assert EXAMPLES, "this Python has neither TensorFlow nor torch: run it from .venv-train"


# One real-data run per data-reading code (example_runs.data_run_cases): an
# example whose data code is another's reads its files with that code.
DATA_RUNS = data_run_cases(EXAMPLES)


@pytest.mark.slow
@pytest.mark.parametrize("example", DATA_RUNS, ids=[example.name for example in DATA_RUNS])
def test_example_trains_on_real_data(example, archive_dir, text_file):
    """Ray's case over a minute on a slow or loaded CPU (81 s on an AVX2
    AMD EPYC, 32 s on a Zen 5 one): Ray's instance starts, then Train's
    controller actor and the workers, each a process importing torch and Ray,
    before the first step."""
    losses, stdout = example_data_run(example, archive_dir, text_file)
    assert len(losses) == 2, stdout  # the chief prints each step; the other ranks do not
    assert all(math.isfinite(loss) and loss > 0 for loss in losses), losses
    assert re.search(rf"^{RATE[example.workload]}: \d", stdout, re.M), stdout


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES, ids=IDS)
def test_example_reaches_the_harness_loss(example, run_store):
    """Ray's case over a minute on a slow or loaded CPU (78 s on an AVX2
    AMD EPYC, 33 s on a Zen 5 one): Ray's instance starts, then Train's
    controller actor and the workers, each a process importing torch and Ray,
    before the first step."""
    # Same seed, synthetic batch and plain SGD: the same loss at step 2
    # (after one update), so the examples and the measured code cannot drift
    # apart. The harness's run is shared (example_runs.reference_framework).
    losses, stdout = example_synthetic_run(example)
    harness = harness_reference_loss(run_store, example)
    assert len(losses) == 2, stdout
    print(f"{example.name}: example {losses[1]:.6f}, harness {harness:.6f}")
    assert abs(losses[0] - losses[1]) > 100 * EXAMPLE_LOSS_TOLERANCE  # the step moved it
    assert abs(losses[1] - harness) <= EXAMPLE_LOSS_TOLERANCE
