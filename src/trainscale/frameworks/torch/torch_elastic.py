"""torch-elastic: DDP under torchrun's elastic agents (launch kind
torchrun-elastic), its training state saved and restored as PyTorch's
"Fault-tolerant Distributed Training with torchrun" tutorial teaches.

On a failure torchrun's agents stop every rank and start new ones, which
join a new rendezvous: the world is whoever joined (a lost node's ranks do
not). A new rank knows nothing but the checkpoint: the model's and the
optimizer's state and the timed steps done, which the chief saves every
--checkpoint-blocks blocks (trainscale.harness.training). Restoring it also
skips the batches already trained on, so a restart at the same world size
trains exactly what an unbroken run trains (tests/torch/test_elastic.py).
"""

from __future__ import annotations

import os

import torch

from trainscale.catalogue.elastic_kinds import (
    ELASTIC_MAX_RESTARTS,
    ELASTIC_RENDEZVOUS,
    processes_on_machine,
)
from trainscale.frameworks.torch.torch_ddp import DistributedDataParallel


class ElasticDistributedDataParallel(DistributedDataParallel):
    elastic = True

    def connect(self) -> int:
        # Here one agent per rank: torchrun's LOCAL_WORLD_SIZE counts the agent's.
        return processes_on_machine(super().connect())

    def save_state(self, path: str, steps: int) -> None:
        import torch.distributed as dist

        # Each rank's random state (dropout's masks): the rank that takes its
        # place after a restart draws what it would have drawn.
        generators = [None] * self.topology.num_processes
        dist.all_gather_object(generators, torch.get_rng_state())
        if not self.topology.is_chief:
            return
        state = {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}
        state.update(steps=steps, scaler=self.scaler.state_dict() if self.scaler else None)
        state.update(random_states=generators)
        # Written whole, then renamed: a chief killed mid-save leaves the last one.
        partial = f"{path}.partial"
        torch.save(state, partial)
        os.replace(partial, path)

    def restore_state(self, path: str) -> int:
        if not os.path.exists(path):
            return 0
        state = torch.load(path, map_location=self.device, weights_only=True)
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler and state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        generators = state["random_states"]
        if len(generators) == self.topology.num_processes:  # else a new world draws anew
            torch.set_rng_state(generators[self.topology.process_index].cpu())
        self.skip_trained_batches(state["steps"])
        return state["steps"]

    def framework_config(self) -> dict:
        return {
            "restart_count": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
            "max_restarts": ELASTIC_MAX_RESTARTS,
            "rendezvous": ELASTIC_RENDEZVOUS,
            "store_per_round": os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") == "1",
        }
