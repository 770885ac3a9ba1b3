"""torch-fsdp: PyTorch's FSDP2 (torch.distributed.fsdp.fully_shard) on the torch step.

As PyTorch's FSDP2 tutorial teaches: each block of the model is sharded,
then the root, and the optimizer is built afterwards, on the sharded (DTensor)
parameters, so every rank holds 1/N of the parameters, gradients and
optimizer state. A block is each top-level layer that holds parameters
(trainscale's image models are nn.Sequential: a convolution, a dense layer,
a ResNet bottleneck), and each transformer block of a GPT. Mixed precision
is FSDP2's MixedPrecisionPolicy (parameters gathered in bf16/fp16 for the
compute, gradients reduced in fp32), not autocast; fp16 keeps the step's GradScaler.
A batch norm is sharded on its own in float32 with no cast (FSDP2 casts a
whole group's parameters, and a bf16 weight beside float32 running statistics
fails), so it normalises the bf16 activations as under autocast.
--fsdp-reshard-after-forward frees each block's gathered parameters after
its forward and gathers them again in backward (ZeRO-3's traffic); off
keeps them until backward (more memory, one all-gather less).

FSDP2 averages gradients over ranks (its reduce-scatter's ReduceOp.AVG), as
DDP does. pytorch/pytorch #162338 reports gloo's reduce-scatter summing
instead (its options were dropped, "silent correctness"); torch 2.13 does
not: 2 CPU replicas train like torch-single to float32 rounding
(tests/torch/test_equivalence.py, which a summing reduction fails by the
size of an update).
"""

from __future__ import annotations

import torch

from trainscale.frameworks.torch.torch_distributed import TorchDistributed
from trainscale.frameworks.torch.torch_models import batch_norms

_PARAMETER_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def shard_units(module):
    """The model's blocks, each sharded on its own: its top-level layers, and
    each member of a container of them (a GPT's transformer blocks)."""
    for child in module.children():
        if isinstance(child, (torch.nn.ModuleDict, torch.nn.ModuleList)):
            yield from child.children()
        else:
            yield child


def whole_weights(module) -> list:
    """Every trainable parameter whole, on the host: a sharded one (a DTensor)
    gathered with full_tensor(), a collective every rank calls."""
    return [
        (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu().numpy().copy()
        for p in module.parameters()
        if p.requires_grad
    ]


class FullyShardedDataParallel(TorchDistributed):
    precision_by_autocast = False

    def build(self, module):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

        # The mesh of this device type: fully_shard's default follows the
        # build's accelerator, a CUDA mesh even for a CPU run.
        mesh = init_device_mesh(self.device.type, (self.topology.num_processes,))
        policy = MixedPrecisionPolicy(
            param_dtype=_PARAMETER_DTYPES.get(self.settings.precision), reduce_dtype=torch.float32
        )
        options = dict(
            mesh=mesh,
            mp_policy=policy,
            reshard_after_forward=self.settings.fsdp_reshard_after_forward,
        )
        if policy.param_dtype is not None:
            # Sharded first (FSDP2 shards inner modules before outer ones).
            float32 = MixedPrecisionPolicy(reduce_dtype=torch.float32)
            for norm in batch_norms(module):
                fully_shard(norm, **{**options, "mp_policy": float32})
        for block in shard_units(module):
            if not isinstance(block, FSDPModule) and any(True for _ in block.parameters()):
                fully_shard(block, **options)
        fully_shard(module, **options)
        return module, self.make_optimizer(module.parameters())

    def trainable_weights(self):
        return whole_weights(self.module)
