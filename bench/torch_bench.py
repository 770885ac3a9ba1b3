"""The torch frameworks' overhead, measured: ratios of runs made side by side.

Run by bench/run.py with the torch environment (.venv-torch); prints one JSON
object on stdout. As bench/harness_bench.py does for TensorFlow:
1. the harness's torch-single step (trainscale.frameworks.torch.torch_backend) against the loop
   a PyTorch user writes by hand (zero_grad, forward, mean cross-entropy,
   backward, step) on the same model, optimizer, batch and synthetic data,
   timed blocks interleaved in one process;
2. one replica through every torch framework's real launch path (a
   RANK/MASTER_PORT rank, mpirun: the registry's torch frameworks) against
   torch-single, whole `trainscale run` processes alternating;
3. seconds from process start to the first timed step, per framework;
4. where a one-replica run's cost goes: each framework's step against
   torch-single's in one process, interleaved, and the operators whose time
   grew (bench/one_replica_step.py, a process per framework);
5. ray-train against torch-ddp at 1 and 2 workers, whole runs alternating
   (alone: `.venv-torch/bin/python bench/torch_bench.py --only ray-train`;
   issue 44's five pairs at one worker: add `--ray-workers 1 --ray-rounds 5`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
from common import harness_against, median, one_replica_each, ratio_interval, run_framework

from trainscale.catalogue.options import RunOptions
from trainscale.catalogue.registry import REGISTRY
from trainscale.catalogue.settings import RunSettings
from trainscale.frameworks.torch.torch_backend import TorchBackend
from trainscale.frameworks.torch.torch_models import build_torch_model


def harness_step(settings: RunSettings):
    """The harness's torch-single step, prepared as `trainscale train` prepares it."""
    backend = TorchBackend(settings, RunOptions())
    backend.prepare()
    return backend.step


def plain_step(settings: RunSettings):
    """The hand-written PyTorch loop, on the same model, Adam, batch and data."""
    torch.manual_seed(settings.seed)
    model = build_torch_model(settings.model, settings.image_size, settings.num_classes)
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.learning_rate, eps=1e-7)
    generator = torch.Generator().manual_seed(settings.seed)
    shape = (settings.batch_size, 3, settings.image_size, settings.image_size)
    images = torch.randn(shape, generator=generator)
    labels = torch.randint(0, settings.num_classes, (settings.batch_size,), generator=generator)

    def step():
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step


def step_cost(framework: str) -> dict:
    """bench/one_replica_step.py for `framework`, in a process of its own."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "one_replica_step.py")
    print(f"bench: one-replica step of {framework}", file=sys.stderr, flush=True)
    done = subprocess.run(
        [sys.executable, script, framework], capture_output=True, text=True, check=True
    )
    # The JSON is the last line: DeepSpeed logs to stdout while it initializes.
    return json.loads(done.stdout.strip().splitlines()[-1])


def ray_against_ddp(settings: RunSettings, workers: int, work: str, rounds: int = 2) -> dict:
    """ray-train against torch-ddp at `workers` replicas: whole `trainscale run`s
    alternating, `rounds` rounds; the timed blocks' images/sec (medians over
    every block, and each round's ratio for the spread) and the whole run's
    wall time, where Ray's start-up shows."""
    runs = {"ray-train": [], "torch-ddp": []}
    for _ in range(rounds):
        for name in runs:
            output = os.path.join(work, f"{name}-{workers}.json")
            runs[name].append(run_framework(settings, name, output, replicas=workers))
            print(f"bench: {name} {workers} worker(s): {runs[name][-1]}", file=sys.stderr)

    def blocks(name):
        return [x for run in runs[name] for x in run["block_rates"]]

    def walls(name):
        return [run["wall_seconds"] for run in runs[name]]

    return {
        "ray_train_images_per_sec": median(blocks("ray-train")),
        "torch_ddp_images_per_sec": median(blocks("torch-ddp")),
        "ratio": median(blocks("ray-train")) / median(blocks("torch-ddp")),
        "ratio_interval_95": ratio_interval(blocks("ray-train"), blocks("torch-ddp")),
        # Each round's ratio (its two runs side by side): the spread between rounds.
        "round_ratios": [
            median(ray["block_rates"]) / median(ddp["block_rates"])
            for ray, ddp in zip(runs["ray-train"], runs["torch-ddp"])
        ],
        "ray_train_wall_seconds": median(walls("ray-train")),
        "torch_ddp_wall_seconds": median(walls("torch-ddp")),
        "wall_ratio": median(walls("ray-train")) / median(walls("torch-ddp")),
        "ray_startup": [run["record"].get("ray") for run in runs["ray-train"]],
        "samples": runs,
    }


def ray_train_rows(settings: RunSettings, work: str, workers=(1, 2), rounds: int = 2) -> dict:
    return {n: ray_against_ddp(settings, n, work, rounds) for n in workers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--only", choices=["ray-train"], help="one part: ray-train against torch-ddp"
    )
    parser.add_argument(
        "--ray-workers", type=int, nargs="+", default=[1, 2], help="ray-train's worker counts"
    )
    parser.add_argument(
        "--ray-rounds", type=int, default=2, help="alternating ray-train/torch-ddp pairs"
    )
    args = parser.parse_args()

    measure = dict(warmup_steps=2, blocks=4, steps_per_block=8, device=args.device)
    results: dict = {}
    work = tempfile.mkdtemp(prefix="trainscale-torch-bench-")
    rounds = 3 * args.repeats

    def settings_for(model):
        return RunSettings(
            framework="torch-single", model=model, batch_size=32, image_size=32,
            dataset="synthetic", **measure,
        )  # fmt: skip

    synthetic = RunSettings(
        framework="torch-single", model="vgg16", batch_size=32, image_size=32,
        dataset="synthetic", **{**measure, "blocks": 8},
    )  # fmt: skip
    if args.only == "ray-train":
        rows = ray_train_rows(synthetic, work, args.ray_workers, args.ray_rounds)
        json.dump({"ray_train_vs_ddp": rows}, sys.stdout, indent=2)
        return
    # Both steps return the loss on the device; a block ends by reading the
    # last one, as the harness's blocks do.
    results["harness_vs_plain_loop"] = harness_against(
        "plain_loop",
        lambda settings: (harness_step(settings), plain_step(settings)),
        settings_for,
        rounds,
    )

    # torch-single first: every ratio is against it.
    frameworks = tuple(spec.name for spec in REGISTRY if spec.ecosystem == "torch")
    results["one_replica"] = one_replica_each(synthetic, frameworks, work)
    # ray-train's step is torch-ddp's (the same backend in a Ray worker): in one
    # process there is nothing of Ray's to measure.
    stepped = [name for name in frameworks[1:] if name != "ray-train"]
    results["one_replica_step"] = {name: step_cost(name) for name in stepped}
    results["ray_train_vs_ddp"] = ray_train_rows(synthetic, work, args.ray_workers, args.ray_rounds)
    results["settings"] = {"model": "vgg16/small_cnn", "batch_size": 32, "image_size": 32}
    results["settings"].update(measure)
    results["torch"] = torch.__version__
    json.dump(results, sys.stdout, indent=2)


if __name__ == "__main__":
    main()
