"""horovod-torch-elastic: horovod-torch's step under Horovod's elastic driver
(launch kind horovod-elastic), its state kept as Horovod's elastic guide
teaches: a hvd.elastic.TorchState of the model, the optimizer and the timed
steps done, committed every --checkpoint-blocks blocks, and the timed blocks
run inside hvd.elastic.run.

A lost rank fails the collective the others are in (HorovodInternalError):
hvd.elastic.run restores the last commit in memory, Horovod re-forms the
world without the failed host, and the blocks go on from the committed step.
No process restarts, and no file is read.
"""

from __future__ import annotations

from trainscale.catalogue.elastic_kinds import processes_on_machine
from trainscale.frameworks.torch.horovod_torch import Horovod


class HorovodElastic(Horovod):
    elastic = True

    def connect(self) -> int:
        return processes_on_machine(super().connect())

    def build(self, module):
        module, optimizer = super().build(module)
        backend = self

        class State(self.hvd.elastic.TorchState):
            def restore(self):
                # hvd.elastic.run caught a collective's HorovodInternalError.
                backend.notice("detected", how="HorovodInternalError")
                super().restore()

        self.state = State(model=module, optimizer=optimizer, steps=0)
        self.state.register_reset_callbacks([self._after_reset])
        return module, optimizer

    def _after_reset(self) -> None:
        """The world Horovod re-formed: this rank's place, its data, its scale."""
        hvd = self.hvd
        self.topology.num_processes, self.topology.process_index = hvd.size(), hvd.rank()
        self.batches = self._batches(self.train_split)
        self.skip_trained_batches(self.state.steps)
        self.notice("restored", step=self.state.steps)

    def read_splits(self) -> tuple:
        train, test = super().read_splits()
        self.train_split = train  # a reset shards it again over the new world
        return train, test

    def save_state(self, path: str, steps: int) -> None:
        self.state.steps = steps
        self.state.commit()  # in memory; also where Horovod says hosts changed

    def run_blocks(self, blocks_from, first_step: int):
        self.state.steps = first_step

        @self.hvd.elastic.run
        def resumable(state):
            return blocks_from(state.steps)

        return resumable(self.state)

    def framework_config(self) -> dict:
        return {"commits": "in memory (hvd.elastic.TorchState)"}
