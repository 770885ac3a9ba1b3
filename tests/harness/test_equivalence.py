"""The test that proves the distributed code right: same data, same start, same weights.

With the same seed, initial weights and GLOBAL batch, 2 replicas of every
synchronous TensorFlow framework (Horovod under both launchers, Mirrored,
MultiWorker, CentralStorage, Horovod elastic) must train the weights
tf-single trains on the full batch: each framework's shared run
(runs.framework_run, whose record test_frameworks.py checks). LeNet-5 has
neither dropout nor batch normalisation, so the only differences allowed are
float32 summation order. A parameter server's workers update in whichever
order they finish: tf-ps has no one-device twin to match.
"""

import pytest
from runs import (
    GLOBAL_BATCH,
    assert_knob_effect,
    assert_options_recorded,
    assert_trains_like_one_device,
    framework_run,
)
from test_frameworks import CASES, launcher_options

from trainscale.catalogue.registry import framework_spec

# Measured on LeNet-5 (2-core Intel Xeon VM): largest difference 3.0e-08 over
# every framework, while the weights moved 3.0e-02 in the 3 steps; the bound
# leaves room for other CPUs' summation orders while staying far below one
# SGD update.
ATOL = 2e-6

SYNCHRONOUS = [
    (framework, launcher)
    for framework, replicas, launcher, _ in CASES
    if replicas == 2 and not framework_spec(framework).asynchronous
]
IDS = [f"{framework}-{launcher}" if launcher else framework for framework, launcher in SYNCHRONOUS]


@pytest.fixture(scope="module")
def reference(run_store, cifar_dir):
    return framework_run(run_store, cifar_dir, "tf-single", 1).weights()


@pytest.mark.slow
@pytest.mark.parametrize(("framework", "launcher"), SYNCHRONOUS, ids=IDS)
def test_two_replicas_match_one_device_on_the_full_batch(
    run_store, cifar_dir, reference, framework, launcher
):
    run = framework_run(run_store, cifar_dir, framework, 2, *launcher_options(launcher))
    assert run.record["batch_size"] == GLOBAL_BATCH // 2
    assert_trains_like_one_device(reference, run.weights(), ATOL, f"{framework} {launcher}")


# Communication knobs that must not change the arithmetic (fusion, packs
# smaller than LeNet-5's 272 KB of gradients, the all-reduce algorithm), and
# one that must: fp16 compression rounds every gradient to half precision on
# the wire, so the update is close but not equal.
RING_IN_SMALL_PACKS = ["--collective-implementation", "ring", "--all-reduce-pack-mb", "0.05"]
KNOBS = [
    ("horovod", list(launcher_options("gloo")), False),  # horovod-gloo's shared run
    ("tf-multiworker", RING_IN_SMALL_PACKS, False),
    ("horovod", ["--horovod-compression", "fp16"], True),
]


@pytest.mark.slow
@pytest.mark.parametrize(("framework", "options", "changes_numbers"), KNOBS)
def test_communication_knobs_change_the_numbers_only_where_they_should(
    run_store, cifar_dir, reference, framework, options, changes_numbers
):
    run = framework_run(run_store, cifar_dir, framework, 2, *options)
    label = f"{framework} {' '.join(options)}"
    assert_knob_effect(reference[1], run.weights()[1], ATOL, changes_numbers, label)
    assert_options_recorded(run.record["settings"], options)
