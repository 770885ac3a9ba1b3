"""torch-ddp: DistributedDataParallel on the torch step, over torch.distributed
(trainscale.frameworks.torch.torch_distributed: gloo on CPUs, NCCL on GPUs)."""

from __future__ import annotations

import torch

from trainscale.frameworks.torch.torch_distributed import TorchDistributed


class DistributedDataParallel(TorchDistributed):
    def build(self, module):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        on_gpu = self.device.type == "cuda"
        ddp = torch.nn.parallel.DistributedDataParallel(
            module,
            device_ids=[self.device.index] if on_gpu else None,
            bucket_cap_mb=self.settings.ddp_bucket_cap_mb,
        )
        if self.settings.ddp_compression == "fp16":
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return ddp, self.make_optimizer(module.parameters())
