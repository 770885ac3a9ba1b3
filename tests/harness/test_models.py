"""The Keras models by name: seed 003's small CNN layer by layer, VGG-16's head,
the applications at their smallest input, and the names offered for an unknown
one."""

import math

import numpy as np
import pytest

from trainscale.catalogue.settings import SettingsError
from trainscale.frameworks.tensorflow.keras_models import build_model


def _parameters(model) -> int:
    return int(sum(np.prod(v.shape) for v in model.trainable_variables))


# Seed 003's table of its network on MNIST (28x28, one channel, 10 classes),
# as printed (to Lightning's rounding) and exactly.
SEED_003_LAYERS = {"conv1": (260, 260), "conv2": (5.0e3, 5_020), "fc1": (16.1e3, 16_050),
                   "fc2": (510, 510)}  # fmt: skip


def test_small_cnn_is_seed_003s_21_8k_parameter_network_layer_by_layer():
    model = build_model("small_cnn", 28, 10, channels=1)
    for name, (printed, exact) in SEED_003_LAYERS.items():
        counted = model.get_layer(name).count_params()
        # Lightning prints thousands to one decimal, rounding half up (16,050: 16.1 K).
        shown = math.floor(counted / 100 + 0.5) * 100 if printed >= 1000 else counted
        assert counted == exact and shown == printed
    assert _parameters(model) == 21_840  # "21.8K trainable parameters"


def test_vgg16_has_100_logits_and_the_standard_top():
    model = build_model("vgg16", 32, 100)
    assert model.output_shape == (None, 100)
    assert model.layers[-1].activation.__name__ == "linear"  # logits, not softmax
    # 14.7M convolution weights + the two 4096-wide dense layers of the top.
    assert _parameters(model) == 14_714_688 + (512 * 4096 + 4096) + (4096 * 4096 + 4096) + (
        4096 * 100 + 100
    )


@pytest.mark.parametrize(
    ("name", "size"), [("resnet50", 32), ("mobilenet_v2", 32), ("inception_v3", 75)]
)
def test_applications_build_at_their_minimum_size(name, size):
    assert build_model(name, size, 100).output_shape == (None, 100)


def test_unknown_model_lists_the_known_ones():
    with pytest.raises(SettingsError, match="choose one of vgg16, vgg19, resnet50"):
        build_model("alexnet", 224, 100)
