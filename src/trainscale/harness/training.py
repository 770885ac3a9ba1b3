"""The timed benchmark loop and the record it writes, the same for every framework.

What differs between frameworks and ecosystems is behind trainscale.harness.backend;
this module imports neither TensorFlow nor torch.
"""

from __future__ import annotations

import os
import socket
import time

import numpy as np

from trainscale.catalogue.options import RunOptions
from trainscale.catalogue.settings import RunSettings
from trainscale.core import records
from trainscale.core.gpu_monitor import GpuMonitor, combine, nvml_monitor
from trainscale.core.heap import resume_collection
from trainscale.core.isolation import image_label
from trainscale.core.timing import (
    BlockBudget,
    BlockTimes,
    Stopwatch,
    energy_per_example,
    input_pipeline,
    token_rates,
)
from trainscale.harness.backend import Backend, require_cuda_devices
from trainscale.harness.epochs import train_epochs
from trainscale.harness.flops import utilisation
from trainscale.harness.progress import log, unit, who
from trainscale.harness.run_events import RunEvents


class OutOfMemory(Exception):
    """The device (or host) ran out of memory: a result of the grid point, not a crash."""


def process_age() -> float:
    """Seconds since this process started (interpreter start-up and imports included)."""
    try:
        with open("/proc/self/stat") as handle:
            start_ticks = int(handle.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as handle:
            uptime = float(handle.read().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def seconds_since_launch() -> float | None:
    """Seconds since `trainscale run` started this run's processes
    (records.LAUNCHED_AT): a container's own start is in it, where process_age
    begins inside the container. None where no launcher said (`train` alone)."""
    launched = os.environ.get(records.LAUNCHED_AT)
    return time.time() - float(launched) if launched else None


def device_name(backend: Backend) -> str:
    """What the replicas run on: the GPU's name as the driver gives it, or the CPU model."""
    if backend.settings.device == "gpu":
        return backend.gpu_name()
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def start_gpu_monitor(settings: RunSettings) -> GpuMonitor | str:
    """NVML sampling of this process's GPUs through the timed part; on a CPU
    run, or without NVML, the reason there is none."""
    if settings.device != "gpu":
        return "CPU run: no GPU to sample"
    monitor = nvml_monitor()
    return monitor.start() if isinstance(monitor, GpuMonitor) else monitor


def process_description(backend: Backend) -> dict:
    topology = backend.topology
    return {
        "process": topology.process_index,
        "host": socket.gethostname(),
        "devices": topology.devices,
        "replicas": topology.replicas_in_process,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        # Which image this process ran in (None: the bare host): every rank's.
        "image": (image_label() or {}).get("recipe_digest"),
        "peak_memory": backend.peak_memory(),
        "memory_capacity": backend.memory_capacity(),
        # Called after the timed blocks: decoding alone, nothing training beside it.
        "decode_only_images_per_sec": backend.decode_only_rate(),
    }


def train(settings: RunSettings, backend_class: type[Backend], options: RunOptions | None = None):
    """Run one process of a benchmark over the framework's `backend_class`
    (trainscale.frameworks.tensorflow.strategies.backend_class finds it); the chief writes the
    record. Returns it (or None).

    Raises OutOfMemory when the backend says the device ran out of memory.
    """
    options = options or RunOptions()
    clock = Stopwatch()
    started_at, created = records.utc_now(), time.time() - process_age()
    if options.expect_cuda_devices:
        require_cuda_devices(options.expect_cuda_devices)
    backend = backend_class(settings, options)
    events = None
    try:
        backend.prepare()
        resume_collection()  # the start-up's heap frozen (trainscale.core.heap)
        events = RunEvents(backend, options.output, created)
        initial_weights = backend.trainable_weights() if options.save_weights else None
        if settings.mode == "accuracy":
            backend.compile_untouched()
        # An elastic restart goes on from its saved state: no warm-up, its cost the recovery's.
        first_step = events.restore()
        loss_value = None
        if settings.mode != "accuracy":
            loss_value = float("nan") if first_step else _warm_up(backend, events)
        timing = _startup_timing(clock)
        monitor = start_gpu_monitor(settings)
        blocks, measured = _measure(backend, events, first_step, loss_value)
        gpu = monitor.stop() if isinstance(monitor, GpuMonitor) else monitor
        # Before the weights are gathered (a sharded framework's whole weights
        # would count in its peak memory).
        description = {**process_description(backend), "gpu_monitor": gpu}
        # Every process: a framework that shards the weights gathers them.
        final_weights = backend.trainable_weights() if options.save_weights else None
        description["tensor_memory"] = _observe_one_step(backend)
    except Exception as err:
        outcome = _outcome_of(backend, err)
        if outcome:
            raise outcome from err
        if events:
            events.failed(err)
        raise
    processes = backend.gather_json(description)
    if not backend.topology.is_chief:
        backend.close()
        return None
    measured.update(events.summary())
    record = _record(backend, blocks, processes, {**timing, **measured}, started_at)
    if options.output:
        records.atomic_write_json(options.output, record)
    if options.save_weights:
        _save_weights(options.save_weights, initial_weights, final_weights)
    backend.close()
    log(
        f"{who(settings)}: {record['images_per_sec']['mean']:.1f} ± "
        f"{record['images_per_sec']['std']:.1f} {unit(settings)} total over "
        f"{record['blocks']} blocks"
    )
    return record


def _outcome_of(backend: Backend, err: BaseException) -> Exception | None:
    """What `err` is to the run's record, if not a failure: out of memory,
    or a bad input file, named (its own line: a DataError)."""
    if backend.ran_out_of_memory(err):
        return OutOfMemory((str(err).strip().splitlines() or [type(err).__name__])[0])
    return backend.named_data_error(err)


def _startup_timing(clock: Stopwatch) -> dict:
    """How long the start took, as the timed part begins: since `clock` (this
    process's training code), since the process began, since the launch."""
    return {
        "startup_seconds": clock.elapsed(),
        "seconds_to_first_timed_step": process_age(),
        "seconds_from_launch_to_first_timed_step": seconds_since_launch(),
    }


def _measure(backend: Backend, events: RunEvents, first_step: int, loss_value):
    """The measured part, from `first_step`: epochs to the target in accuracy
    mode, else the timed blocks (after a warm-up that ended at `loss_value`);
    its BlockTimes and what the record says of it."""
    if backend.settings.mode == "accuracy":
        return backend.run_blocks(lambda step: train_epochs(backend, events, step), first_step)
    blocks, loss_value = backend.run_blocks(
        lambda step: _timed_blocks(backend, loss_value, events, step), first_step
    )
    return blocks, {"final_loss": loss_value}


def _tensor_memory(processes: list[dict]) -> dict:
    """--tensor-memory's live tensor bytes at the observed step's peak: the
    largest counted process's, and its categories ({} where none was
    observed); the processes the profiler could not count, and why."""
    observed = [p["tensor_memory"] for p in processes if p.get("tensor_memory")]
    if not observed:
        return {}
    counted = [memory for memory in observed if memory["bytes"] is not None]
    failed = [memory["error"] for memory in observed if memory["bytes"] is None]
    largest = max(counted, key=lambda memory: memory["bytes"], default=None)
    fields = {
        "peak_tensor_bytes": largest and largest["bytes"],
        "peak_tensor_bytes_by_category": largest and largest["by_category"],
    }
    if failed:  # where the profiler could not count them, its one line why
        fields["peak_tensor_bytes_error"] = f"{len(failed)} of {len(observed)}: {failed[0]}"
    return fields


def _observe_one_step(backend: Backend) -> dict | None:
    """One more step, untimed and after the final weights, under the backend's
    observer (collectives_per_step; and the tensor memory it returns, with
    --tensor-memory). Never before the timed blocks: torch's profiler leaves
    CUPTI attached when it ends (pytorch/pytorch#144455), and on an H200
    every later step of the same process ran about a sixth slower
    (bench/profiler_after_effect.py). Not in accuracy mode, whose steps are
    all the curve's."""
    if backend.settings.mode == "accuracy":
        return None
    if not backend.observes_a_step():
        return None  # this backend observes nothing: no step to spend
    with backend.observe_collectives():
        loss = backend.step()
    backend.read_loss(loss)
    return backend.tensor_memory


def _save_weights(path: str, initial: list, final: list) -> None:
    """The trainable weights before and after (--save-weights), as the tests read them."""
    arrays = {f"initial_{i}": w for i, w in enumerate(initial)}
    arrays.update({f"final_{i}": w for i, w in enumerate(final)})
    np.savez(path, **arrays)


def _warm_up(backend: Backend, events: RunEvents) -> float:
    """The untimed steps: tracing or compiling, and Horovod-TF's broadcast after step 1."""
    settings = backend.settings
    if backend.topology.is_chief:
        log(f"{who(settings)}: warm-up, {settings.warmup_steps} step(s)")
    for step in range(settings.warmup_steps):
        loss = backend.step()
        events.after_step(loss, 0)
        if step == 0:
            backend.after_first_step()
    return backend.read_loss(loss)


def _timed_blocks(
    backend: Backend, loss_value: float, events: RunEvents, first_step: int = 0
) -> tuple[BlockTimes, float]:
    """Time blocks of steps until `blocks` or the time budget, from the block
    of `first_step` (a restart's); returns them and the loss."""
    settings, topology = backend.settings, backend.topology
    blocks = BlockTimes(
        images_per_block=settings.batch_size
        * topology.replicas_in_process
        * settings.steps_per_block,
        replicas_in_process=topology.replicas_in_process,
        steps_per_block=settings.steps_per_block,
    )
    budget = BlockBudget(settings.blocks, settings.time_budget_seconds)
    events.timed_start(first_step)
    for block in range(first_step // settings.steps_per_block, settings.blocks):
        block_clock = Stopwatch()
        for step in range(block * settings.steps_per_block, (block + 1) * settings.steps_per_block):
            events.before_step(step)
            loss = backend.step()
            events.after_step(loss, step + 1)
        # Reading the loss waits for the last step: the device sync that ends
        # the block. Nothing else leaves the device inside the timed region.
        loss_value = backend.read_loss(loss)
        seconds = block_clock.elapsed()
        # Outside the timed region: every process's rate, loss share and seconds.
        gathered = backend.gather_rows(np.array([blocks.local_rate(seconds), loss_value, seconds]))
        total = blocks.add(seconds, gathered[:, 0], gathered[:, 2])
        images = round(blocks.images[-1])
        events.block_done(block, (block + 1) * settings.steps_per_block, images, seconds)
        if not backend.loss_is_global:
            loss_value = float(gathered[:, 1].sum())
        if topology.is_chief:
            log(
                f"{who(settings)}: block {block + 1}/{settings.blocks} "
                f"{total:.1f} {unit(settings)} total, {total / settings.replicas:.1f} per replica, "
                f"{seconds / settings.steps_per_block * 1000:.1f} ms/step, "
                f"loss {loss_value:.4f}"
            )
        if budget.done_after(float(gathered[:, 2].max())) and events.bounded_by_time:
            break
    return blocks, loss_value


def _record(
    backend: Backend, blocks: BlockTimes, processes: list, measured: dict, started_at: str
) -> dict:
    """The chief's record of the run: the summary of its blocks, MFU, memory, provenance."""
    settings, topology = backend.settings, backend.topology
    summary = blocks.summary()
    name = device_name(backend)
    return {
        **records.record_head(settings, "ok"),
        "replicas": topology.num_replicas,  # as the framework counted them
        "processes": topology.num_processes,
        **summary,
        **(token_rates(summary, settings.seq_len) if settings.is_text else {}),
        "device_name": name,
        "trainable_parameters": backend.trainable_parameters(),
        **utilisation(
            summary["images_per_sec"]["mean"],
            backend.training_flops_per_image(),
            topology.num_replicas,
            name,
            backend.peak_precision(),
        ),
        # startup_seconds: in the process (model build, tracing, warm-up).
        # seconds_to_first_timed_step: from process start (interpreter,
        # imports and rendezvous too), up to the first timed step;
        # seconds_from_launch_to_first_timed_step: from the launcher's start
        # of the processes (a container's start too).
        **measured,
        # Per replica, the largest: on GPUs the allocator's peak of the device
        # a replica runs on; on CPUs the peak of the process it runs in (the
        # replicas MirroredStrategy puts in one process share its peak).
        "peak_memory_bytes": max((p["peak_memory"]["bytes"] or 0) for p in processes) or None,
        "peak_memory_source": processes[0]["peak_memory"]["source"],
        # What a replica had to fit in: the smallest any process had.
        "memory_capacity_per_replica_bytes": min(
            (p["memory_capacity"]["bytes"] for p in processes if p["memory_capacity"]["bytes"]),
            default=None,
        ),
        **_tensor_memory(processes),
        **_gpu_monitored(processes, summary, settings),
        **input_pipeline(processes, summary["images_per_sec"]["mean"]),
        "framework_config": backend.framework_config(),
        # The collectives one step ran, where the backend observes them.
        **(
            {"collectives_per_step": backend.collectives_per_step}
            if backend.collectives_per_step
            else {}
        ),
        "source": "measured",
        "provenance": {
            **records.host_provenance(),
            **backend.software_versions(),
            "hosts": [p["host"] for p in processes],
            "processes": processes,
            "started_at": started_at,
            "finished_at": records.utc_now(),
        },
    }


def _gpu_monitored(processes: list, summary: dict, settings: RunSettings) -> dict:
    """NVML's view while it trained (trainscale.core.gpu_monitor): utilisation,
    memory and the energy per image (and token); null on CPUs, and
    gpu_monitor_note says why."""
    gpu = combine([p["gpu_monitor"] for p in processes if isinstance(p["gpu_monitor"], dict)])
    tokens_per_example = settings.seq_len if settings.is_text else 1
    return {
        "gpu_utilisation": gpu,
        **energy_per_example(gpu and gpu["energy_joules"], summary, tokens_per_example),
        "gpu_monitor_note": next(
            (p["gpu_monitor"] for p in processes if isinstance(p["gpu_monitor"], str)), None
        ),
    }
