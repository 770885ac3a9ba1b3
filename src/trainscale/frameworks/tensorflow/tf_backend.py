"""The TensorFlow frameworks behind the loop's seam (trainscale.harness.backend).

One training step for all six (build_train_step); how each distributes it
is trainscale.frameworks.tensorflow.strategies, .tf_horovod and .parameter_server.
"""

from __future__ import annotations

import os

import numpy as np

from trainscale.catalogue.settings import RunSettings
from trainscale.core.accuracy import evaluation_batches, scored_classes
from trainscale.core.datasets import DATASETS
from trainscale.core.imagenet import ImageFiles, decode_only_rate, pipeline
from trainscale.frameworks.tensorflow.keras_models import build_model, training_flops_per_image
from trainscale.frameworks.tensorflow.parameter_server import ParameterServer
from trainscale.frameworks.tensorflow.strategies import (
    CentralStorage,
    Distribution,
    Mirrored,
    MultiWorker,
    SingleDevice,
    create_distribution,
)
from trainscale.frameworks.tensorflow.tf_data import (
    image_dataset,
    prepare_images,
    synthetic_dataset,
)
from trainscale.frameworks.tensorflow.tf_horovod import Horovod, optimizer_variables
from trainscale.frameworks.tensorflow.tf_imagenet import imagenet_dataset, named_data_error
from trainscale.harness.backend import Backend, horovod_versions
from trainscale.harness.flops import text_training_flops_per_example

_POLICIES = {"fp32": "float32", "fp16": "mixed_float16", "bf16": "mixed_bfloat16"}


def make_optimizer(settings: RunSettings):
    import tensorflow as tf

    if settings.optimizer == "adam":
        optimizer = tf.keras.optimizers.Adam(settings.learning_rate)
    else:
        optimizer = tf.keras.optimizers.SGD(settings.learning_rate)
    if settings.precision == "fp16":
        # float16 gradients underflow without loss scaling; bfloat16 has
        # float32's exponent range and needs none.
        optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
    return optimizer


def make_dataset_fn(settings: RunSettings, train=None):
    """dataset_fn(shard_index, num_shards, per_replica_batch) for Distribution.make_iterator,
    over the training split (`train`: (images, labels), read here if not given)."""
    dataset = DATASETS[settings.dataset]
    if dataset.streams and not isinstance(train, tuple):  # not compile_untouched's zeros
        files = train or dataset.load(settings.data_dir)

        def dataset_fn(shard_index, num_shards, batch_size):
            return imagenet_dataset(files, pipeline(settings, shard_index, num_shards, batch_size))

    elif dataset.release is not None:
        images, labels = train or dataset.load(settings.data_dir)

        def dataset_fn(shard_index, num_shards, batch_size):
            return image_dataset(
                images,
                labels,
                shard_index=shard_index,
                num_shards=num_shards,
                batch_size=batch_size,
                seed=settings.seed,
                augment=settings.augmentation != "none",
            )

    else:

        def dataset_fn(shard_index, num_shards, batch_size):
            # Pipeline k of n feeds replicas k*r .. k*r + r-1 (r = replicas / n).
            per_pipeline = settings.replicas // num_shards
            first = shard_index * per_pipeline
            return synthetic_dataset(settings, range(first, first + per_pipeline), batch_size)

    return dataset_fn


def build_train_step(distribution, model, optimizer, settings: RunSettings):
    """The training step every framework runs: one definition, compiled once.

    Per replica: prepare the batch, forward, loss divided by the GLOBAL batch
    (a parameter server's worker: its own, Distribution.loss_batch_size),
    gradients through the framework's tape (Horovod sums them there), apply
    (tf.distribute's optimizer sums them there). Returns the global mean loss.
    """
    import tensorflow as tf

    loss_per_example = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=tf.keras.losses.Reduction.NONE
    )
    loss_scaling = settings.precision == "fp16"
    compute_dtype = model.compute_dtype
    loss_batch_size = distribution.loss_batch_size()

    def replica_step(images, labels):
        if not settings.is_text:  # a text model's tokens go in as they are
            images = prepare_images(images, settings.image_size, compute_dtype, settings.dataset)
        with tf.GradientTape() as tape:
            logits = tf.cast(model(images, training=True), tf.float32)
            losses = loss_per_example(labels, logits)
            if settings.is_text:  # an example's loss: the mean over its tokens
                losses = tf.reduce_mean(losses, axis=-1)
            loss = tf.nn.compute_average_loss(losses, global_batch_size=loss_batch_size)
            objective = optimizer.get_scaled_loss(loss) if loss_scaling else loss
        tape = distribution.wrap_tape(tape)
        gradients = tape.gradient(objective, model.trainable_variables)
        if loss_scaling:
            gradients = optimizer.get_unscaled_gradients(gradients)
        # One gradient per variable by construction (zip(strict=) is 3.10+).
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    return distribution.compile_step(replica_step)


def build_evaluation(backend, images: np.ndarray, labels: np.ndarray):
    """This process's test shard in equal batches, and the step that scores one
    (Backend.evaluate's row: summed loss, correct, examples, then each class's
    correct and examples), in inference mode (dropout off, batch
    norm's moving statistics). Called outside the strategy's replica context:
    one process evaluates its shard on its own, with no collective."""
    import tensorflow as tf

    settings, topology = backend.settings, backend.topology
    batch = settings.batch_size * topology.replicas_in_process
    shard = evaluation_batches(
        images, labels, topology.process_index, topology.num_processes, batch
    )
    batches = [tuple(tf.constant(part) for part in parts) for parts in shard]
    model = backend.model
    classes = scored_classes(settings)
    loss_per_example = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=tf.keras.losses.Reduction.NONE
    )

    @tf.function(autograph=False)  # as the train step (Distribution.compile_step)
    def eval_step(images, labels, weights):
        inputs = images
        if not settings.is_text:
            inputs = prepare_images(
                images, settings.image_size, model.compute_dtype, settings.dataset
            )
        logits = tf.cast(model(inputs, training=False), tf.float32)
        predicted = tf.argmax(logits, axis=-1, output_type=tf.int32)
        correct = tf.cast(predicted == tf.cast(labels, tf.int32), tf.float32)
        losses = loss_per_example(labels, logits)
        if settings.is_text:  # an example's: the mean over its tokens
            correct, losses = tf.reduce_mean(correct, axis=-1), tf.reduce_mean(losses, axis=-1)
        whole = [losses * weights, correct * weights, weights]
        row = [tf.stack([tf.reduce_sum(summed) for summed in whole])]
        if classes:
            by_class = tf.cast(labels, tf.int32)
            row += [tf.math.unsorted_segment_sum(c, by_class, classes) for c in whole[1:]]
        return tf.concat(row, axis=0)

    return batches, eval_step


class TensorFlowBackend(Backend):
    """The TensorFlow frameworks' shared step; each framework is a subclass
    naming its tf.distribute or Horovod class (below), as its registry entry
    names that subclass."""

    distribution_class: type[Distribution]

    def prepare(self) -> None:
        settings = self.settings
        if settings.xla and settings.device == "cpu":
            # XLA auto-clustering only touches CPU ops with this flag; it must be
            # in the environment before TensorFlow reads its flags.
            os.environ["TF_XLA_FLAGS"] = (
                os.environ.get("TF_XLA_FLAGS", "") + " --tf_xla_cpu_global_jit"
            ).strip()
        import tensorflow as tf

        self.out_of_memory_errors = (tf.errors.ResourceExhaustedError, MemoryError)
        distribution = self.distribution = create_distribution(
            self.distribution_class, settings, self.options, self.topology
        )
        if settings.xla:
            # Auto-clustering compiles what XLA can and leaves the rest, which
            # keeps Horovod's collectives (not XLA ops) working.
            tf.config.optimizer.set_jit("autoclustering")
        tf.keras.mixed_precision.set_global_policy(_POLICIES[settings.precision])
        tf.keras.utils.set_random_seed(settings.seed)
        with distribution.scope():
            self.model = build_model(
                settings.model,
                settings.image_size,
                settings.num_classes,
                settings.input_channels,
                seq_len=settings.seq_len,
            )
            self.optimizer = make_optimizer(settings)
        train, test = self.read_splits()
        if isinstance(train, ImageFiles):  # decoded: uint8 at the model's side
            side, batch = settings.image_size, settings.global_batch_size
            self.train_like = np.zeros((batch, side, side, 3), np.uint8), np.zeros(batch, np.int32)
        elif train:  # one global batch of its shapes (compile_untouched)
            self.train_like = tuple(part[: settings.global_batch_size] for part in train)
        self.build_step(self.dataset_fn(train))
        if test:
            self.test_batches, self.eval_step = build_evaluation(self, *test)

    def dataset_fn(self, train):
        """make_dataset_fn's, over `train` (the split, or zeros of its shapes);
        the shard it was last asked for is this process's (decode_only_rate)."""
        made = make_dataset_fn(self.settings, train)

        def dataset_fn(*shard):
            self.pipeline_shard = shard
            return made(*shard)

        return dataset_fn

    def decode_only_rate(self) -> float | None:
        s = self.settings
        if not hasattr(self, "train_files") or not hasattr(self, "pipeline_shard"):
            return None
        dataset = make_dataset_fn(s, self.train_files)(*self.pipeline_shard)
        return decode_only_rate(iter(dataset), max(2, s.steps_per_block))

    def build_step(self, dataset_fn) -> None:
        """The custom loop's step and the iterator it draws from (a Keras
        `fit` framework's is fit's, trainscale.frameworks.tensorflow.keras_fit)."""
        self.iterator = self.distribution.make_iterator(dataset_fn)
        self.train_step = build_train_step(
            self.distribution, self.model, self.optimizer, self.settings
        )

    def step_on(self, iterator):
        """One step of the compiled step on `iterator`'s batch; its loss."""
        return self.train_step(iterator)

    def compile_untouched(self) -> None:
        # A traced step's first call also optimises and instantiates its graph
        # (and Horovod sets up its collectives and broadcasts): a second or
        # more that is not training. It runs here, on zero images of the
        # data's shapes, then the model and optimizer are put back as they
        # were: no data is touched and nothing is learned before the clock.
        import tensorflow as tf

        with self.distribution.scope():
            self.optimizer.build(self.model.trainable_variables)
        state = list(self.model.variables) + optimizer_variables(self.optimizer)
        saved = [variable.numpy() for variable in state]
        images, labels = self.train_like
        zeros = (np.zeros_like(images), np.zeros_like(labels))
        step_zeros = self.dataset_fn(zeros)
        self.read_loss(self.step_on(self.distribution.make_iterator(step_zeros)))
        for variable, value in zip(state, saved):
            variable.assign(value)
        self.after_first_step()  # Horovod: every rank from rank 0's state
        self.eval_step(*(tf.zeros_like(part) for part in self.test_batches[0])).numpy()

    def read_loss(self, loss) -> float:
        return self.distribution.read_loss(loss)

    def framework_config(self) -> dict:
        return self.distribution.config()

    def set_learning_rate(self, rate: float) -> None:
        self.optimizer.learning_rate.assign(rate)

    def evaluate(self) -> np.ndarray:
        rows = [self.eval_step(*batch).numpy() for batch in self.test_batches]
        return np.sum(rows, axis=0, dtype=np.float64)

    @property
    def loss_is_global(self) -> bool:
        return self.distribution.loss_is_global

    def step(self):
        return self.train_step(self.iterator)

    def named_data_error(self, err: BaseException):
        if not hasattr(self, "train_files"):
            return None
        return named_data_error(err, self.train_files)

    def after_first_step(self) -> None:
        self.distribution.after_first_step(self.model, self.optimizer)

    def gather_rows(self, row: np.ndarray) -> np.ndarray:
        return self.distribution.gather_rows(row)

    def trainable_weights(self) -> list[np.ndarray]:
        return [v.numpy() for v in self.model.trainable_variables]

    def trainable_parameters(self) -> int:
        return int(sum(v.shape.num_elements() for v in self.model.trainable_variables))

    def peak_memory(self) -> dict:
        if self.settings.device != "gpu":
            return super().peak_memory()
        import tensorflow as tf

        peaks = [
            tf.config.experimental.get_memory_info(d.name)["peak"]
            for d in tf.config.list_logical_devices("GPU")
        ]
        return {"bytes": int(max(peaks)) if peaks else None, "source": "tf gpu allocator peak"}

    def peak_precision(self) -> str:
        import tensorflow as tf

        # TensorFlow runs float32 matmuls and convolutions as TF32 by default.
        tf32 = tf.config.experimental.tensor_float_32_execution_enabled()
        fp32_on_gpu = self.settings.precision == "fp32" and self.settings.device == "gpu"
        return "tf32" if fp32_on_gpu and tf32 else self.settings.precision

    def gpu_name(self) -> str:
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        details = tf.config.experimental.get_device_details(gpus[0]) if gpus else {}
        return details.get("device_name", "unknown GPU")

    def training_flops_per_image(self) -> int:
        s = self.settings
        if s.is_text:
            return text_training_flops_per_example(s)
        return training_flops_per_image(s.model, s.image_size, s.num_classes, s.input_channels)

    def software_versions(self) -> dict:
        import keras
        import tensorflow as tf

        build = tf.sysconfig.get_build_info()
        return {
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
            "numpy": np.__version__,
            "cuda": build.get("cuda_version"),
            "cudnn": build.get("cudnn_version"),
            **horovod_versions("horovod.tensorflow"),
        }


# One Backend per TensorFlow framework, each named by its registry entry.
class SingleDeviceBackend(TensorFlowBackend):
    distribution_class = SingleDevice


class HorovodBackend(TensorFlowBackend):
    distribution_class = Horovod


class MirroredBackend(TensorFlowBackend):
    distribution_class = Mirrored


class MultiWorkerBackend(TensorFlowBackend):
    distribution_class = MultiWorker
    # A worker whose run is done can abort in TensorFlow's teardown of its
    # collective threads ("terminate called without an active exception",
    # SIGABRT, after the record was written; tensorflow/tensorflow#55250):
    # once in CI on TF 2.11 (tests/compat). Its run is over, so it ends with os._exit.
    finalizes_at_exit = False


class CentralStorageBackend(TensorFlowBackend):
    distribution_class = CentralStorage


class ParameterServerBackend(TensorFlowBackend):
    distribution_class = ParameterServer
