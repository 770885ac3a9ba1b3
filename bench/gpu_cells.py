"""One cell of the GPU check (bench/gpu_check.py): the harness's step and
the plain PyTorch loop, side by side in this process, and what the cell's
row reports. Imports torch; the driver does not.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from common import median, ratio_interval

from trainscale.catalogue.options import RunOptions
from trainscale.catalogue.registry import framework_spec
from trainscale.catalogue.settings import RunSettings
from trainscale.core.gpu_monitor import GpuMonitor, nvml_monitor
from trainscale.core.imagenet import IMAGENET_LIKE_SIDES, generate_imagenet, generated_marker
from trainscale.core.ports import free_ports
from trainscale.frameworks import backend_class
from trainscale.frameworks.torch.torch_models import batch_norms, build_torch_model
from trainscale.harness.flops import utilisation
from trainscale.harness.training import device_name

_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def this_device(device: str) -> dict:
    """What the cells ran on: the device, torch, CUDA and the driver."""
    from gpu_check import device_name

    found = {"device": device, "torch": torch.__version__, "python": sys.version.split()[0]}
    if device != "gpu":
        return {**found, "name": device_name(device)}
    properties = torch.cuda.get_device_properties(0)
    monitor = nvml_monitor()
    return {
        **found,
        "name": device_name(device),
        "torch_name": torch.cuda.get_device_name(0),
        "total_memory_bytes": properties.total_memory,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "nvml": monitor.source if isinstance(monitor, GpuMonitor) else monitor,
    }


def release() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def measure_cell(cell, size: dict, args) -> dict:
    """The cell's row; an out-of-memory is the row's status, not an error."""
    settings = cell_settings(cell, size, args.device)
    try:
        if cell.imagenet:
            settings = dataclasses.replace(settings, data_dir=imagenet_tree(args.data_dir, size))
        if cell.record:
            return whole_run(settings)
        return compare(cell.framework, settings, size)
    except (torch.cuda.OutOfMemoryError, MemoryError) as err:
        return {"status": "oom", "error": str(err).strip().splitlines()[0]}
    except Exception as err:  # the cell's failure is its result; the next cell goes on
        return {"status": "failed", "error": f"{type(err).__name__}: {err}"[:2000]}


def imagenet_tree(folder: str, size: dict) -> str:
    """The decoded-input cells' JPEG tree, generated once: at ImageNet's sides
    on a GPU (what decoding costs there), small ones at the tiny sizes."""
    shape = size["imagenet"]
    if not os.path.exists(generated_marker(folder)):
        sides = {"sides": IMAGENET_LIKE_SIDES} if shape["imagenet_sides"] else {}
        generate_imagenet(folder, classes=shape["classes"], per_class=shape["per_class"], **sides)
    return folder


def cell_settings(cell, size: dict, device: str) -> RunSettings:
    """The cell's settings, as `trainscale train` parses its command line."""
    from trainscale.cli import parse

    text = cell.model.startswith("gpt")
    shape = (
        ["--seq-len", str(size["seq_len"])] if text else ["--image-size", str(size["image_size"])]
    )
    if text and size.get("vocab"):
        shape += ["--vocab-size", str(size["vocab"])]
    _, settings, _ = parse([
        "train", "--framework", cell.framework, "--model", cell.model,
        "--batch-size", str(cell.batch), *shape, "--dataset", "synthetic", "--device", device,
        "--precision", cell.precision, "--warmup-steps", str(size["warmup"]), "--blocks", "3",
        "--steps-per-block", str(max(2, size["warmup"])), *cell.options,
    ])  # fmt: skip
    return settings


# ---------------------------------------------------------------------------
# The harness against the plain loop
# ---------------------------------------------------------------------------


def compare(framework: str, settings: RunSettings, size: dict) -> dict:
    """Both steps warmed up, then blocks of each interleaved for size's rounds."""
    gpu = settings.device == "gpu"
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    backend = prepared(settings)
    try:
        for _ in range(settings.warmup_steps):
            loss = backend.step()
        backend.read_loss(loss)
        # The harness's own peak, before the plain loop's model joins it.
        peak = backend.peak_memory()
        plain = plain_step(framework, settings, backend)
        for _ in range(settings.warmup_steps):
            plain_loss = plain()
        float(plain_loss)
        steps = steps_per_block(backend, size["block_seconds"])
        harness_blocks, plain_rates = [], []
        for _ in range(size["rounds"]):
            harness_blocks.append(timed_block(backend.step, backend.read_loss, steps, gpu))
            plain_rates.append(timed_block(plain, float, steps, False)[0])
        return row(backend, settings, steps, harness_blocks, plain_rates, peak)
    finally:
        backend.close()


def prepared(settings: RunSettings):
    """The framework's backend, prepared as `trainscale train` prepares one
    rank; a framework of ranks joins a world of one (NCCL on a GPU)."""
    os.environ.update(
        RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_ports(1)[0]),
    )  # fmt: skip
    backend = backend_class(settings.framework)(settings, RunOptions())
    backend.prepare()
    return backend


def steps_per_block(backend, block_seconds: float) -> int:
    """Steps that make a block of about `block_seconds` (at least 2), from 3 timed steps."""
    start = time.perf_counter()
    for _ in range(3):
        loss = backend.step()
    backend.read_loss(loss)
    step = (time.perf_counter() - start) / 3
    return max(2, min(200, round(block_seconds / step)))


def timed_block(step, sync, steps: int, monitored: bool) -> tuple[float, dict | None]:
    """Examples/sec of `steps` steps ended by a sync, and NVML's view of them."""
    monitor = nvml_monitor(interval=0.05) if monitored else None
    monitor = monitor.start() if isinstance(monitor, GpuMonitor) else None
    start = time.perf_counter()
    for _ in range(steps):
        loss = step()
    sync(loss)
    seconds = time.perf_counter() - start
    return steps / seconds, monitor.stop() if monitor else None


def row(backend, settings, steps, harness_blocks, plain_rates, peak) -> dict:
    batch = settings.batch_size
    harness = [rate * batch for rate, _ in harness_blocks]
    plain = [rate * batch for rate in plain_rates]
    rate = median(harness)
    name = device_name(backend)
    monitored = [summary for _, summary in harness_blocks if summary]
    # Energy over the harness's blocks alone, per example they trained.
    joules = sum(s["energy_joules"] or 0 for s in monitored) if monitored else None
    examples = sum(batch * steps for _ in harness_blocks)
    per_example = joules / examples if joules else None
    tokens = settings.seq_len if settings.is_text else 0
    return {
        "status": "ok",
        "images_per_sec": None if tokens else rate,
        "tokens_per_sec": rate * tokens if tokens else None,
        "plain_loop_per_sec": median(plain) * (tokens or 1),
        "harness_over_plain": rate / median(plain),
        "harness_over_plain_interval_95": ratio_interval(harness, plain),
        "steps_per_block": steps,
        "blocks_each": len(harness),
        # Whether float32 may run on tensor cores; peak_precision says which counted.
        "tf32": {
            "cudnn_convolutions": torch.backends.cudnn.allow_tf32,
            "matmuls": torch.backends.cuda.matmul.allow_tf32,
        },
        **utilisation(rate, backend.training_flops_per_image(), 1, name, backend.peak_precision()),
        "peak_memory_bytes": peak["bytes"],
        "peak_memory_source": peak["source"],
        "nvml_memory_used_peak_bytes": max(
            (s["memory_used_bytes"]["peak"] for s in monitored), default=None
        ),
        "device_memory_bytes": backend.memory_capacity()["bytes"],
        "utilisation_percent": median([s["utilisation_percent"]["mean"] for s in monitored])
        if monitored
        else None,
        "energy_joules": joules,
        "energy_per_image_joules": None if tokens else per_example,
        "energy_per_token_joules": per_example / tokens if tokens and per_example else None,
        "block_rates": {"harness": harness, "plain": plain},
    }


# ---------------------------------------------------------------------------
# The plain loops: what a user writes for each framework
# ---------------------------------------------------------------------------


def plain_step(framework: str, settings: RunSettings, backend):
    """One step of the loop a PyTorch user writes for `framework`, on the
    same model, batch and precision. torch-single's trains the harness's own
    module and optimizer (one model's memory: the GPT ladder's largest still
    fits); the others build a model of their own, as their tutorials do."""
    device = backend.device
    inputs, labels = plain_batch(settings, device)
    dtype = _AUTOCAST.get(settings.precision)
    # A high-level API's (Lightning's) against the custom loop it replaces.
    framework = framework_spec(framework).replaces or framework
    if framework == "torch-single":
        model, optimizer = backend.model, backend.optimizer
    else:
        model, optimizer = wrapped_model(framework, settings, device, backend.framework_config())
        if framework == "deepspeed" and dtype is not None:
            inputs = inputs.to(dtype)  # the engine holds the model in bf16
    autocast = dtype is not None and framework in ("torch-single", "torch-ddp")

    def step():
        x = inputs.to(device, non_blocking=True)
        y = labels.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype, enabled=autocast):
            logits = model(x)
        loss = F.cross_entropy(logits.float().flatten(0, -2), y.flatten())
        if framework == "deepspeed":
            model.backward(loss)
            model.step()
        else:
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return loss.detach()

    return step


def plain_batch(settings: RunSettings, device):
    """Random inputs and labels in host memory (page-locked on a GPU), copied
    to the device every step, as a DataLoader's batches are."""
    generator = torch.Generator().manual_seed(settings.seed)
    b = settings.batch_size
    if settings.is_text:
        inputs = torch.randint(0, settings.vocab_size, (b, settings.seq_len), generator=generator)
        labels = torch.randint(0, settings.vocab_size, (b, settings.seq_len), generator=generator)
    else:
        s = settings.image_size
        inputs = torch.randn((b, 3, s, s), generator=generator)
        if settings.channels_last:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        labels = torch.randint(0, settings.num_classes, (b,), generator=generator)
    if device.type == "cuda":
        inputs, labels = inputs.pin_memory(), labels.pin_memory()
    return inputs, labels


def wrapped_model(framework: str, settings: RunSettings, device, harness_config: dict):
    """(model, optimizer) for DDP, FSDP2 or DeepSpeed, over the process group
    the harness's backend joined; DeepSpeed's at the harness's ZeRO stage."""
    torch.manual_seed(settings.seed)
    module = build_torch_model(settings.model, settings.image_size, settings.num_classes,
                               seq_len=settings.seq_len).to(device)  # fmt: skip

    def adam(parameters):
        return torch.optim.Adam(parameters, lr=settings.learning_rate, eps=1e-7)

    if framework == "torch-ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        model = DistributedDataParallel(module, device_ids=ids)
        return model, adam(model.parameters())
    if framework == "torch-fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=_AUTOCAST.get(settings.precision),
                                      reduce_dtype=torch.float32)  # fmt: skip
        mesh = init_device_mesh(device.type, (1,))
        if policy.param_dtype is not None:  # batch norms apart, in float32 (torch_fsdp)
            for norm in batch_norms(module):
                fully_shard(norm, mesh=mesh, mp_policy=MixedPrecisionPolicy())
        for layer in module.children():
            if not isinstance(layer, FSDPModule) and any(True for _ in layer.parameters()):
                fully_shard(layer, mesh=mesh, mp_policy=policy)
        fully_shard(module, mesh=mesh, mp_policy=policy)
        return module, adam(module.parameters())
    import deepspeed

    stage = harness_config["deepspeed"]["zero_optimization"]["stage"]
    config = {
        "train_micro_batch_size_per_gpu": settings.batch_size,
        "train_batch_size": settings.batch_size,
        "gradient_clipping": 0.0,
        # The stage the harness's engine runs (its record's config says it).
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**31 - 1,
    }
    if settings.precision in _AUTOCAST:
        config[settings.precision] = {"enabled": True}
        if batch_norms(module):  # their buffers in bf16 too (torch_deepspeed)
            config["data_types"] = {"buffer_dtype": settings.precision}
    engine, optimizer, _, _ = deepspeed.initialize(
        model=module, optimizer=adam(module.parameters()), config=config
    )
    return engine, optimizer


# ---------------------------------------------------------------------------
# A whole run, through `trainscale run`
# ---------------------------------------------------------------------------


def whole_run(settings: RunSettings) -> dict:
    """`trainscale run` of the cell, one replica: the launcher, the record."""
    with tempfile.TemporaryDirectory(prefix="trainscale-gpu-check-") as folder:
        output = os.path.join(folder, "record.json")
        command = [sys.executable, "-m", "trainscale", "run", *settings.to_cli_args(),
                   "--output", output]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if not os.path.exists(output):
            return {"status": "failed", "error": f"exit {done.returncode}: {done.stderr[-1500:]}"}
        with open(output) as handle:
            record = json.load(handle)
    keep = (
        "status", "images_per_sec", "tokens_per_sec", "mfu", "achieved_tflops", "peak_precision",
        "peak_basis", "peak_memory_bytes", "peak_memory_source",
        "memory_capacity_per_replica_bytes", "gpu_utilisation", "gpu_monitor_note",
        "energy_per_image_joules", "energy_per_token_joules", "device_name",
        "seconds_to_first_timed_step", "step_time_ms", "collectives_per_step",
        "input_pipeline_images_per_sec", "input_bound",
    )  # fmt: skip
    return {key: record.get(key) for key in keep} | {"command": " ".join(command[1:])}
