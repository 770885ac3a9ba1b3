"""torch.distributed's plumbing, shared by every torch framework of ranks
that rendezvous through it (torch-ddp, torch-fsdp, deepspeed): how ranks find
each other, which device a rank takes, the collective that gathers the
measured rates, and leaving cleanly. A framework adds only how it builds its
model and optimizer, and its update where it runs its own.

One rank per replica: `trainscale run` gives each its RANK, WORLD_SIZE and a
free MASTER_PORT (trainscale.catalogue.launch_kinds); under srun each rank reads
SLURM's task variables and the launcher's MASTER_ADDR (the job's first host)
and per-job port (trainscale.core.slurm). gloo on CPUs, NCCL on GPUs.
"""

from __future__ import annotations

import contextlib
import datetime
import os

import numpy as np
import torch

from trainscale.core.slurm import rank_env_from_slurm
from trainscale.frameworks.torch.step_profile import note_tensor_memory, step_profiler
from trainscale.frameworks.torch.torch_backend import TorchBackend
from trainscale.harness.backend import DeviceError

RENDEZVOUS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class TorchDistributed(TorchBackend):
    loss_is_global = False
    # A process group can outlive destroy_process_group() where a library
    # keeps its own reference (DeepSpeed's groups live in its module
    # globals); gloo's C++ threads then meet the interpreter's teardown and
    # abort ("terminate called without an active exception", SIGABRT, after
    # the record was written: twice in CI, deepspeed; pytorch/pytorch#179291).
    # A rank whose run is done therefore ends with os._exit.
    finalizes_at_exit = False

    def connect(self) -> int:
        import torch.distributed as dist

        if os.environ.get("TRAINSCALE_TORCH_FROM_SLURM"):
            os.environ.update(rank_env_from_slurm())
        missing = [v for v in RENDEZVOUS if v not in os.environ]
        if missing:
            raise DeviceError(
                f"{self.settings.framework} needs {', '.join(missing)} "
                "(set by `trainscale run`, or under srun)"
            )
        timeout = self.options.collective_timeout
        dist.init_process_group(
            backend="nccl" if self.settings.device == "gpu" else "gloo",
            timeout=datetime.timedelta(seconds=timeout) if timeout else None,
        )
        world = dist.get_world_size()
        self.topology.num_processes, self.topology.process_index = world, dist.get_rank()
        # DDP, FSDP2 and DeepSpeed average gradients over ranks; see
        # trainscale.frameworks.torch.torch_backend's docstring.
        self.gradient_scale = float(world)
        return int(os.environ.get("LOCAL_WORLD_SIZE", world))

    def device_index(self, visible: int) -> int:
        # With every GPU of the node visible, rank i takes GPU i; a launcher
        # that binds one GPU per task leaves exactly one visible.
        return int(os.environ.get("LOCAL_RANK", 0)) if visible > 1 else 0

    def close(self) -> None:
        # Pending work finishes and the group's threads are joined while the
        # interpreter is whole (see finalizes_at_exit).
        import torch.distributed as dist

        super().close()
        if dist.is_initialized():
            dist.destroy_process_group()

    sees_collectives = True

    @contextlib.contextmanager
    def observe_collectives(self):
        """Which collectives one step runs, and on how many elements: the
        process group's own operations (gloo:all_reduce, nccl:all_reduce, ...)
        as torch's profiler sees them, over one step after the timed ones
        (training._observe_one_step: never before them)."""
        with step_profiler(self.settings) as profiler:
            yield
        self.collectives_per_step = collectives_seen(profiler)
        note_tensor_memory(self, profiler)

    def gather_rows(self, row: np.ndarray) -> np.ndarray:
        import torch.distributed as dist

        # NCCL gathers only device tensors; gloo only host ones.
        mine = torch.tensor(np.asarray(row, dtype=np.float64), device=self.device)
        rows = [torch.empty_like(mine) for _ in range(self.topology.num_processes)]
        dist.all_gather(rows, mine)
        return torch.stack(rows).cpu().numpy()


def collectives_seen(profiler) -> dict[str, dict]:
    """The process group's operations a torch profiler saw: {name: {calls, elements}}.

    Read from the profiler's own events (kineto's), as `profiler.events()`
    reads them before it builds its Python tree of every operator: a GPT
    step's tree took seconds a rank to build (bench/README.md), for a few
    names and shapes."""
    seen: dict[str, dict] = {}
    for event in profiler.profiler.kineto_results.events():
        name = event.name()
        if name.split(":")[0] in ("gloo", "nccl") and not event.is_hidden_event():
            elements = sum(int(np.prod(shape)) for shape in event.shapes() if shape)
            entry = seen.setdefault(name, {"calls": 0, "elements": 0})
            entry["calls"] += 1
            entry["elements"] += elements
    return seen
