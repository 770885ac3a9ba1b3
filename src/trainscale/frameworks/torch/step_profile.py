"""torch's profiler around the one step run after the timed ones
(training._observe_one_step): the collectives the step runs (torch_distributed),
and with --tensor-memory the live tensor bytes at the step's peak, by what
they are. On a CPU a record's peak memory is the process's resident memory,
libraries and the C library's freed pages with it; this is the tensors."""

from __future__ import annotations

import json
import os
import tempfile
import warnings


def step_profiler(settings):
    """The profiler for that step: shapes for the collectives; with
    --tensor-memory, memory and stacks too (torch's memory timeline sorts
    each tensor into its category from them)."""
    from torch.profiler import ProfilerActivity, profile

    memory = settings.tensor_memory
    activities = [ProfilerActivity.CPU]
    if memory and settings.device == "gpu":
        activities.append(ProfilerActivity.CUDA)
    return profile(
        activities=activities, record_shapes=True, profile_memory=memory, with_stack=memory
    )


def tensor_memory_at_peak(profiler, device) -> dict:
    """The live tensor bytes on `device` at the profiled step's peak, and by
    category there (parameter, optimizer_state, input, temporary,
    activation, gradient, autograd_detail, unknown), as torch's memory
    timeline counts them."""
    from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX

    names = [category.name.lower() if category else "unknown" for category in _CATEGORY_TO_INDEX]
    source = "torch profiler memory timeline, one step after the timed ones"
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "timeline.json")
        try:
            with warnings.catch_warnings():
                # Deprecated in torch 2.13 for a recorder of CUDA memory only.
                warnings.simplefilter("ignore", FutureWarning)
                profiler.export_memory_timeline(path, device=str(device))
        except Exception as err:  # noqa: BLE001 - the run's own numbers stand without it
            # torch 2.13's timeline sometimes asserts "version mismatch" on a
            # rank of FSDP2 with activation checkpointing: the record says so,
            # the run goes on.
            first_line = f"{type(err).__name__}: {err}".splitlines()[0][:120]
            return {"bytes": None, "by_category": {}, "source": source, "error": first_line}
        with open(path) as handle:
            _, sizes = json.load(handle)
    # Each row: the bytes of each category at one instant, after a column of 0.
    peak = max(sizes, key=sum)
    return {
        "bytes": int(sum(peak)),
        "by_category": {name: int(size) for name, size in zip(names, peak[1:]) if size},
        "source": source,
    }


def note_tensor_memory(backend, profiler) -> None:
    """The backend's tensor_memory from its profiled step, where --tensor-memory asks."""
    if backend.settings.tensor_memory:
        backend.tensor_memory = tensor_memory_at_peak(profiler, backend.device)
