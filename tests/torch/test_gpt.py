"""The GPT-style decoder is the same network in both ecosystems, and its
counts are trainscale.core.gpt's.

Keras builds gpt-tiny in .venv-train and saves its initial weights and its
logits on fixed tokens; torch loads those weights in its own parameter order
(a Linear weight is a Dense kernel transposed) and must give the same logits.
A layer in another order, a missing bias, another GELU or an attention
without its causal mask each move the logits by far more than float32's
rounding.
"""

import json
import subprocess

import numpy as np
import pytest
import torch
from runs import _write_python_docs_wikitext_2, assert_trains_to_a_perplexity, load_json, trainscale
from torch.utils.flop_counter import FlopCounterMode

from trainscale.catalogue.settings import RunSettings, SettingsError, validate
from trainscale.core.gpt import GPT_SHAPES, parameter_count, training_flops_per_token
from trainscale.frameworks.torch.torch_models import build_torch_model

SEQ_LEN, VOCABULARY = 16, 96

_KERAS_GPT = """
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np
import tensorflow as tf
from trainscale.frameworks.tensorflow.keras_models import build_model

name, seq_len, vocabulary, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
tf.keras.utils.set_random_seed(7)
model = build_model(name, 0, vocabulary, seq_len=seq_len)
tokens = np.random.default_rng(3).integers(0, vocabulary, size=(2, seq_len)).astype(np.int32)
logits = model(tokens).numpy()
arrays = {f"w{i}": v.numpy() for i, v in enumerate(model.trainable_variables)}
np.savez(out, tokens=tokens, logits=logits, **arrays)
counts = {n: int(sum(np.prod(v.shape) for v in build_model(n, 0, 50257, seq_len=128)
                     .trainable_variables)) for n in ("gpt-tiny", "gpt-mini")}
print(json.dumps(counts))
"""


@pytest.fixture(scope="module")
def keras_gpt(tensorflow_python, tmp_path_factory):
    out = tmp_path_factory.mktemp("keras-gpt") / "gpt.npz"
    result = subprocess.run(
        [tensorflow_python, "-c", _KERAS_GPT, "gpt-tiny", str(SEQ_LEN), str(VOCABULARY), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return np.load(out), json.loads(result.stdout)


def _load_keras_weights(model: torch.nn.Module, saved) -> None:
    linear_weights = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    parameters = list(model.parameters())
    assert len(parameters) == len([k for k in saved.files if k.startswith("w")])
    with torch.no_grad():
        for i, parameter in enumerate(parameters):
            value = torch.from_numpy(saved[f"w{i}"])
            parameter.copy_(value.T if id(parameter) in linear_weights else value)


def test_torch_gives_keras_logits_from_keras_weights(keras_gpt):
    saved, _ = keras_gpt
    model = build_torch_model("gpt-tiny", 0, VOCABULARY, seq_len=SEQ_LEN)
    _load_keras_weights(model, saved)
    with torch.no_grad():
        logits = model(torch.from_numpy(saved["tokens"]).long()).numpy()
    difference = np.abs(logits - saved["logits"]).max()
    print(f"gpt-tiny logits, torch against Keras: max |difference| {difference:.2e}")
    assert logits.shape == (2, SEQ_LEN, VOCABULARY)
    assert difference < 1e-4, difference
    # Not equal by accident: the logits depend on the weights (and are not ~0).
    assert np.abs(saved["logits"]).max() > 0.05


def test_keras_counts_the_parameters_torch_and_the_formula_do(keras_gpt):
    _, keras_counts = keras_gpt
    for name, count in keras_counts.items():
        assert count == parameter_count(name, 128, 50257)


@pytest.mark.parametrize("name", GPT_SHAPES)
def test_every_size_of_the_ladder_has_the_formulas_parameters(name):
    shape = GPT_SHAPES[name]
    with torch.device("meta"):  # shapes only: gpt2-xl's 1.6 B numbers are never allocated
        model = build_torch_model(name, 0, 50257, seq_len=shape.context)
    assert sum(p.numel() for p in model.parameters()) == parameter_count(name, shape.context, 50257)


def test_gpt2_small_is_gpt2s_124_m_plus_its_untied_head():
    # GPT-2 small ties its head to the embedding: 124,439,808 parameters.
    untied_head = 768 * 50257
    assert parameter_count("gpt2-small", 1024, 50257) - untied_head == 124_439_808


def test_the_flops_per_token_are_what_torch_counts_in_the_forward_pass_three_times():
    # FlopCounterMode counts the forward's matrix products, attention's two
    # (scores, weighted sum) among them, in full; the formula's 6 N counts
    # the biases and layer norms too, a little more.
    name, seq_len = "gpt-mini", 128
    with torch.device("meta"):
        model = build_torch_model(name, 0, 50257, seq_len=seq_len)
        tokens = torch.zeros(1, seq_len, dtype=torch.long)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(tokens)
    counted = 3 * counter.get_total_flops() / seq_len
    formula = training_flops_per_token(name, seq_len, 50257)
    print(f"{name}: formula / counted {formula / counted:.5f}")
    assert 1.0 <= formula / counted < 1.001


def test_a_text_model_reads_tokens_and_says_so():
    settings = RunSettings(framework="torch-ddp", model="gpt2-small", dataset="synthetic")
    assert (settings.seq_len, settings.vocab_size, settings.num_classes) == (1024, 50257, 50257)
    assert settings.targets_per_example == 1024
    validate(settings)
    with pytest.raises(SettingsError, match="--model gpt-tiny reads tokens: --dataset cifar100"):
        validate(RunSettings(framework="horovod", model="gpt-tiny", dataset="cifar100"))


@pytest.mark.parametrize("checkpointing", [False, True])
def test_activation_checkpointing_runs_each_block_again_in_backward(checkpointing):
    model = build_torch_model("gpt-tiny", 0, 96, seq_len=16)
    model.checkpoint_activations = checkpointing
    calls = []
    # The attention's: torch stops recomputing a block once it has what
    # backward needs, before the block's own forward returns.
    model.blocks["0"].attention.register_forward_hook(lambda *_: calls.append(1))
    model(torch.zeros(2, 16, dtype=torch.long)).sum().backward()
    assert len(calls) == (2 if checkpointing else 1)
    # Evaluation keeps nothing for backward: no recomputation to arrange.
    with torch.no_grad():
        model(torch.zeros(2, 16, dtype=torch.long))
    assert len(calls) == (3 if checkpointing else 2)


@pytest.mark.slow
def test_accuracy_mode_trains_a_gpt_on_text_to_a_perplexity(tmp_path):
    assert_trains_to_a_perplexity(tmp_path, "torch-ddp", target=18)


@pytest.mark.slow
def test_a_split_model_is_evaluated_as_torch_single_evaluates_the_whole(tmp_path):
    """Accuracy mode on the pipeline's stages and the tensor-parallel group:
    one epoch on the same text and global batch trains the same weights as
    torch-single (tests/torch/test_equivalence.py), so the held-out loss and
    accuracy must be torch-single's. A stage that scored examples twice, or a
    tp group whose ranks each counted the group's test shard, would be off by
    a factor; one that scored another rank's shard, by far more than rounding."""
    data = _write_python_docs_wikitext_2(tmp_path)
    curves = {}
    for framework, ranks in (("torch-single", 1), ("torch-pipeline", 2), ("torch-tp", 2)):
        output = tmp_path / f"{framework}.json"
        trainscale(
            "run",
            *("--framework", framework, "--gpus-per-node", str(ranks), "--device", "cpu"),
            *("--model", "gpt-tiny", "--seq-len", "32", "--batch-size", str(16 // ranks)),
            *("--dataset", "wikitext-2", "--data-dir", data, "--mode", "accuracy"),
            *("--epochs", "1", "--output", str(output)),
            check=True,
            timeout=300,
        )
        record = load_json(output)
        curves[framework] = (record["test_examples"], record["curve"][0])
    examples, whole = curves.pop("torch-single")
    for framework, (split_examples, point) in curves.items():
        print(framework, point["test_loss"] - whole["test_loss"])
        assert split_examples == examples
        assert point["test_loss"] == pytest.approx(whole["test_loss"], rel=1e-6)
        assert point["test_accuracy"] == pytest.approx(whole["test_accuracy"], abs=1e-9)
