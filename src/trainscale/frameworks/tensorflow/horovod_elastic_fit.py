"""horovod-elastic-fit: Horovod's elastic Keras API (launch kind
horovod-elastic), as Horovod's tensorflow2_keras_mnist_elastic.py writes it:
the model and its optimizer in a hvd.elastic.KerasState, fit's batches and
epochs counted into it by UpdateBatchStateCallback and
UpdateEpochStateCallback, and fit run inside hvd.elastic.run.

The state is committed on the loop's schedule, every --checkpoint-blocks
blocks, as every elastic framework's is (the example commits with
CommitStateCallback every --commit-every batches). A lost rank fails the
collective fit is in (HorovodInternalError, raised in fit's thread and again
in the loop's): hvd.elastic.run restores the last commit, Horovod re-forms
the world without the failed host, and a new fit goes on from the committed
step over the new world's shards.
"""

from __future__ import annotations

from trainscale.frameworks.tensorflow.horovod_elastic import ElasticHorovod
from trainscale.frameworks.tensorflow.keras_fit import HorovodFitBackend
from trainscale.harness.backend import batches_trained


class HorovodElasticFitBackend(HorovodFitBackend):
    distribution_class = ElasticHorovod
    elastic = True
    state = None

    def before_fit(self, dataset_fn) -> None:
        self.elastic_dataset_fn = dataset_fn  # a reset shards it again over the new world
        self.state = self._state()

    def _state(self):
        """The state a reset restores and a joining rank receives, made
        before fit so that fit's callbacks count into it. Its optimizer is
        built first: a restore writes back only the variables saved."""
        import horovod.tensorflow.keras as hvd

        backend = self

        class State(hvd.elastic.KerasState):
            def restore(self):
                # hvd.elastic.run caught a collective's HorovodInternalError.
                backend.notice("detected", how="HorovodInternalError")
                super().restore()

        self.optimizer.build(self.model.trainable_variables)
        state = State(self.model, self.optimizer, batch=0, epoch=0, steps=0)
        state.register_reset_callbacks([self._after_reset])
        return state

    def fit_callbacks(self) -> list:
        import horovod.tensorflow.keras as hvd

        return [
            hvd.callbacks.MetricAverageCallback(),
            hvd.elastic.UpdateEpochStateCallback(self.state),
            hvd.elastic.UpdateBatchStateCallback(self.state),
        ]

    def _after_reset(self) -> None:
        """The world Horovod re-formed: this rank's place, and a new fit over
        its shard from the committed step."""
        hvd, s = self.distribution.hvd, self.settings
        self.topology.num_processes, self.topology.process_index = hvd.size(), hvd.rank()
        dataset = self.distribution.make_dataset(self.elastic_dataset_fn)
        dataset = dataset.skip(batches_trained(s, self.state.steps))
        self.fit_loop = self.start_fit(dataset, self.state.steps)
        self.notice("restored", step=self.state.steps)

    def save_state(self, path: str, steps: int) -> None:
        self.state.steps = steps
        self.state.commit()  # in memory; also where Horovod says hosts changed

    def run_blocks(self, blocks_from, first_step: int):
        # The state as the timed part starts (the warm-up trained it).
        self.state.steps = first_step
        self.state.save()

        @self.distribution.hvd.elastic.run  # horovod.tensorflow.keras's is this one
        def resumable(state):
            return blocks_from(state.steps)

        return resumable(self.state)

    def framework_config(self) -> dict:
        return {"commits": "in memory (hvd.elastic.KerasState)"}
