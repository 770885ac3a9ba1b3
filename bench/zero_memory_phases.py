"""Where a ZeRO stage's CPU memory goes, phase by phase (issue 33).

Two gloo ranks on this machine each build VGG-16 at 32x32, hand it to
deepspeed.initialize with the config trainscale's `deepspeed` framework
writes (trainscale.frameworks.torch.torch_deepspeed), and take three Adam
steps on synthetic images. After each phase, rank 0 reads three things:

- live: the bytes of every tensor storage Python can reach (gc), counted once
  per storage: the training state and DeepSpeed's buffers;
- rss: its resident memory after malloc_trim(0) has handed glibc's free
  pages back, so what is left is live tensors plus libraries (--no-trim
  leaves them, as a trainscale run does);
- peak: VmHWM, the peak resident memory trainscale's records hold.

    .venv-torch/bin/python bench/zero_memory_phases.py 0 3
    .venv-torch/bin/python bench/zero_memory_phases.py 3 --reduce-bucket 1000000

prints one table per stage. The peak minus the trimmed rss at its phase is
memory glibc kept after DeepSpeed freed it; the live column says which
phase's tensors the rest is.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import re
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainscale.core.ports import free_ports
from trainscale.frameworks.torch.torch_models import build_torch_model

MIB = 2**20


def status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        return int(re.search(rf"^{field}:\s+(\d+) kB", status.read(), re.M).group(1))


def live_tensor_bytes() -> int:
    """Bytes of the distinct storages of every tensor the garbage collector
    sees (allocated, not necessarily touched: an untouched page is not resident)."""
    storages = {}
    warnings.simplefilter("ignore")  # torch warns on touching deprecated objects
    for obj in gc.get_objects():
        try:
            if torch.is_tensor(obj) and obj.device.type == "cpu":
                storage = obj.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
        except (RuntimeError, ReferenceError):  # a meta or freed tensor
            continue
    return sum(storages.values())


def measure(phase: str, rows: list, trim: bool) -> None:
    gc.collect()
    live = live_tensor_bytes()
    peak = status_kib("VmHWM") * 1024  # before the trim, which cannot lower it
    if trim:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    rows.append((phase, live / MIB, status_kib("VmRSS") * 1024 / MIB, peak / MIB))


def config(stage: int, reduce_bucket: int, batch: int, world: int) -> dict:
    """What torch_deepspeed.DeepSpeed.build writes, at DeepSpeed's defaults but
    the reduce bucket."""
    return {
        "train_micro_batch_size_per_gpu": batch,
        "train_batch_size": batch * world,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": stage, "reduce_bucket_size": reduce_bucket},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**31 - 1,
    }


def rank_main(rank: int, world: int, port: int, args, queue) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )  # fmt: skip
    torch.manual_seed(0)
    import deepspeed

    dist.init_process_group("gloo")
    deepspeed.init_distributed(dist_backend="gloo")
    rows: list = []
    measure("started", rows, args.trim)
    model = build_torch_model("vgg16", 32, 10)
    measure("model built", rows, args.trim)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=optimizer,
        config=config(args.stage, args.reduce_bucket, args.batch, world),
    )  # fmt: skip
    del model, optimizer
    measure("deepspeed.initialize", rows, args.trim)
    images, labels = torch.randn(args.batch, 3, 32, 32), torch.randint(0, 10, (args.batch,))
    for step in range(1, 4):
        loss = torch.nn.functional.cross_entropy(engine(images), labels)
        measure(f"step {step}: forward", rows, args.trim)
        engine.backward(loss)
        del loss
        measure(f"step {step}: backward", rows, args.trim)
        engine.step()
        measure(f"step {step}: optimizer step", rows, args.trim)
    if rank == 0:
        queue.put(rows)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stages", type=int, nargs="+", choices=(0, 1, 2, 3))
    parser.add_argument("--reduce-bucket", type=int, default=500_000_000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument(
        "--no-trim", dest="trim", action="store_false",
        help="leave glibc's free pages resident, as in a trainscale run",
    )  # fmt: skip
    args = parser.parse_args()
    parameters = sum(p.numel() for p in build_torch_model("vgg16", 32, 10).parameters())
    print(f"VGG-16 at 32x32: {parameters:,} parameters, {parameters * 4 / MIB:.0f} MiB in fp32")
    context = mp.get_context("spawn")
    for stage in args.stages:
        args.stage = stage
        queue = context.Queue()
        port = free_ports(1)[0]
        ranks = [context.Process(target=rank_main, args=(r, 2, port, args, queue)) for r in (0, 1)]
        for process in ranks:
            process.start()
        rows = queue.get()
        for process in ranks:
            process.join()
        trimmed = "trimmed" if args.trim else "untrimmed"
        print(f"\nZeRO-{stage}, reduce bucket {args.reduce_bucket:,}, rank 0 of 2, MiB")
        print(f"| phase | live tensors | rss ({trimmed}) | peak |\n|---|---:|---:|---:|")
        for phase, live, rss, peak in rows:
            print(f"| {phase} | {live:.0f} | {rss:.0f} | {peak:.0f} |")


if __name__ == "__main__":
    main()
