"""The models a study may name, and what each reads: images of at least some
side, or tokens; and what is known of each without building it. Pure: the
settings, the schema and the CLI take the `model` axis's choices from here;
the networks themselves are built by each ecosystem's module
(trainscale.frameworks.tensorflow.keras_models,
trainscale.frameworks.torch.torch_models), the same network in both.
"""

from __future__ import annotations

from trainscale.core.datasets import DATASETS
from trainscale.core.gpt import TEXT_MODELS

# Smallest input side each image model accepts (Keras' own limits for the
# applications; small_cnn and lenet5 need two 5x5 convolutions and two 2x2
# poolings; the mlp flattens any input, a tabular row's 1x1 too).
MODEL_MIN_IMAGE_SIZE = {
    "vgg16": 32,
    "vgg19": 32,
    "resnet50": 32,
    "mobilenet_v2": 32,
    "inception_v3": 75,
    "small_cnn": 16,
    "lenet5": 16,
    "mlp": 1,
}
IMAGE_MODELS = tuple(MODEL_MIN_IMAGE_SIZE)
# The text models (trainscale.core.gpt: a GPT-style decoder's size ladder).
MODELS = (*IMAGE_MODELS, *TEXT_MODELS)
# torch's twins have no such limit of Keras's: seed 004 trains ResNet-50 and
# MobileNetV2 on MNIST's native 28 px (five stride-2 stages leave 1 x 1).
TORCH_MIN_IMAGE_SIZE = {**MODEL_MIN_IMAGE_SIZE, "resnet50": 28, "mobilenet_v2": 28}
# The models defined for torch too, as the same networks; the torch
# frameworks refuse the others.
TORCH_MODELS = (
    "vgg16", "vgg19", "resnet50", "mobilenet_v2", "small_cnn", "lenet5", "mlp", *TEXT_MODELS,
)  # fmt: skip
# Trainable parameters (Keras's count, the models, 100 classes), for
# records written before the harness recorded `trainable_parameters`
# (trainscale.analysis.predict sizes the gradient all-reduce from it), and
# for the tests to hold a record's count to.
KNOWN_TRAINABLE_PARAMETERS = {
    ("vgg16", 224): 134_670_244,
    ("vgg16", 32): 34_006_948,
    ("vgg19", 224): 139_979_940,
    ("vgg19", 32): 39_316_644,
    ("resnet50", 224): 23_739_492,
    ("resnet50", 32): 23_739_492,
    ("small_cnn", 224): 2_819_930,
    ("small_cnn", 32): 35_930,
    ("lenet5", 224): 5_414_936,
    ("lenet5", 32): 69_656,
    ("mlp", 32): 207_332,
}

# The data sets a text model reads: text, or synthetic tokens.
TEXT_DATASETS = (*(name for name, d in DATASETS.items() if d.is_text), "synthetic")


def check_streamed_input(s, ecosystem: str) -> str:
    """Why a data set decoded while training (core.imagenet) cannot feed `s` ("" if it can)."""
    if not DATASETS[s.dataset].streams:
        return ""
    if s.mode == "accuracy":
        return (
            f"--dataset {s.dataset} is measured in throughput mode: accuracy mode "
            "reads its test split whole into memory, which ImageNet's is not"
        )
    if ecosystem == "torch" and s.dataset == "imagenet-tfrecord":
        return f"--dataset {s.dataset}: TFRecord shards are TensorFlow's; torch reads imagenet-jpeg"
    return ""


def check_model_input(s, ecosystem: str, splits_model: bool = False) -> str:
    """Why settings `s` cannot run their model in `ecosystem` ("" if they can):
    a text model reads a text data set; an image model images at least its
    smallest side; a torch framework only the models torch defines; a
    framework that splits a model (`splits_model`) a GPT's blocks only."""
    if splits_model and s.model not in TEXT_MODELS:
        return (
            f"--model {s.model}: {s.framework} splits a GPT's blocks and layers over its "
            f"ranks; run it with {', '.join(TEXT_MODELS)}"
        )
    if ecosystem == "torch" and s.model not in TORCH_MODELS:
        return (
            f"--model {s.model} is not defined for torch, so it would not be the same network "
            f"as TensorFlow's; {s.framework} runs {', '.join(TORCH_MODELS)}"
        )
    if s.model in TEXT_MODELS:
        if s.dataset not in TEXT_DATASETS:
            return (
                f"--model {s.model} reads tokens: --dataset {s.dataset} holds images; "
                f"use {', '.join(TEXT_DATASETS)}"
            )
        vocabulary = DATASETS[s.dataset].num_classes
        if DATASETS[s.dataset].is_text and s.vocab_size < vocabulary:
            return f"--vocab-size {s.vocab_size} is below {s.dataset}'s {vocabulary} byte tokens"
        return ""
    if DATASETS[s.dataset].is_text:
        return (
            f"--model {s.model} reads images: --dataset {s.dataset} holds text (a gpt-* reads it)"
        )
    refused = check_streamed_input(s, ecosystem)
    if refused:
        return refused
    minimum = (TORCH_MIN_IMAGE_SIZE if ecosystem == "torch" else MODEL_MIN_IMAGE_SIZE)[s.model]
    if DATASETS[s.dataset].is_table:  # each row's features as a 1x1 input
        if minimum > 1:
            tabular = [name for name, side in MODEL_MIN_IMAGE_SIZE.items() if side == 1]
            return f"--dataset {s.dataset} is a table of features: run {', '.join(tabular)}"
        if s.image_size != 1:
            return f"--image-size {s.image_size}: a row of {s.dataset} is 1x1; give 1 or 0"
    if s.image_size < minimum:
        return f"--image-size {s.image_size} is below {s.model}'s minimum of {minimum}" + (
            " (Keras's)" if minimum > TORCH_MIN_IMAGE_SIZE[s.model] else ""
        )
    return ""
