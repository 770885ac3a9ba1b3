"""The Keras `fit` frameworks: the other way TensorFlow users train (seed 000's
contrast, seed 003's `tensorflow2_keras_*` rows). The model is compiled and
trained by model.fit as the frameworks' own examples write it:

- tf-single-fit: fit on one device;
- horovod-fit: Horovod's Keras API, as Horovod's tensorflow2_keras_mnist.py
  writes it: hvd.DistributedOptimizer (gradients averaged over ranks),
  BroadcastGlobalVariablesCallback(0) (rank 0's state after the first batch),
  MetricAverageCallback (the epoch's metrics averaged over ranks);
- tf-mirrored-fit, tf-multiworker-fit: fit under MirroredStrategy and
  MultiWorkerMirroredStrategy, given the same per-replica input as their
  custom loops.

The harness's loop (warm-up, timed blocks, accuracy mode's epochs, faults)
drives fit as it drives a custom loop's step (trainscale.harness.driven_loop:
fit in a thread of its own, a callback handing over each batch's loss).
Every Keras callback, fit's own per-batch work and its input pipeline are
inside the timed steps; the loop's learning rate, evaluation and gathers run
while fit waits between batches. The loss a step reports is fit's own: the
mean over fit's epoch so far, as its progress bar shows it (fit's epoch is
the loop's in accuracy mode, else the whole run).
"""

from __future__ import annotations

from trainscale.frameworks.tensorflow.strategies import Mirrored, MultiWorker, SingleDevice
from trainscale.frameworks.tensorflow.tf_backend import TensorFlowBackend
from trainscale.frameworks.tensorflow.tf_data import prepare_images
from trainscale.frameworks.tensorflow.tf_horovod import Horovod
from trainscale.harness.backend import horovod_wire_compression
from trainscale.harness.driven_loop import DrivenLoop, api_epochs


def fit_in_thread(model, callbacks: list, **fit_arguments) -> DrivenLoop:
    """model.fit(**fit_arguments) with `callbacks`, driven one batch at a time."""
    import tensorflow as tf

    class OneBatchAtATime(tf.keras.callbacks.Callback):
        # The loss as a tensor: no copy to the host here (reading it is
        # the loop's device sync, at a block's end).
        _supports_tf_logs = True

        def on_train_batch_end(self, batch, logs=None):
            if not loop.hand_over(logs["loss"]):
                self.model.stop_training = True

    # The list fit would make of them (with the parameters it would give).
    callback_list = tf.keras.callbacks.CallbackList(
        [*callbacks, OneBatchAtATime()],
        add_history=True,
        model=model,
        verbose=0,
        epochs=fit_arguments["epochs"],
        steps=fit_arguments["steps_per_epoch"],
    )
    # Keras times its callbacks' batch hooks and warns of slow ones; the
    # time this one spends waiting for the loop is not fit's.
    callback_list._check_timing = False
    loop = DrivenLoop(lambda: model.fit(callbacks=callback_list, verbose=0, **fit_arguments), "fit")
    return loop


class FitBackend(TensorFlowBackend):
    """A tf.distribute framework's `fit`; Horovod's adds its optimizer and callbacks."""

    fit_loop: DrivenLoop | None = None

    def dataset_fn(self, train):
        # fit takes model inputs: the images prepared in the input pipeline
        # (the custom loop prepares them inside its step).
        dataset_fn, s = super().dataset_fn(train), self.settings
        if s.is_text:
            return dataset_fn

        def prepared(shard_index, num_shards, batch_size):
            dataset = dataset_fn(shard_index, num_shards, batch_size)
            return dataset.map(
                lambda images, labels: (
                    prepare_images(images, s.image_size, self.model.compute_dtype, s.dataset),
                    labels,
                )
            )

        return prepared

    def build_step(self, dataset_fn) -> None:
        import tensorflow as tf

        with self.distribution.scope():
            self.optimizer = self.fit_optimizer(self.optimizer)
            self.model.compile(
                optimizer=self.optimizer,
                loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
        self.before_fit(dataset_fn)
        self.fit_loop = self.start_fit(self.distribution.make_dataset(dataset_fn))

    def before_fit(self, dataset_fn) -> None:
        """Between compile and fit: what fit's callbacks need (default: nothing)."""

    def start_fit(self, dataset, restored_at: int = 0) -> DrivenLoop:
        """fit over `dataset`, from the start or from the loop's timed step
        `restored_at` (an elastic restart's). fit's epochs: the loop's in
        accuracy mode, else one, as long as the loop goes on."""
        epochs, steps = api_epochs(self)
        return fit_in_thread(
            self.model,
            self.fit_callbacks(),
            x=dataset,
            epochs=epochs,
            initial_epoch=restored_at // steps,
            steps_per_epoch=steps,
        )

    def fit_optimizer(self, optimizer):
        return optimizer

    def fit_callbacks(self) -> list:
        return []

    def step_on(self, iterator):
        # fit's own compiled step (Model.make_train_function), which fit reuses.
        return self.model.make_train_function()(iterator)["loss"]

    def step(self):
        return self.fit_loop.step()

    def after_first_step(self) -> None:
        """Nothing: a fit framework's callbacks do what follows its first batch."""

    def close(self) -> None:
        if self.fit_loop:
            self.fit_loop.stop()


class SingleDeviceFitBackend(FitBackend):
    distribution_class = SingleDevice


class MirroredFitBackend(FitBackend):
    distribution_class = Mirrored


class MultiWorkerFitBackend(FitBackend):
    distribution_class = MultiWorker
    # As MultiWorkerBackend: TensorFlow's teardown of its collective threads.
    finalizes_at_exit = False

    def build_step(self, dataset_fn) -> None:
        super().build_step(dataset_fn)
        # Across workers, Keras 2's default ("auto": "sum") adds up every
        # replica's copy of the loss it has already averaged (N times the
        # mean); "first" reports it once. Only what fit reports changes.
        self.model.distribute_reduction_method = "first"


class HorovodFitBackend(FitBackend):
    """Horovod's Keras API. Each rank's loss is its own batch's mean: the
    loop sums the ranks' shares (read_loss)."""

    distribution_class = Horovod

    def fit_optimizer(self, optimizer):
        import horovod.tensorflow.keras as hvd

        compression = horovod_wire_compression(hvd, self.settings)
        return hvd.DistributedOptimizer(optimizer, compression=compression)

    def fit_callbacks(self) -> list:
        import horovod.tensorflow.keras as hvd

        return [
            hvd.callbacks.BroadcastGlobalVariablesCallback(0),
            hvd.callbacks.MetricAverageCallback(),
        ]

    def read_loss(self, loss) -> float:
        return float(loss) / self.distribution.hvd.size()
