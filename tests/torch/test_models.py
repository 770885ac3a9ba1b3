"""The same model name is the same network in both ecosystems.

Parameter counts (trainable, and with batch-norm statistics) must be equal
to Keras's at 32x32 and 224x224. FLOPs per image are counted differently:
TensorFlow's profiler counts every op of the graph (bias adds, activations,
pooling too), torch's FlopCounterMode only convolutions and matrix products,
so torch's count is a little lower; measured here, 0.9912 (small_cnn) to
0.9995 (vgg19) of Keras's. A different network (torchvision's VGG-16 at 32x32
has 49x the first dense layer; its ResNet-50 strides elsewhere) would miss by
far more.
"""

import json
import subprocess

import pytest
import torch

from trainscale.catalogue.models import IMAGE_MODELS, MODELS, TORCH_MODELS
from trainscale.catalogue.settings import RunSettings, SettingsError, validate
from trainscale.frameworks.torch.torch_models import (
    build_torch_model,
    torch_forward_flops_per_image,
)

# Keras's counts (keras_counts) take most of a minute: every test of this
# module on one pytest-xdist worker, while the other runs other tests (the
# run store would share the counts, but the other worker would sit waiting).
pytestmark = pytest.mark.xdist_group("keras-counts")

SIZES = (32, 224)
TORCH_IMAGE_MODELS = [name for name in TORCH_MODELS if name in IMAGE_MODELS]

_KERAS_COUNTS = """
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np
from trainscale.frameworks.tensorflow.keras_models import build_model, model_forward_flops

counts = {}
for name in sys.argv[1].split(","):
    for size in (32, 224):
        model = build_model(name, size, 100)
        counts[f"{name}@{size}"] = {
            "trainable": int(sum(np.prod(v.shape) for v in model.trainable_variables)),
            "all": int(sum(np.prod(v.shape) for v in model.variables)),
            "forward_flops": model_forward_flops(model, size),
        }
print(json.dumps(counts))
"""


@pytest.fixture(scope="module")
def keras_counts(tensorflow_python, run_store):
    """Keras's counts of every torch image model, once for the pytest run."""

    def count(folder):
        result = subprocess.run(
            [tensorflow_python, "-c", _KERAS_COUNTS, ",".join(TORCH_IMAGE_MODELS)],
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        )
        return json.loads(result.stdout)

    return run_store.once("keras-counts", count)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", TORCH_IMAGE_MODELS)
def test_each_model_has_keras_parameters_and_flops(keras_counts, name, size):
    keras = keras_counts[f"{name}@{size}"]
    model = build_torch_model(name, size, 100)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    statistics = sum(b.numel() for n, b in model.named_buffers() if "num_batches" not in n)
    assert trainable == keras["trainable"]
    assert trainable + statistics == keras["all"]
    ratio = torch_forward_flops_per_image(name, size, 100) / keras["forward_flops"]
    print(f"{name}@{size}: {trainable} parameters, FLOPs torch/Keras {ratio:.4f}")
    assert 0.985 <= ratio <= 1.0


def test_the_models_return_logits_of_the_right_shape():
    for name in TORCH_IMAGE_MODELS:
        assert build_torch_model(name, 32, 100)(torch.zeros(2, 3, 32, 32)).shape == (2, 100)


@pytest.mark.parametrize("name", sorted(set(MODELS) - set(TORCH_MODELS)))
def test_a_model_without_a_torch_twin_is_refused_for_torch(name):
    settings = RunSettings(framework="torch-ddp", model=name, image_size=299, dataset="synthetic")
    with pytest.raises(SettingsError, match=f"--model {name} is not defined for torch"):
        validate(settings)
    validate(RunSettings(framework="horovod", model=name, image_size=299, dataset="synthetic"))


def test_small_cnn_on_mnist_is_seed_003s_table_layer_by_layer():
    # The seed's table (conv1 260, conv2 5.0K, fc1 16.1K, fc2 510: 21.8K), which
    # tests/harness/test_models.py holds Keras's to as well: equal across ecosystems.
    model = build_torch_model("small_cnn", 28, 10, channels=1)
    layers = [m for m in model if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    counts = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    assert counts == [260, 5_020, 16_050, 510]
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


@pytest.mark.parametrize("name", ["resnet50", "mobilenet_v2"])
def test_resnet50_and_mobilenet_v2_train_at_mnists_28_px_as_seed_004_does(name):
    # Keras refuses below 32 px; the torch twins take 28 (five stride-2 stages
    # leave 1 x 1), with the parameters they have at 32, held to Keras's above.
    small = build_torch_model(name, 28, 10, channels=1)
    assert small(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    count = sum(p.numel() for p in small.parameters() if p.requires_grad)
    assert count == sum(p.numel() for p in build_torch_model(name, 32, 10, channels=1).parameters())
    validate(RunSettings(framework="torch-ddp", model=name, image_size=28, dataset="synthetic"))
    with pytest.raises(SettingsError, match=f"{name}'s minimum of 32 \\(Keras's\\)"):
        validate(RunSettings(framework="horovod", model=name, image_size=28, dataset="synthetic"))
    with pytest.raises(SettingsError, match=f"{name}'s minimum of 28"):
        validate(RunSettings(framework="torch-ddp", model=name, image_size=27, dataset="synthetic"))
