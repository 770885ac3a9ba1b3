"""FLOPs per image from the Keras graph, checked against published counts, and MFU."""

import pytest

from trainscale.frameworks.tensorflow.keras_models import (
    forward_flops_per_image,
    training_flops_per_image,
)
from trainscale.harness.flops import gpu_model, peak_tflops, utilisation


@pytest.mark.parametrize(
    ("model", "published_gmacs", "tolerance"),
    [
        # VGG-16: 15.5 GMACs (torchvision's count). ResNet-50: Keras builds the
        # original v1, stride 2 in the first 1x1 convolution of a stage, 3.86
        # GMACs ("3.8 x 10^9" in He et al., Table 1); the often quoted 4.1 is
        # torchvision's v1.5, which strides in the 3x3 and so costs more.
        ("vgg16", 15.5, 0.02),
        ("resnet50", 3.86, 0.02),
    ],
)
def test_forward_flops_match_published_counts_at_224(model, published_gmacs, tolerance):
    flops = forward_flops_per_image(model, 224, 1000)
    assert flops / 2 / 1e9 == pytest.approx(published_gmacs, rel=tolerance)


def test_small_cnn_flops_match_a_count_by_hand():
    # 32x32x3 in, 100 classes: conv 10@5x5 -> 28x28, pool 14; conv 20@5x5 -> 10x10,
    # pool 5; dense 500 -> 50 -> 100. Multiply-adds of the weighted layers:
    macs = 28 * 28 * 10 * 5 * 5 * 3 + 10 * 10 * 20 * 5 * 5 * 10 + 500 * 50 + 50 * 100
    flops = forward_flops_per_image("small_cnn", 32, 100)
    # The graph also counts bias adds, activations and pooling: a few percent more.
    assert 2 * macs <= flops <= 2 * macs * 1.05
    assert training_flops_per_image("small_cnn", 32, 100) == 3 * flops


def test_the_peak_table_knows_the_gpus_by_their_driver_names():
    assert gpu_model("NVIDIA H100 80GB HBM3") == "H100"
    assert gpu_model("NVIDIA H200") == "H200"
    assert gpu_model("Tesla V100-SXM2-32GB") == "V100"
    assert gpu_model("NVIDIA A100-SXM4-80GB") == "A100"
    assert gpu_model("Intel(R) Xeon(R) Platinum 8488C") is None
    assert peak_tflops("Tesla V100-SXM2-32GB", "bf16") is None  # Volta has no bf16


def test_float32_is_compared_with_the_peak_of_the_units_it_ran_on():
    # Vector units for float32, tensor cores for TF32 (Ampere and later);
    # TF32 allowed on a Volta runs on its vector units.
    assert peak_tflops("NVIDIA H100 80GB HBM3", "fp32") == 66.9
    assert peak_tflops("NVIDIA H100 80GB HBM3", "tf32") == 494.7
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "tf32") == 156.0
    assert peak_tflops("Tesla V100-SXM2-32GB", "tf32") == peak_tflops(
        "Tesla V100-SXM2-32GB", "fp32"
    )
    row = utilisation(1000.0, 4 * 10**11, 1, "NVIDIA H100 80GB HBM3", "tf32")
    assert row["peak_precision"] == "tf32" and row["mfu"] == pytest.approx(400 / 494.7)


def test_utilisation_divides_achieved_by_the_peak_of_every_device():
    # 1,000 images/s x 3 x 31 GFLOPs = 93 TFLOP/s over 4 V100s at fp16 (4 x 125).
    result = utilisation(1000.0, 93_000_000_000, 4, "Tesla V100-SXM2-16GB", "fp16")
    assert result["achieved_tflops"] == pytest.approx(93.0)
    assert result["mfu"] == pytest.approx(93.0 / 500.0)
    unknown = utilisation(1000.0, 93_000_000_000, 1, "some CPU", "fp32")
    assert unknown["mfu"] is None and unknown["achieved_tflops"] == pytest.approx(93.0)
    assert utilisation(None, 1, 1, "NVIDIA H100", "fp32")["achieved_tflops"] is None
