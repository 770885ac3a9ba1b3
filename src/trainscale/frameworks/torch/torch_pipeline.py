"""torch-pipeline: pipeline parallelism (torch.distributed.pipelining) on a
GPT, with data parallelism across the pipelines (PP x DP).

As PyTorch's pipelining tutorial teaches, and torchtitan does: every rank
builds the whole model from the same seed, then keeps its stage (a run of
consecutive transformer blocks; the embeddings on the first stage, the final
norm and the head on the last) and drops the rest, so every parameter starts
as torch-single's.

The ranks form a mesh of pp x dp (--pipeline-stages is pp; 0: every rank in
one pipeline, dp = 1). Data parallelism is the inner dimension, as in
Megatron-LM's rank order: rank r runs stage r // dp of pipeline r % dp, so a
pipeline's stages are dp ranks apart and its data-parallel peers are
neighbours (a node's, where a node holds several). Each pipeline draws its
share of the global batch (batch size x ranks, as for every framework: one
batch's work per GPU) and cuts it into --pipeline-microbatches; the schedule
(--pipeline-schedule: GPipe, or 1F1B) sends each microbatch's activations to
the next stage and their gradients back (point-to-point send and receive:
gloo on CPUs, NCCL on GPUs). The last stage's loss per microbatch is
sum(token losses) / (global batch x tokens), and the schedule leaves the
microbatches' gradients unscaled (scale_grads=False): their sum is the
pipeline's share of the gradient of the mean loss over the global batch.
Across the pipelines, each stage is replicated over the "dp" mesh dimension
with PyTorch's replicate (torchtitan's DP beside PP: DDP's all-reduce of the
gradients, on FSDP2's machinery), which the schedule lets all-reduce once,
after the last microbatch's backward (PipelineStage.perform_reduce_grad). It
averages, so each stage's loss is scaled by dp: the sum over pipelines,
torch-single's gradient.
"""

from __future__ import annotations

import torch

from trainscale.catalogue.model_parallel_knobs import pipeline_microbatches, pipeline_stages
from trainscale.frameworks.torch.torch_distributed import TorchDistributed
from trainscale.frameworks.torch.torch_fsdp import whole_weights
from trainscale.frameworks.torch.torch_gpt import keep_stage


class Pipeline(TorchDistributed):
    # Only the last stage holds the loss; the loop sums the ranks' shares.
    loss_is_global = False
    # torch.autocast around the schedule; fp16 is refused (pipeline_check).
    precision_by_autocast = True

    def connect(self) -> int:
        processes = super().connect()
        self.gradient_scale = 1.0  # the schedule runs backward: the loss is scaled (build)
        return processes

    def mesh_shape(self) -> tuple[int, int]:
        """(pp, dp): stages in each pipeline, and pipelines."""
        stages = pipeline_stages(self.settings)
        return stages, self.topology.num_processes // stages

    @property
    def stage(self) -> int:
        return self.topology.process_index // self.mesh_shape()[1]

    def data_shard(self) -> tuple[int, int]:
        # Every stage of a pipeline draws the pipeline's batch: the first its
        # inputs, the last its targets.
        _, dp = self.mesh_shape()
        return self.topology.process_index % dp, dp

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.mesh_shape()[0] - 1

    def build(self, module):
        from torch.distributed._composable.replicate_with_fsdp import replicate
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        s, (stages, dp) = self.settings, self.mesh_shape()
        self.mesh = init_device_mesh(self.device.type, (stages, dp), mesh_dim_names=("pp", "dp"))
        keep_stage(module, self.stage, stages)
        if dp > 1:  # DP across the pipelines: each stage replicated over its peers
            # Not DDP: torch 2.13's DistributedDataParallel under the schedule
            # fails its first bucket rebuild in every rank ("rebuilt parameter
            # indices size is not same as original model parameters size"),
            # and with static_graph=True its gradients were not those of
            # torch-single (tests/torch/test_gpt_equivalence.py: 5.8e-2 apart).
            replicate(module, mesh=self.mesh["dp"])

        def loss(logits, targets):  # per microbatch, on the last stage; replicate averages
            return self.loss(logits, targets) * dp

        schedule = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[s.pipeline_schedule]
        pipe = self.mesh["pp"].get_group()  # this rank's pipeline: its point-to-point peers
        self.schedule = schedule(
            PipelineStage(module, self.stage, stages, self.device, group=pipe),
            n_microbatches=pipeline_microbatches(s),
            loss_fn=loss,
            scale_grads=False,
        )
        return module, self.make_optimizer(module.parameters())

    def step(self):
        inputs, targets = next(self.batches)
        losses: list[torch.Tensor] = []
        self.optimizer.zero_grad()
        with torch.autocast(self.device.type, self.autocast, enabled=self.autocast is not None):
            if self.is_first and self.is_last:  # one stage: the whole model
                self.schedule.step(inputs, target=targets, losses=losses)
            elif self.is_first:
                self.schedule.step(inputs)
            elif self.is_last:
                self.schedule.step(target=targets, losses=losses)
            else:
                self.schedule.step()
        self.optimizer.step()
        if not losses:
            return torch.zeros((), device=self.device)
        return torch.stack(losses).sum().detach() / self.mesh_shape()[1]  # undo the dp scale

    def test_logits(self, inputs, labels):
        # The schedule's forward-only pass (eval) over the same microbatches as
        # training; only a pipeline's last stage gets logits back.
        with torch.autocast(self.device.type, self.autocast, enabled=self.autocast is not None):
            if self.is_first and self.is_last:
                return self.schedule.eval(inputs, target=labels).float()
            if self.is_first:
                self.schedule.eval(inputs)
            elif self.is_last:
                return self.schedule.eval(target=labels).float()
            else:
                self.schedule.eval()
        return None

    def trainable_weights(self):
        # The first pipeline's stages' parameters, gathered to every rank in
        # stage order (ranks 0, dp, 2 dp, ...): the whole model's order.
        import torch.distributed as dist

        mine = whole_weights(self.module)  # replicated DTensors where dp > 1
        ranks = [None] * self.topology.num_processes
        dist.all_gather_object(ranks, mine)
        return [weight for stage in ranks[:: self.mesh_shape()[1]] for weight in stage]

    def framework_config(self) -> dict:
        # The knobs' 0s resolved: what the mesh and the schedule were.
        stages, pipelines = self.mesh_shape()
        return {
            "stages": stages,
            "pipelines": pipelines,
            "microbatches": pipeline_microbatches(self.settings),
        }
