"""lightning-single, lightning and lightning-horovod: PyTorch Lightning's Trainer (seed 003's
`Pytorch_lightning_*` rows), as Lightning's docs teach it: a LightningModule
whose training_step returns its batch's mean loss and whose
configure_optimizers returns the optimizer, and
Trainer(accelerator, devices, num_nodes, strategy).fit(module, batches).

- lightning-single: one device (Lightning's SingleDeviceStrategy);
- lightning: one rank per replica, launched as Lightning's docs teach (the
  launcher gives each process LOCAL_RANK, or SLURM its task variables, and
  Lightning then starts no processes of its own), over torch.distributed
  (trainscale.frameworks.torch.torch_distributed joins the group first;
  Lightning finds it joined). --lightning-strategy ddp (DDPStrategy, with
  torch-ddp's bucket and compression knobs), fsdp or deepspeed (GPUs only,
  as Lightning says: trainscale.catalogue.knobs.lightning_strategy_check).

The data are trainscale's batches, each rank its own shard, handed to fit as
an iterable with use_distributed_sampler=False (Lightning's sampler would
shard a map-style dataset its own way; the shards here are every other
framework's, so the runs compare and the equivalence test holds). The loop
drives Trainer.fit one batch at a time (trainscale.harness.driven_loop);
Lightning does the backward, the all-reduce and the optimizer step, and its
precision plugin the autocast. No checkpoint, log or progress bar is
written: the record is the run's log.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from trainscale.frameworks.torch.horovod_torch import Horovod
from trainscale.frameworks.torch.step_profile import note_tensor_memory, step_profiler
from trainscale.frameworks.torch.torch_backend import TorchBackend
from trainscale.frameworks.torch.torch_ddp import ddp_knobs
from trainscale.frameworks.torch.torch_distributed import TorchDistributed, collectives_seen
from trainscale.harness.driven_loop import DrivenLoop, api_epochs

# trainscale's --precision as Lightning's Trainer(precision=...) names it:
# 2.x's names, and 1.9's (lightning-horovod's environment).
PRECISION = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}
PRECISION_1 = {"fp32": 32, "bf16": "bf16", "fp16": 16}


def version_options(pl, precision: str) -> dict:
    """The Trainer options whose names changed in Lightning 2.0: the
    precision, and the distributed sampler left off (1.9 called it
    replace_sampler_ddp)."""
    if int(pl.__version__.split(".")[0]) < 2:
        return {"precision": PRECISION_1[precision], "replace_sampler_ddp": False}
    return {"precision": PRECISION[precision], "use_distributed_sampler": False}


def lightning_module(net: torch.nn.Module, optimizer):
    """`net` as the LightningModule a user writes around it."""
    import pytorch_lightning as pl

    class Classifier(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = net

        def training_step(self, batch, batch_idx):
            images, labels = batch
            logits = self.net(images)
            # The mean over the batch's examples (a text model's: over its tokens).
            return F.cross_entropy(logits.float().flatten(0, -2), labels.flatten())

        def configure_optimizers(self):
            return optimizer

    return Classifier()


class LightningTrainer:
    """What both Lightning frameworks add to their torch backend: the
    Trainer, and fit driven batch by batch."""

    precision_by_autocast = False  # Lightning's precision plugin casts
    scales_fp16_loss = True  # and scales an fp16 loss
    fit_loop: DrivenLoop | None = None

    def strategy(self):
        return "auto"  # one device: Lightning's SingleDeviceStrategy

    def placement(self) -> dict:
        """Trainer's devices and nodes: where Lightning starts no processes of
        its own, the launcher's."""
        return {"devices": self.settings.processes_per_node(), "num_nodes": self.settings.nodes}

    def prepare(self) -> None:
        import pytorch_lightning as pl

        super().prepare()
        s = self.settings
        epochs, steps = api_epochs(self)
        loop = self.fit_loop = DrivenLoop(lambda: trainer.fit(module, self.batches), "lightning")

        backend = self

        class OneBatchAtATime(pl.Callback):
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                if backend.profiler:  # observe_collectives: in fit's thread, where they run
                    backend.profiler.__enter__()

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                if backend.profiler:
                    backend.profiler.__exit__(None, None, None)
                    backend.collectives_per_step = collectives_seen(backend.profiler)
                    note_tensor_memory(backend, backend.profiler)
                    backend.profiler = None
                if not loop.hand_over(outputs["loss"].detach()):
                    trainer.should_stop = True

        trainer = pl.Trainer(
            accelerator="gpu" if s.device == "gpu" else "cpu",
            **self.placement(),
            strategy=self.strategy(),
            **version_options(pl, s.precision),
            max_epochs=epochs,
            limit_train_batches=steps,
            callbacks=[OneBatchAtATime()],
            enable_checkpointing=False,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        module = lightning_module(self.module, self.optimizer)

    def step(self):
        return self.fit_loop.step()

    profiler = None
    sees_collectives = True

    @contextlib.contextmanager
    def observe_collectives(self):
        """The collectives of the step run inside: profiled in fit's thread
        (a torch profiler sees the thread it is started in), by the callback."""
        self.profiler = step_profiler(self.settings)
        yield

    def read_loss(self, loss) -> float:
        # This rank's batch mean; the loop sums the ranks' shares.
        return float(loss.item()) / self.topology.num_processes

    def close(self) -> None:
        if self.fit_loop:
            self.fit_loop.stop()
        super().close()

    def software_versions(self) -> dict:
        import pytorch_lightning as pl

        return {**super().software_versions(), "pytorch_lightning": pl.__version__}


class LightningSingle(LightningTrainer, TorchBackend):
    loss_is_global = True


class LightningDistributed(LightningTrainer, TorchDistributed):
    def strategy(self):
        from pytorch_lightning.strategies import DDPStrategy

        if self.settings.lightning_strategy != "ddp":
            return self.settings.lightning_strategy  # fsdp, deepspeed: Lightning's own
        bucket_cap_mb, hook = ddp_knobs(self.settings)
        return DDPStrategy(bucket_cap_mb=bucket_cap_mb, ddp_comm_hook=hook)


class LightningHorovod(LightningTrainer, Horovod):
    """Lightning 1.9's strategy="horovod" (seed 003's Pytorch_lightning_*
    rows; gone from Lightning 2.0): ranks started by horovodrun, mpirun or
    srun, as for horovod-torch. Lightning's HorovodStrategy broadcasts rank
    0's weights and wraps the optimizer in hvd.DistributedOptimizer (an
    average of the ranks' batch means: the global batch's mean), so the
    backend hands it the plain optimizer. Its setup also multiplies the
    optimizer's learning rate by the number of ranks (Horovod's rule for a
    batch that grows with them); --learning-rate is the global batch's
    already, and accuracy mode sets each epoch's rate itself, so the
    strategy's setup divides it back once, where Lightning multiplied it."""

    def strategy(self):
        from pytorch_lightning.strategies import HorovodStrategy

        class StudysLearningRate(HorovodStrategy):
            def setup(self, trainer):
                super().setup(trainer)
                for optimizer in self.optimizers:
                    for group in optimizer.param_groups:
                        group["lr"] /= self.world_size

        return StudysLearningRate()

    def placement(self) -> dict:
        return {}  # one device a rank; Horovod's world is hvd.size()

    def build(self, module):
        return module, self.make_optimizer(module.parameters())
