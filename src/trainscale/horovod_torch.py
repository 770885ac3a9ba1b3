"""horovod-torch: Horovod's DistributedOptimizer on the torch step.

Ranks are started as the TensorFlow Horovod ranks are (mpirun or horovodrun
--gloo here, srun under SLURM), and hvd.init() reads the same settings
(trainscale.backend.init_horovod).
"""

from __future__ import annotations

import numpy as np
import torch

from trainscale.backend import init_horovod
from trainscale.torch_backend import TorchBackend


class Horovod(TorchBackend):
    loss_is_global = False

    def connect(self) -> int:
        import horovod.torch as hvd

        self.hvd = hvd
        init_horovod(hvd, self.settings)
        self.num_processes, self.process_index = hvd.size(), hvd.rank()
        return hvd.local_size()

    def device_index(self, visible: int) -> int:
        return self.hvd.local_rank() if visible > 1 else 0

    def wrap(self, model, optimizer):
        hvd = self.hvd
        # Horovod's pattern: every rank starts from rank 0's exact state.
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        compression = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}
        # Sum, not Average: each rank's loss is already divided by the global batch.
        optimizer = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=model.named_parameters(),
            compression=compression[self.settings.horovod_compression],
            op=hvd.Sum,
        )
        return model, optimizer

    def scaled_step(self) -> None:
        # Horovod's recipe for loss scaling: reduce the scaled gradients,
        # unscale them, then step without reducing again.
        self.optimizer.synchronize()
        self.scaler.unscale_(self.optimizer)
        with self.optimizer.skip_synchronize():
            self.scaler.step(self.optimizer)
        self.scaler.update()

    def gather_rows(self, row: np.ndarray) -> np.ndarray:
        mine = torch.tensor(np.asarray(row, dtype=np.float64)[None, :])
        return self.hvd.allgather(mine).numpy()
