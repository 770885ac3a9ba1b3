"""deepspeed: Microsoft DeepSpeed's engine, ZeRO stages 0-3, on the torch step.

deepspeed.initialize takes the same model and a torch optimizer (Adam with
Keras's epsilon, or SGD: its JIT-compiled CPU Adam is never used) and returns
its engine, which runs the update (engine.backward, engine.step) and its own
precision: DeepSpeed's bf16 or fp16 config, with its dynamic loss scaler for
fp16 (its CPU accelerator has no fp16: trainscale.catalogue.registry refuses it up
front). ZeRO's stage is --zero-stage; gradient accumulation is 1. DeepSpeed
averages gradients over ranks, as DDP does (gradient_scale,
trainscale.frameworks.torch.torch_distributed). The config a run used goes into its record.

DeepSpeed reuses the process group trainscale.frameworks.torch.torch_distributed opened
(gloo on CPU, over its CPU accelerator, no oneCCL; NCCL on GPU); it reads no
SLURM variables itself, only RANK, LOCAL_RANK, WORLD_SIZE and MASTER_*.
"""

from __future__ import annotations

import logging
import time

import torch

from trainscale.frameworks.torch.torch_distributed import TorchDistributed
from trainscale.frameworks.torch.torch_models import batch_norms

_INPUT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class DeepSpeed(TorchDistributed):
    precision_by_autocast = False
    scales_fp16_loss = True

    def connect(self) -> int:
        processes_on_node = super().connect()
        import deepspeed

        # DeepSpeed's own INFO lines (its config, its step summaries) would
        # crowd every rank's log; the record keeps the config instead.
        deepspeed.utils.logger.setLevel(logging.WARNING)
        # Its communication layer, over the group opened above. On CPU it
        # also loads its shared-memory all-reduce op (inference only), which
        # DeepSpeed compiles here unless the install built it (make torch-env
        # does): the seconds are recorded.
        clock = time.perf_counter()
        deepspeed.init_distributed(dist_backend=self._backend_name())
        self.comm_seconds = time.perf_counter() - clock
        return processes_on_node

    def _backend_name(self) -> str:
        import torch.distributed as dist

        return dist.get_backend()

    def build(self, module):
        import deepspeed

        s = self.settings
        self.config = {
            "train_micro_batch_size_per_gpu": s.batch_size,
            "train_batch_size": s.global_batch_size,
            "gradient_accumulation_steps": 1,
            # DeepSpeed >= 0.19.3 clips to norm 1.0 unless told: not the study's update.
            "gradient_clipping": 0.0,
            "zero_optimization": {
                "stage": s.zero_stage,
                "reduce_bucket_size": s.zero_reduce_bucket_size,
                # Read by ZeRO-3 only.
                "stage3_prefetch_bucket_size": s.zero_prefetch_bucket_size,
                "stage3_max_live_parameters": s.zero_max_live_parameters,
                "stage3_max_reuse_distance": s.zero_max_reuse_distance,
                "stage3_param_persistence_threshold": s.zero_param_persistence_threshold,
            },
            # ZeRO tests its stages with Adam; SGD is the equivalence tests' optimizer.
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 2**31 - 1,
        }
        if s.precision in _INPUT_DTYPES:
            self.config[s.precision] = {"enabled": True}
            # The engine holds the model in that precision: so are its inputs.
            self.input_dtype = _INPUT_DTYPES[s.precision]
            if batch_norms(module):
                # DeepSpeed 0.19 casts parameters only; a batch norm's bf16
                # weight then fails beside its float32 running statistics. Its
                # buffers follow, as DeepSpeed's module.bfloat16() cast them before.
                self.config["data_types"] = {"buffer_dtype": s.precision}
        engine, optimizer, _, _ = deepspeed.initialize(
            model=module, optimizer=self.make_optimizer(module.parameters()), config=self.config
        )
        self.engine = engine
        return engine, optimizer

    def update(self, objective) -> None:
        self.engine.backward(objective)
        self.engine.step()

    def trainable_weights(self):
        import deepspeed

        parameters = [p for p in self.module.parameters() if p.requires_grad]
        # ZeRO-3 partitions every parameter; gathering them is a collective.
        with deepspeed.zero.GatheredParameters(parameters, modifier_rank=None):
            return [p.detach().float().cpu().numpy().copy() for p in parameters]

    def framework_config(self) -> dict:
        return {"deepspeed": self.config, "deepspeed_comm_init_seconds": self.comm_seconds}

    def software_versions(self) -> dict:
        import deepspeed

        return {**super().software_versions(), "deepspeed": deepspeed.__version__}
