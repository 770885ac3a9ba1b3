"""torch-tp: tensor parallelism (torch.distributed.tensor.parallel) on a GPT,
with FSDP2 across the groups: the 2-D composition torchtitan uses.

The ranks form a mesh of dp x tp (--tensor-parallel is tp; 0: every rank).
Within a tp group, each block's attention and MLP are split as Megatron-LM
splits them and PyTorch's tensor-parallel tutorial teaches: the query, key,
value and MLP input projections column-wise (each rank computes some heads,
some hidden units), the output projections row-wise (each rank's partial
sum, all-reduced). The embeddings, the layer norms and the head stay whole on
every rank of the group. Every rank of a tp group reads the same batch:
the group's share of the global batch, tp batches' worth. Across the dp
groups, FSDP2 shards every block and the root over the "dp" mesh dimension
(when dp > 1) and averages their gradients, so each rank back-propagates its
loss times dp (TorchBackend's gradient_scale).
"""

from __future__ import annotations

from trainscale.frameworks.torch.torch_distributed import TorchDistributed
from trainscale.frameworks.torch.torch_fsdp import shard_units, whole_weights

# Megatron-LM's split of a block (torchtitan's plan, without sequence parallelism).
_COLUMNWISE = ("attention.wq", "attention.wk", "attention.wv", "mlp.fc")
_ROWWISE = ("attention.wo", "mlp.proj")


def block_plan() -> dict:
    """Each block's parallelize_module plan: Megatron-LM's split."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = {name: ColwiseParallel() for name in _COLUMNWISE}
    plan.update({name: RowwiseParallel() for name in _ROWWISE})
    return plan


class TensorParallel(TorchDistributed):
    def mesh_shape(self) -> tuple[int, int]:
        """(dp, tp): data-parallel groups, and ranks in each."""
        world = self.topology.num_processes
        tp = self.settings.tensor_parallel or world
        return world // tp, tp

    def build(self, module):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import parallelize_module

        dp, tp = self.mesh_shape()
        self.mesh = init_device_mesh(self.device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
        plan = block_plan()
        for block in module.blocks.values():
            parallelize_module(block, self.mesh["tp"], plan)
        self.gradient_scale = float(dp)  # FSDP2 averages over dp; tp needs no reduction
        if dp > 1:
            for unit in shard_units(module):
                if any(True for _ in unit.parameters()):
                    fully_shard(unit, mesh=self.mesh["dp"])
            fully_shard(module, mesh=self.mesh["dp"])
        return module, self.make_optimizer(module.parameters())

    def data_shard(self) -> tuple[int, int]:
        dp, _ = self.mesh_shape()
        return self.mesh["dp"].get_local_rank(), dp

    def step(self):
        # Each rank of a tp group computes the group's whole loss: its share
        # of the sum the loop takes over ranks is 1/tp of it.
        return super().step() / self.mesh_shape()[1]

    def evaluate(self):
        # Every rank of a tp group scores the group's test shard whole (its
        # loss, accuracy and examples), so each counts 1/tp of the sums.
        return super().evaluate() / self.mesh_shape()[1]

    def trainable_weights(self):
        return whole_weights(self.module)
