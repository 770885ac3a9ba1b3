"""torch-ddp: DistributedDataParallel on the torch step, over torch.distributed
(trainscale.frameworks.torch.torch_distributed: gloo on CPUs, NCCL on GPUs)."""

from __future__ import annotations

import torch

from trainscale.frameworks.torch.torch_distributed import TorchDistributed


def ddp_knobs(settings) -> tuple[float, object]:
    """DDP's knobs (Lightning's DDPStrategy takes them too): its bucket size
    in MB, and its communication hook (None: the plain all-reduce)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    hook = default_hooks.fp16_compress_hook if settings.ddp_compression == "fp16" else None
    return settings.ddp_bucket_cap_mb, hook


class DistributedDataParallel(TorchDistributed):
    def build(self, module):
        bucket_cap_mb, hook = ddp_knobs(self.settings)
        on_gpu = self.device.type == "cuda"
        ddp = torch.nn.parallel.DistributedDataParallel(
            module,
            device_ids=[self.device.index] if on_gpu else None,
            bucket_cap_mb=bucket_cap_mb,
        )
        if hook:
            ddp.register_comm_hook(None, hook)
        return ddp, self.make_optimizer(module.parameters())
