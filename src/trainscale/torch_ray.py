"""ray-train: Ray Train's TorchTrainer running torch-ddp's training function.

`trainscale train --framework ray-train` is Ray's driver (`drive`): it starts
a private Ray instance for the run, then a TorchTrainer whose workers (one
per replica) each run trainscale.training.train, the same function every
torch-ddp rank runs, with the same model, data shards, DDP step and timed
blocks. Ray Train has set up torch.distributed in each worker (gloo on CPUs,
NCCL on GPUs) and says each worker's rank (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE), so the backend only reads them. Rank 0 gathers every
worker's block times and writes the record, as torch-ddp's rank 0 does, so
any difference from torch-ddp is Ray's.

Fault tolerance is off (FailureConfig(max_failures=0)): a lost worker ends
the run, and `trainscale run` records it as failed, never a smaller run.
What Ray costs before training (its cluster start, the worker group's start)
is start-up, kept apart from the timed blocks in the record's `ray` part.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import tempfile
import time

from trainscale.torch_ddp import DistributedDataParallel

# Ray's sockets live below its temp folder, and a Unix socket path has at
# most 107 bytes: a run folder deeper than this is reached by a short link.
_RAY_TEMP_MAX = 40


class RayTrainDDP(DistributedDataParallel):
    """torch-ddp's backend in a Ray Train worker: the process group is Ray's."""

    def connect(self) -> int:
        import torch.distributed as dist

        world = dist.get_world_size()
        self.topology.num_processes, self.topology.process_index = world, dist.get_rank()
        self.gradient_scale = float(world)  # DDP averages; see torch_backend
        return int(os.environ.get("LOCAL_WORLD_SIZE", world))

    def close(self) -> None:
        pass  # Ray's worker group owns the process group and ends it


def _worker(config: dict) -> None:
    """One Ray Train worker: trainscale's training function, as torch-ddp's ranks run it."""
    from trainscale.settings import RunOptions, RunSettings
    from trainscale.training import train

    train(RunSettings(**config["settings"]), RunOptions(**config["options"]))


def _ray_folder(output: str) -> tuple[str, str | None]:
    """The run's own folder for Ray (beside its record), and the short link to
    it that Ray is given when the folder's path is too long for its sockets."""
    folder = os.path.abspath(os.path.splitext(output)[0] + ".ray")
    os.makedirs(folder, exist_ok=True)
    if len(folder) <= _RAY_TEMP_MAX:
        return folder, None
    link = os.path.join(tempfile.gettempdir(), f"ts-ray-{os.getpid()}")
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(folder, link)
    return folder, link


def drive(settings, options) -> dict:
    """Start Ray, run the workers, stop Ray; returns the record's Ray part.

    Raises the first worker's error (an OutOfMemory included) when the run fails.
    """
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    started = time.perf_counter()
    output = os.path.abspath(options.output)
    settings = dataclasses.replace(settings, data_dir=os.path.abspath(settings.data_dir))
    options = dataclasses.replace(options, output=output)
    folder, link = _ray_folder(output)
    # Ray's token auth (on by default) would keep its token in ~/.ray: given
    # in the environment, the private instance has one and no file is written.
    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    try:
        ray.init(
            num_cpus=settings.replicas + 1,
            num_gpus=settings.replicas if settings.device == "gpu" else 0,
            include_dashboard=False,
            _temp_dir=os.path.join(link or folder, "tmp"),
            log_to_driver=True,
        )
        cluster_started = time.perf_counter()
        trainer = TorchTrainer(
            _worker,
            train_loop_config={
                "settings": dataclasses.asdict(settings),
                "options": dataclasses.asdict(options),
            },
            torch_config=TorchConfig(
                backend="nccl" if settings.device == "gpu" else "gloo",
                timeout_s=int(options.collective_timeout or 1800),
            ),
            scaling_config=ScalingConfig(
                num_workers=settings.replicas, use_gpu=settings.device == "gpu"
            ),
            run_config=RunConfig(
                name="trainscale",
                storage_path=os.path.join(folder, "results"),
                failure_config=FailureConfig(max_failures=0),
            ),
        )
        trainer.fit()
        finished = time.perf_counter()
    finally:
        ray.shutdown()
        if link:
            os.unlink(link)
        # Nothing of Ray's stays beside the record: its session holds JSON
        # files that a study's runs/ folder must not.
        shutil.rmtree(folder, ignore_errors=True)
    return {
        "ray": {
            # ray.init: the local instance's processes up.
            "cluster_start_seconds": cluster_started - started,
            # TorchTrainer.fit: the worker group's start, then the workers' runs.
            "fit_seconds": finished - cluster_started,
            "driver_seconds": time.perf_counter() - started,
            "ray_version": ray.__version__,
        }
    }
