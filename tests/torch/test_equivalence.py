"""Every distributed torch framework on 2 CPU replicas equals torch-single on the full batch.

As tests/harness/test_equivalence.py for TensorFlow: the same seed, initial
weights and GLOBAL batch; VGG-16 (no dropout, no batch norm) at 32x32; plain
SGD, whose update is linear in the gradient; 2 steps (one warm-up, one
timed). Only float32 summation order may differ. The frameworks come from the
registry; a framework's knob that changes which collectives reduce the
gradient adds cases of its own. A framework that summed where it should
average would be off by a whole update here.
"""

import numpy as np
import pytest
from runs import (
    assert_knob_effect,
    assert_options_recorded,
    assert_trains_like_one_device,
    load_json,
    trainscale,
)

from trainscale.study.registry import REGISTRY

MODEL_PARALLEL = [s.name for s in REGISTRY if s.splits_model]

# Its module fixture is expensive: every test of it on one pytest-xdist worker.
pytestmark = pytest.mark.xdist_group("torch-equivalence")

# Measured on this code (AMD EPYC, 2 cores): see the test's printed line.
ATOL = 2e-6
GLOBAL_BATCH = 8


def _train(tmp_path, cifar_dir, framework, replicas, *options):
    weights = tmp_path / f"{framework}.npz"
    output = tmp_path / f"{framework}.json"
    trainscale(
        "run",
        *("--framework", framework, "--gpus-per-node", str(replicas)),
        *("--model", "vgg16", "--image-size", "32", "--device", "cpu"),
        *("--global-batch-size", str(GLOBAL_BATCH), "--data-dir", cifar_dir),
        *("--optimizer", "sgd", "--learning-rate", "0.05"),
        *("--warmup-steps", "1", "--blocks", "1", "--steps-per-block", "1"),
        *("--output", str(output), "--save-weights", str(weights)),
        *options,
        check=True,
        timeout=600,
    )
    assert load_json(output)["batch_size"] == GLOBAL_BATCH // replicas
    return weights_of(weights)


def weights_of(path) -> tuple[list, list]:
    """The (initial, final) weights a run saved with --save-weights."""
    with np.load(path) as arrays:
        count = len([k for k in arrays if k.startswith("final_")])
        return [arrays[f"initial_{i}"] for i in range(count)], [
            arrays[f"final_{i}"] for i in range(count)
        ]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cifar_dir):
    return _train(tmp_path_factory.mktemp("single"), cifar_dir, "torch-single", 1)


# The data-parallel ones: the model-parallel frameworks split a GPT, not
# VGG-16 (test_gpt_equivalence.py).
DISTRIBUTED = [
    s.name
    for s in REGISTRY
    if s.ecosystem == "torch" and not s.one_device and s.name not in MODEL_PARALLEL
]
# Each framework at its defaults, and ZeRO's other stages (0 is the default):
# each reduces the gradient with other collectives.
CASES = [(name, []) for name in DISTRIBUTED] + [
    ("deepspeed", ["--zero-stage", stage]) for stage in ("1", "2", "3")
]


@pytest.mark.slow
@pytest.mark.parametrize(("framework", "options"), CASES, ids=[" ".join([f, *o]) for f, o in CASES])
def test_two_replicas_match_one_device_on_the_full_batch(
    tmp_path, cifar_dir, reference, framework, options
):
    run = _train(tmp_path, cifar_dir, framework, 2, *options)
    assert_trains_like_one_device(reference, run, ATOL, " ".join([framework, *options]))
    assert_options_recorded(load_json(tmp_path / f"{framework}.json")["settings"], options)


# Knobs that must not change the arithmetic (bucket size, fusion, FSDP2's
# resharding), and the fp16 compressions, which round every gradient to half
# precision on the wire.
KNOBS = [
    ("torch-ddp", ["--ddp-bucket-cap-mb", "1"], False),
    ("horovod-torch", ["--horovod-fusion-threshold-mb", "0"], False),
    ("torch-fsdp", ["--no-fsdp-reshard-after-forward"], False),
    ("torch-ddp", ["--ddp-compression", "fp16"], True),
    ("horovod-torch", ["--horovod-compression", "fp16"], True),
]


@pytest.mark.slow
@pytest.mark.parametrize(("framework", "options", "changes_numbers"), KNOBS)
def test_communication_knobs_change_the_numbers_only_where_they_should(
    tmp_path, cifar_dir, reference, framework, options, changes_numbers
):
    _, final = _train(tmp_path, cifar_dir, framework, 2, *options)
    label = f"{framework} {' '.join(options)}"
    assert_knob_effect(reference[1], final, ATOL, changes_numbers, label)
    assert_options_recorded(load_json(tmp_path / f"{framework}.json")["settings"], options)
