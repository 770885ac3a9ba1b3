"""horovod-elastic: Horovod's TensorFlow step under Horovod's elastic driver
(launch kind horovod-elastic), as horovod-torch-elastic is PyTorch's: the
model's and the optimizer's variables and the timed steps done in a
hvd.elastic.TensorFlowState, committed every --checkpoint-blocks blocks, and
the timed blocks run inside hvd.elastic.run, as Horovod's TensorFlow 2
elastic example does.

A lost rank fails the collective the others are in (HorovodInternalError):
hvd.elastic.run restores the last commit in memory, Horovod re-forms the
world without the failed host, and the blocks go on from the committed step,
with the step traced again for the new world's global batch.
"""

from __future__ import annotations

from trainscale.catalogue.elastic_kinds import processes_on_machine
from trainscale.frameworks.tensorflow.tf_backend import (
    TensorFlowBackend,
    build_train_step,
    make_dataset_fn,
)
from trainscale.frameworks.tensorflow.tf_horovod import Horovod, _traceable, optimizer_variables
from trainscale.harness.backend import batches_trained


class ElasticHorovod(Horovod):
    name = "horovod-elastic"
    elastic = True

    def processes_on_machine(self, local_size: int) -> int:
        return processes_on_machine(local_size)

    def loss_batch_size(self) -> int:
        # The global batch of the world as it is (it may have shrunk).
        return self.settings.batch_size * self.hvd.size()


class HorovodElasticBackend(TensorFlowBackend):
    distribution_class = ElasticHorovod
    elastic = True

    def read_splits(self) -> tuple:
        train, test = super().read_splits()
        self.train_split = train  # a reset shards it again over the new world
        return train, test

    def _state(self, steps: int):
        """The committed state: made once the optimizer has its slots (after
        the warm-up, or compile_untouched in accuracy mode)."""
        hvd, backend = self.distribution.hvd, self
        variables = _traceable(self.model.variables) + optimizer_variables(self.optimizer)

        class State(hvd.elastic.TensorFlowState):
            def sync(self):
                # Horovod 0.28.1's TensorFlowState broadcasts only in graph
                # mode: eagerly, a rank that joins would keep its own values.
                hvd.broadcast_variables(self.variables, root_rank=0)
                super().sync()

            def restore(self):
                # hvd.elastic.run caught a collective's HorovodInternalError.
                backend.notice("detected", how="HorovodInternalError")
                super().restore()

        state = State(variables=variables, steps=steps)
        state.register_reset_callbacks([self._after_reset])
        return state

    def _after_reset(self) -> None:
        """The world Horovod re-formed: this rank's place, its data, its step."""
        hvd, s = self.distribution.hvd, self.settings
        self.topology.num_processes, self.topology.process_index = hvd.size(), hvd.rank()
        self.iterator = self.distribution.make_iterator(make_dataset_fn(s, self.train_split))
        for _ in range(batches_trained(s, self.state.steps)):
            next(self.iterator)
        # Traced again: the loss is divided by the new world's global batch.
        self.train_step = build_train_step(self.distribution, self.model, self.optimizer, s)
        self.notice("restored", step=self.state.steps)

    def save_state(self, path: str, steps: int) -> None:
        self.state.steps = steps
        self.state.commit()  # in memory; also where Horovod says hosts changed

    def run_blocks(self, blocks_from, first_step: int):
        self.state = self._state(first_step)

        @self.distribution.hvd.elastic.run
        def resumable(state):
            return blocks_from(state.steps)

        return resumable(self.state)

    def framework_config(self) -> dict:
        return {"commits": "in memory (hvd.elastic.TensorFlowState)"}
