"""torch-pipeline: pipeline parallelism (torch.distributed.pipelining) on a GPT.

As PyTorch's pipelining tutorial teaches, and torchtitan does: every rank
builds the whole model from the same seed, then keeps its stage (a run of
consecutive transformer blocks; the embeddings on the first stage, the final
norm and the head on the last) and drops the rest, so every parameter starts
as torch-single's. One stage per rank: the world is one pipeline, with no
data-parallel dimension.

The global batch (batch size x ranks, as for every framework: one batch's
work per GPU) enters the first stage cut into --pipeline-microbatches; the
schedule (--pipeline-schedule: GPipe, or 1F1B) sends each microbatch's
activations to the next stage and their gradients back (point-to-point
send and receive: gloo on CPUs, NCCL on GPUs). The last stage's loss per
microbatch is sum(token losses) / (global batch x tokens), and the schedule
leaves the microbatches' gradients unscaled (scale_grads=False): their sum
is the gradient of the mean loss over the global batch, torch-single's.
"""

from __future__ import annotations

import torch

from trainscale.catalogue.knobs import pipeline_microbatches
from trainscale.frameworks.torch.torch_distributed import TorchDistributed
from trainscale.frameworks.torch.torch_gpt import keep_stage


class Pipeline(TorchDistributed):
    # Only the last stage holds the loss; the loop sums the ranks' shares.
    loss_is_global = False
    # torch.autocast around the schedule; fp16 is refused (knobs.pipeline_check).
    precision_by_autocast = True

    def connect(self) -> int:
        processes = super().connect()
        self.gradient_scale = 1.0  # nothing averages over ranks
        return processes

    def data_shard(self) -> tuple[int, int]:
        # Every stage draws the global batch: the first its inputs, the last its targets.
        return 0, 1

    @property
    def is_first(self) -> bool:
        return self.topology.process_index == 0

    @property
    def is_last(self) -> bool:
        return self.topology.process_index == self.topology.num_processes - 1

    def build(self, module):
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        s, stage, stages = self.settings, self.topology.process_index, self.topology.num_processes
        keep_stage(module, stage, stages)
        schedule = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[s.pipeline_schedule]
        self.schedule = schedule(
            PipelineStage(module, stage, stages, self.device),
            n_microbatches=pipeline_microbatches(s),
            loss_fn=self.loss,  # per microbatch, on the last stage
            scale_grads=False,
        )
        return module, self.make_optimizer(module.parameters())

    def step(self):
        inputs, targets = next(self.batches)
        losses: list[torch.Tensor] = []
        self.optimizer.zero_grad()
        with torch.autocast(self.device.type, self.autocast, enabled=self.autocast is not None):
            if self.is_first and self.is_last:  # one stage: the whole model (a 1-rank run)
                self.schedule.step(inputs, target=targets, losses=losses)
            elif self.is_first:
                self.schedule.step(inputs)
            elif self.is_last:
                self.schedule.step(target=targets, losses=losses)
            else:
                self.schedule.step()
        self.optimizer.step()
        return torch.stack(losses).sum().detach() if losses else torch.zeros((), device=self.device)

    def test_logits(self, inputs, labels):
        # The schedule's forward-only pass (eval) over the same microbatches as
        # training; only the last stage gets logits back.
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
        # Every stage's parameters, gathered to every rank in stage order:
        # the whole model's order.
        import torch.distributed as dist

        mine = [p.detach().cpu().numpy() for p in self.module.parameters() if p.requires_grad]
        stages = [None] * self.topology.num_processes
        dist.all_gather_object(stages, mine)
        return [weight for stage in stages for weight in stage]

    def framework_config(self) -> dict:
        # --pipeline-microbatches 0 resolved: what the schedule cut the batch into.
        return {"microbatches": pipeline_microbatches(self.settings)}
