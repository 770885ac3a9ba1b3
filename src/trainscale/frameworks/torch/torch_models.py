"""trainscale's models in torch, built layer by layer as Keras builds them.

A model name must mean the same network in both ecosystems, so a torch run
and a TensorFlow run of "vgg16" compare frameworks, not networks. Each model
here has the Keras model's layers, parameter count and FLOPs per image at
every image size (tests/torch/test_models.py holds them to the Keras counts):

- vgg16/vgg19: Keras flattens the last feature map straight into the first
  4096-wide dense layer: 512 inputs at 32x32, 25,088 at 224x224.
  torchvision's VGG pools adaptively to 7x7 first, which at 32x32 copies a
  1x1 map 49 times and makes that layer 49x larger; there is no such pooling
  here.
- resnet50: Keras's is ResNet v1 (the stride-2 of a stage's first block on
  its first 1x1 convolution, biases on every convolution); torchvision's is
  v1.5 (stride on the 3x3, no biases). This is v1, with Keras's batch-norm
  epsilon (1.001e-5) and momentum (0.99, which torch calls 0.01).
- mobilenet_v2: Keras's (alpha 1.0): its batch norm (epsilon 1e-3, momentum
  0.999), no convolution biases, and TensorFlow's "same" padding of a
  stride-2 convolution, which pads one more row and column after than before
  on an even input (torch pads evenly, so _PadSame does it).
- small_cnn: seed 003's network (trainscale.frameworks.tensorflow.keras_models._small_cnn).
- lenet5: LeNet-5 with ReLU and max pooling (keras_models._lenet5).
- mlp: two hidden layers of 64 (keras_models._mlp), the SDSS table's model.

Weights start as Keras starts them (Glorot-uniform kernels, zero biases), so
the training dynamics match too. Flatten orders differ (Keras flattens height,
width, channel; torch channel first): the same function class, permuted.

inception_v3 is not defined here: the settings refuse it for the torch
frameworks (settings.TORCH_MODELS). The text models are
trainscale.frameworks.torch.torch_gpt's.
"""

from __future__ import annotations

import torch
from torch import nn

from trainscale.catalogue.models import TORCH_MODELS
from trainscale.core.gpt import TEXT_MODELS
from trainscale.frameworks.torch.torch_gpt import Gpt

VGG_BLOCKS = {
    "vgg16": ((64, 2), (128, 2), (256, 3), (512, 3), (512, 3)),
    "vgg19": ((64, 2), (128, 2), (256, 4), (512, 4), (512, 4)),
}
RESNET50_STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))  # filters, blocks, stride
KERAS_BATCH_NORM = {"eps": 1.001e-5, "momentum": 0.01}
# Keras's MobileNetV2: (expansion, filters, blocks, first stride) per stage.
MOBILENET_V2_STAGES = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))  # fmt: skip
MOBILENET_BATCH_NORM = {"eps": 1e-3, "momentum": 0.001}


def _vgg(blocks, image_size: int, num_classes: int, channels: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for width, convolutions in blocks:
        for _ in range(convolutions):
            layers += [nn.Conv2d(channels, width, 3, padding=1), nn.ReLU(inplace=True)]
            channels = width
        layers.append(nn.MaxPool2d(2))
    side = image_size // 2 ** len(blocks)  # Keras's "valid" pooling floors, as torch's does
    layers += [
        nn.Flatten(),
        nn.Linear(channels * side * side, 4096),
        nn.ReLU(inplace=True),
        nn.Linear(4096, 4096),
        nn.ReLU(inplace=True),
        nn.Linear(4096, num_classes),
    ]
    return nn.Sequential(*layers)


class _Bottleneck(nn.Module):
    """Keras's resnet.block1: 1x1 (strided) -> 3x3 -> 1x1, plus the shortcut."""

    def __init__(self, channels: int, filters: int, stride: int, conv_shortcut: bool):
        super().__init__()
        out = 4 * filters
        self.shortcut = (
            nn.Sequential(
                nn.Conv2d(channels, out, 1, stride=stride),
                nn.BatchNorm2d(out, **KERAS_BATCH_NORM),
            )
            if conv_shortcut
            else nn.Identity()
        )
        self.body = nn.Sequential(
            nn.Conv2d(channels, filters, 1, stride=stride),
            nn.BatchNorm2d(filters, **KERAS_BATCH_NORM),
            nn.ReLU(inplace=True),
            nn.Conv2d(filters, filters, 3, padding=1),
            nn.BatchNorm2d(filters, **KERAS_BATCH_NORM),
            nn.ReLU(inplace=True),
            nn.Conv2d(filters, out, 1),
            nn.BatchNorm2d(out, **KERAS_BATCH_NORM),
        )

    def forward(self, x):
        return torch.relu(self.shortcut(x) + self.body(x))


def _resnet50(image_size: int, num_classes: int, channels: int) -> nn.Sequential:
    layers: list[nn.Module] = [
        # Keras pads 3 then convolves "valid", and pads 1 (zeros) before the
        # max pooling; after the ReLU every value is >= 0, so torch's -inf
        # padding of the pooling picks the same maxima.
        nn.Conv2d(channels, 64, 7, stride=2, padding=3),
        nn.BatchNorm2d(64, **KERAS_BATCH_NORM),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, stride=2, padding=1),
    ]
    channels = 64
    for filters, blocks, stride in RESNET50_STAGES:
        for block in range(blocks):
            first = block == 0
            layers.append(_Bottleneck(channels, filters, stride if first else 1, first))
            channels = 4 * filters
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, num_classes)]
    return nn.Sequential(*layers)


class _PadSame(nn.Module):
    """TensorFlow's "same" padding for a stride-2 3x3 window: the extra row
    and column go after (Keras's correct_pad, and Conv2D's padding="same")."""

    def forward(self, x):
        pads = []
        for side in (x.shape[-1], x.shape[-2]):  # F.pad's order: width, then height
            total = max((-(-side // 2) - 1) * 2 + 3 - side, 0)
            pads += [total // 2, total - total // 2]
        return nn.functional.pad(x, pads)


def _conv_bn(channels: int, out: int, kernel: int, stride: int = 1, groups: int = 1,
             relu6: bool = True) -> list[nn.Module]:  # fmt: skip
    padding = 1 if kernel == 3 and stride == 1 else 0
    layers = [_PadSame()] if stride == 2 else []
    layers += [
        nn.Conv2d(channels, out, kernel, stride, padding, groups=groups, bias=False),
        nn.BatchNorm2d(out, **MOBILENET_BATCH_NORM),
    ]
    return layers + [nn.ReLU6(inplace=True)] if relu6 else layers


class _InvertedResidual(nn.Module):
    """Keras's _inverted_res_block: expand 1x1 (not in the first), depthwise
    3x3, project 1x1; added to its input where the shapes allow."""

    def __init__(self, channels: int, filters: int, stride: int, expansion: int):
        super().__init__()
        hidden = channels * expansion
        expand = _conv_bn(channels, hidden, 1) if expansion != 1 else []
        self.body = nn.Sequential(
            *expand,
            *_conv_bn(hidden, hidden, 3, stride, groups=hidden),
            *_conv_bn(hidden, filters, 1, relu6=False),
        )
        self.residual = channels == filters and stride == 1

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


def _mobilenet_v2(image_size: int, num_classes: int, channels: int) -> nn.Sequential:
    layers = _conv_bn(channels, 32, 3, stride=2)
    channels = 32
    for expansion, filters, blocks, stride in MOBILENET_V2_STAGES:
        for block in range(blocks):
            layers.append(_InvertedResidual(channels, filters, stride if block == 0 else 1,
                                            expansion))  # fmt: skip
            channels = filters
    layers += _conv_bn(channels, 1280, 1)
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(1280, num_classes)]
    return nn.Sequential(*layers)


def _small_cnn(image_size: int, num_classes: int, channels: int) -> nn.Sequential:
    side = ((image_size - 4) // 2 - 4) // 2
    return nn.Sequential(
        nn.Conv2d(channels, 10, 5),
        nn.MaxPool2d(2),
        nn.ReLU(),
        nn.Conv2d(10, 20, 5),
        nn.Dropout2d(0.5),  # Keras's SpatialDropout2D: whole channels
        nn.MaxPool2d(2),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(20 * side * side, 50),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.Linear(50, num_classes),
    )


def _lenet5(image_size: int, num_classes: int, channels: int) -> nn.Sequential:
    side = ((image_size - 4) // 2 - 4) // 2
    return nn.Sequential(
        nn.Conv2d(channels, 6, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * side * side, 120),
        nn.ReLU(),
        nn.Linear(120, 84),
        nn.ReLU(),
        nn.Linear(84, num_classes),
    )


def _mlp(image_size: int, num_classes: int, channels: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(channels * image_size * image_size, 64),
        nn.ReLU(),
        nn.Linear(64, 64),
        nn.ReLU(),
        nn.Linear(64, num_classes),
    )


# The image models; the text ones are trainscale.frameworks.torch.torch_gpt's.
_BUILDERS = {
    "vgg16": lambda *shape: _vgg(VGG_BLOCKS["vgg16"], *shape),
    "vgg19": lambda *shape: _vgg(VGG_BLOCKS["vgg19"], *shape),
    "resnet50": _resnet50,
    "mobilenet_v2": _mobilenet_v2,
    "small_cnn": _small_cnn,
    "lenet5": _lenet5,
    "mlp": _mlp,
}
assert set(_BUILDERS) | set(TEXT_MODELS) == set(TORCH_MODELS), "settings.TORCH_MODELS disagrees"


def batch_norms(module: nn.Module) -> list[nn.Module]:
    """The model's batch norms. Under bf16/fp16 a batch norm's weight must
    have its running statistics' dtype ("Expected running_mean to have type
    BFloat16 but got Float"), so frameworks that cast parameters themselves
    (FSDP2, DeepSpeed) treat these apart; autocast leaves them float32."""
    return [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def _keras_initialisation(module: nn.Module) -> None:
    if isinstance(module, (nn.Conv2d, nn.Linear)):
        nn.init.xavier_uniform_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


def build_torch_model(
    name: str, image_size: int, num_classes: int, channels: int = 3, seq_len: int = 0
):
    """Model `name` returning logits: an image model for square inputs of side
    `image_size`, a text model for `seq_len` tokens (num_classes: its vocabulary)."""
    if name in TEXT_MODELS:
        return Gpt(name, seq_len, num_classes)
    model = _BUILDERS[name](image_size, num_classes, channels)
    model.apply(_keras_initialisation)
    return model


def torch_forward_flops_per_image(
    model_name: str, image_size: int, num_classes: int, channels: int = 3
) -> int:
    """FLOPs of one forward pass of one image, as torch's FlopCounterMode counts them:
    convolutions and matrix products (2 per multiply-add), on shapes only (meta device)."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        model = build_torch_model(model_name, image_size, num_classes, channels).eval()
        images = torch.empty(1, channels, image_size, image_size)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(images)
    return int(counter.get_total_flops())
