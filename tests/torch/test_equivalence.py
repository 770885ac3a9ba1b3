"""Every distributed torch framework on 2 CPU replicas equals torch-single on the full batch.

As tests/harness/test_equivalence.py for TensorFlow: the same seed, initial
weights and GLOBAL batch; LeNet-5 (no dropout, no batch norm) at 32x32; plain
SGD, whose update is linear in the gradient; 3 steps (one warm-up, two
timed): each framework's shared run (runs.framework_run). Only float32
summation order may differ. The frameworks come from the registry; a
framework's knob that changes which collectives reduce the gradient adds
cases of its own. A framework that summed where it should
average would be off by a whole update here.
"""

import pytest
from runs import (
    GLOBAL_BATCH,
    assert_knob_effect,
    assert_options_recorded,
    assert_trains_like_one_device,
    framework_run,
)

from trainscale.catalogue.registry import REGISTRY

MODEL_PARALLEL = [s.name for s in REGISTRY if s.splits_model]

# Measured on this code (AMD EPYC, 2 cores): see the test's printed line.
ATOL = 2e-6


@pytest.fixture(scope="module")
def reference(run_store, cifar_dir):
    return framework_run(run_store, cifar_dir, "torch-single", 1).weights()


# The data-parallel ones: the model-parallel frameworks split a GPT, not
# LeNet-5 (test_gpt_equivalence.py).
DISTRIBUTED = [
    s.name
    for s in REGISTRY
    if s.environment == "torch_env" and not s.one_device and s.name not in MODEL_PARALLEL
]
# Each framework at its defaults (its shared run, whose record
# test_frameworks.py checks), and ZeRO's other stages (0 is the default):
# each reduces the gradient with other collectives.
CASES = [(name, []) for name in DISTRIBUTED] + [
    ("deepspeed", ["--zero-stage", stage]) for stage in ("1", "2", "3")
]


@pytest.mark.slow
@pytest.mark.parametrize(("framework", "options"), CASES, ids=[" ".join([f, *o]) for f, o in CASES])
def test_two_replicas_match_one_device_on_the_full_batch(
    run_store, cifar_dir, reference, framework, options
):
    """Ray's case over a minute on a slow or loaded CPU (60 s on an AVX2
    AMD EPYC, 29 s on a Zen 5 one): Ray's instance starts, then Train's
    controller actor and the workers, each a process importing torch and Ray,
    before the first step (the shared run, which this test reads first)."""
    run = framework_run(run_store, cifar_dir, framework, 2, *options)
    assert run.record["batch_size"] == GLOBAL_BATCH // 2
    assert_trains_like_one_device(reference, run.weights(), ATOL, " ".join([framework, *options]))
    assert_options_recorded(run.record["settings"], options)


# Knobs that must not change the arithmetic (buckets smaller than LeNet-5's
# 272 KB of gradients, no fusion, FSDP2's resharding), and the fp16
# compressions, which round every gradient to half precision on the wire.
KNOBS = [
    ("torch-ddp", ["--ddp-bucket-cap-mb", "0.05"], False),
    ("horovod-torch", ["--horovod-fusion-threshold-mb", "0"], False),
    ("torch-fsdp", ["--no-fsdp-reshard-after-forward"], False),
    ("torch-ddp", ["--ddp-compression", "fp16"], True),
    ("horovod-torch", ["--horovod-compression", "fp16"], True),
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
