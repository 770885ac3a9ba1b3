import numpy as np
import pytest

from trainscale.models import build_model
from trainscale.settings import SettingsError


def _parameters(model) -> int:
    return int(sum(np.prod(v.shape) for v in model.trainable_variables))


def test_small_cnn_is_seed_003s_21_8k_parameter_network():
    # 28x28 grayscale, 10 classes: the MNIST setting the seed's table lists.
    assert _parameters(build_model("small_cnn", 28, 10, channels=1)) == 21_840


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
