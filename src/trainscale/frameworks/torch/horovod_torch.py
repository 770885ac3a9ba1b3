"""horovod-torch: Horovod's DistributedOptimizer on the torch step.

Ranks are started as the TensorFlow Horovod ranks are (mpirun or horovodrun
--gloo here, srun under SLURM), and hvd.init() reads the same settings
(trainscale.harness.backend.init_horovod).
"""

from __future__ import annotations

import numpy as np
import torch

from trainscale.frameworks.torch.torch_backend import TorchBackend
from trainscale.harness.backend import horovod_wire_compression, init_horovod


class Horovod(TorchBackend):
    loss_is_global = False

    def connect(self) -> int:
        import horovod.torch as hvd

        self.hvd = hvd
        init_horovod(hvd, self.settings)
        self.topology.num_processes, self.topology.process_index = hvd.size(), hvd.rank()
        return hvd.local_size()

    def device_index(self, visible: int) -> int:
        return self.hvd.local_rank() if visible > 1 else 0

    def build(self, module):
        hvd = self.hvd
        optimizer = self.make_optimizer(module.parameters())
        # Horovod's pattern: every rank starts from rank 0's exact state.
        hvd.broadcast_parameters(module.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        # Sum, not Average: each rank's loss is already divided by the global batch.
        optimizer = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=module.named_parameters(),
            compression=horovod_wire_compression(hvd, self.settings),
            op=hvd.Sum,
        )
        return module, optimizer

    def update(self, objective) -> None:
        if self.scaler is None:
            return super().update(objective)
        # Horovod's recipe for loss scaling: reduce the scaled gradients,
        # unscale them, then step without reducing again.
        self.optimizer.zero_grad()
        self.scaler.scale(objective).backward()
        self.optimizer.synchronize()
        self.scaler.unscale_(self.optimizer)
        with self.optimizer.skip_synchronize():
            self.scaler.step(self.optimizer)
        self.scaler.update()

    def gather_rows(self, row: np.ndarray) -> np.ndarray:
        mine = torch.tensor(np.asarray(row, dtype=np.float64)[None, :])
        return self.hvd.allgather(mine).numpy()
