"""The Keras models by name (catalogue.models lists them), all untrained
(weights=None) and returning logits; and their FLOPs, counted from the graph.

Logits rather than softmax outputs: the loss is computed from logits in
float32, which is numerically safer and is what mixed precision needs.
"""

from __future__ import annotations

import functools

from trainscale.catalogue.models import MODEL_MIN_IMAGE_SIZE, MODELS
from trainscale.catalogue.settings import SettingsError
from trainscale.core.gpt import TEXT_MODELS
from trainscale.harness.flops import TRAINING_OVER_FORWARD


def _applications_model(constructor_name: str, **extra):
    def build(image_size: int, num_classes: int, channels: int):
        import tensorflow as tf

        constructor = getattr(tf.keras.applications, constructor_name)
        return constructor(
            weights=None,
            input_shape=(image_size, image_size, channels),
            classes=num_classes,
            classifier_activation=None,
            **extra,
        )

    return build


def _small_cnn(image_size: int, num_classes: int, channels: int):
    """The CNN of seed 003 (PyTorch's MNIST example): 21,840 parameters at 28x28x1, 10 classes.

    conv 10@5x5 -> maxpool 2 -> relu -> conv 20@5x5 -> dropout -> maxpool 2 ->
    relu -> dense 50 -> relu -> dropout -> dense classes. Larger inputs, more
    channels or classes grow the first dense layer and the classifier.
    """
    import tensorflow as tf

    layers = tf.keras.layers
    return tf.keras.Sequential(
        [
            layers.Input((image_size, image_size, channels)),
            layers.Conv2D(10, 5, name="conv1"),
            layers.MaxPooling2D(2),
            layers.ReLU(),
            layers.Conv2D(20, 5, name="conv2"),
            layers.SpatialDropout2D(0.5, name="conv2_drop"),
            layers.MaxPooling2D(2),
            layers.ReLU(),
            layers.Flatten(),
            layers.Dense(50, activation="relu", name="fc1"),
            layers.Dropout(0.5),
            layers.Dense(num_classes, name="fc2"),
        ],
        name="small_cnn",
    )


def _lenet5(image_size: int, num_classes: int, channels: int):
    """LeNet-5 (LeCun et al., 1998) as it is trained today: ReLU and max pooling.

    conv 6@5x5 -> relu -> maxpool 2 -> conv 16@5x5 -> relu -> maxpool 2 ->
    dense 120 -> relu -> dense 84 -> relu -> dense classes: 69,656 parameters
    at 32x32x3 with 100 classes. Neither dropout nor batch normalisation:
    replicas that split a batch compute what one device computes on all of
    it, to float32 rounding (the tests' equivalence runs train it).
    """
    import tensorflow as tf

    layers = tf.keras.layers
    return tf.keras.Sequential(
        [
            layers.Input((image_size, image_size, channels)),
            layers.Conv2D(6, 5, activation="relu", name="conv1"),
            layers.MaxPooling2D(2),
            layers.Conv2D(16, 5, activation="relu", name="conv2"),
            layers.MaxPooling2D(2),
            layers.Flatten(),
            layers.Dense(120, activation="relu", name="fc1"),
            layers.Dense(84, activation="relu", name="fc2"),
            layers.Dense(num_classes, name="fc3"),
        ],
        name="lenet5",
    )


def _mlp(image_size: int, num_classes: int, channels: int):
    """A multilayer perceptron: flatten -> dense 64 -> relu -> dense 64 ->
    relu -> dense classes. Seed 004's model for the SDSS table (a row is a
    1x1 input of 8 channels: 4,931 parameters for 3 classes); on images it
    flattens the pixels."""
    import tensorflow as tf

    layers = tf.keras.layers
    return tf.keras.Sequential(
        [
            layers.Input((image_size, image_size, channels)),
            layers.Flatten(),
            layers.Dense(64, activation="relu", name="fc1"),
            layers.Dense(64, activation="relu", name="fc2"),
            layers.Dense(num_classes, name="fc3"),
        ],
        name="mlp",
    )


_BUILDERS = {
    # The paper's model: the standard Keras VGG-16 with 100 classes. Keras
    # ignores `pooling` when the classifier top is included; it is passed as
    # the paper's code did, and the top (two 4096-wide dense layers) is what
    # makes VGG-16 communication-heavy and so interesting to scale.
    "vgg16": _applications_model("VGG16", pooling="max"),
    "vgg19": _applications_model("VGG19", pooling="max"),
    "resnet50": _applications_model("ResNet50"),
    "inception_v3": _applications_model("InceptionV3"),
    "mobilenet_v2": _applications_model("MobileNetV2"),
    "small_cnn": _small_cnn,
    "lenet5": _lenet5,
    "mlp": _mlp,
}
assert set(_BUILDERS) | set(TEXT_MODELS) == set(MODELS), "settings.MODELS disagrees"


def build_model(name: str, image_size: int, num_classes: int, channels: int = 3, seq_len: int = 0):
    """Build model `name`: an image model for square inputs of side
    `image_size`, a text model for `seq_len` tokens (num_classes: its
    vocabulary; trainscale.frameworks.tensorflow.keras_gpt)."""
    if name in TEXT_MODELS:
        from trainscale.frameworks.tensorflow.keras_gpt import build_gpt

        return build_gpt(name, seq_len, num_classes)
    if name not in _BUILDERS:
        raise SettingsError(f"--model {name!r} is unknown; choose one of {', '.join(MODELS)}")
    if image_size < MODEL_MIN_IMAGE_SIZE[name]:
        raise SettingsError(
            f"--image-size {image_size} is below {name}'s minimum of {MODEL_MIN_IMAGE_SIZE[name]}"
        )
    return _BUILDERS[name](image_size, num_classes, channels)


@functools.lru_cache(maxsize=None)  # functools.cache is 3.9+
def forward_flops_per_image(
    model_name: str, image_size: int, num_classes: int, channels: int = 3
) -> int:
    """FLOPs of one forward pass of one image, counted from the Keras model's graph."""
    model = build_model(model_name, image_size, num_classes, channels)
    return model_forward_flops(model, image_size, channels)


def model_forward_flops(model, image_size: int, channels: int = 3) -> int:
    """forward_flops_per_image of a model already built (a caller that
    also counts its variables builds it once)."""
    import tensorflow as tf

    spec = tf.TensorSpec([1, image_size, image_size, channels], tf.float32)
    # The traced forward pass: every op with static shapes, the weights as
    # variable reads (their shapes are all the count needs).
    graph = tf.function(lambda x: model(x, training=False)).get_concrete_function(spec).graph
    options = (
        tf.compat.v1.profiler.ProfileOptionBuilder(
            tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
        )
        .with_empty_output()
        .build()
    )
    profile = tf.compat.v1.profiler.profile(graph=graph, cmd="op", options=options)
    return int(profile.total_float_ops)


def training_flops_per_image(
    model_name: str, image_size: int, num_classes: int, channels: int = 3
) -> int:
    forward = forward_flops_per_image(model_name, image_size, num_classes, channels)
    return TRAINING_OVER_FORWARD * forward  # trainscale.harness.flops
