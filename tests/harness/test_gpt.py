"""The TensorFlow frameworks train the GPT as tf-single does on the full batch,
and to a perplexity on real text in accuracy mode.

As test_equivalence.py on VGG-16: the same seed, initial weights and global
batch (synthetic tokens, drawn by their place in the global batch), plain
SGD, 2 steps; Horovod's 2 ranks and MirroredStrategy's 2 replicas against
tf-single. The same network as torch's (tests/torch/test_gpt.py), so the
two ecosystems' frameworks are compared on it.
"""

import numpy as np
import pytest
from conftest import load_json, trainscale
from runs import assert_trains_like_one_device, assert_trains_to_a_perplexity

from trainscale.core.gpt import parameter_count

pytestmark = pytest.mark.xdist_group("harness-gpt")

# Measured on this code (AMD EPYC, 2 cores): 4.5e-8 (horovod), 3.0e-8
# (tf-mirrored), float32 steps at the layer norms' scales near 1 (as torch's).
ATOL = 2.4e-7
GPT = ("--model", "gpt-tiny", "--dataset", "synthetic", "--seq-len", "16", "--vocab-size", "96")


def _train(tmp_path, framework, replicas):
    weights, output = tmp_path / f"{framework}.npz", tmp_path / f"{framework}.json"
    trainscale(
        "run",
        *("--framework", framework, "--gpus-per-node", str(replicas), *GPT, "--device", "cpu"),
        *("--global-batch-size", "8", "--optimizer", "sgd", "--learning-rate", "0.5"),
        *("--warmup-steps", "1", "--blocks", "1", "--steps-per-block", "1"),
        *("--output", str(output), "--save-weights", str(weights)),
        check=True,
        timeout=600,
    )
    record = load_json(output)
    assert record["trainable_parameters"] == parameter_count("gpt-tiny", 16, 96)
    assert record["tokens_per_sec"]["mean"] == pytest.approx(16 * record["images_per_sec"]["mean"])
    with np.load(weights) as arrays:
        count = len([k for k in arrays if k.startswith("final_")])
        return [arrays[f"initial_{i}"] for i in range(count)], [
            arrays[f"final_{i}"] for i in range(count)
        ]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("single"), "tf-single", 1)


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["horovod", "tf-mirrored"])
def test_two_replicas_train_the_gpt_as_one_device_does(tmp_path, reference, framework):
    assert_trains_like_one_device(reference, _train(tmp_path, framework, 2), ATOL, framework)


@pytest.mark.slow
def test_mirrored_accuracy_mode_trains_the_gpt_on_text_to_a_perplexity(tmp_path):
    """TensorFlow's side of tests/torch/test_gpt.py's accuracy test: the target
    is a perplexity, reached on held-out Python reference text."""
    assert_trains_to_a_perplexity(tmp_path, "tf-mirrored", target=15)
