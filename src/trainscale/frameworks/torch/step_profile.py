"""torch's profiler around the one step run after the timed ones
(training._observe_one_step): the collectives the step runs (torch_distributed),
and with --tensor-memory the live tensor bytes at the step's peak, by what
they are. On a CPU a record's peak memory is the process's resident memory,
libraries and the C library's freed pages with it; this is the tensors."""

from __future__ import annotations


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
    timeline counts them, less the collectives' copies it never saw freed
    (close_collective_copies)."""
    from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, MemoryProfileTimeline

    names = [category.name.lower() if category else "unknown" for category in _CATEGORY_TO_INDEX]
    source = "torch profiler memory timeline, one step after the timed ones"
    try:
        timeline = MemoryProfileTimeline(profiler._memory_profile())
    except Exception as err:  # noqa: BLE001 - the run's own numbers stand without it
        # torch 2.13's timeline sometimes asserts "version mismatch" on a
        # rank of FSDP2 with activation checkpointing: the record says so,
        # the run goes on.
        first_line = f"{type(err).__name__}: {err}".splitlines()[0][:120]
        return {"bytes": None, "by_category": {}, "source": source, "error": first_line}
    collectives = [
        (event.start_ns(), event.start_ns() + event.duration_ns())
        for event in profiler.profiler.kineto_results.events()
        if event.name().startswith("c10d::")
    ]
    timeline.timeline = close_collective_copies(timeline.timeline, collectives)
    _, sizes = timeline._coalesce_timeline(str(device))
    # Each row: the bytes of each category at one instant, after a column of 0.
    peak = max(sizes, key=sum)
    return {
        "bytes": int(sum(peak)),
        "by_category": {name: int(size) for name, size in zip(names, peak[1:]) if size},
        "source": source,
    }


def close_collective_copies(timeline: list, collectives: list) -> list:
    """torch's memory timeline, (time, action, (key, version), bytes) in time
    order, with a free added at a collective's end for each tensor made
    inside it (`collectives`: their (start, end) times) that the timeline
    never saw freed: its storage made again, or alive at the end. Gloo's
    reduce-scatter clones its input and its worker thread often drops the
    last reference, which the profiler does not see; counted live to the
    end, such a copy of FSDP2's head gradient lifted a gpt-tiny rank's peak
    by its 12.87 MB once or twice, by the ranks' timing (bench/README.md).
    That call waits for its collective, so by its end the copy is done with;
    an async collective's copy would be freed early by this rule (DDP's and
    tensor parallelism's rows in the memory study read as before it)."""
    from torch.profiler._memory_profiler import Action

    def end_of_collective(time):
        return next((end for start, end in collectives if start <= time <= end), None)

    unfreed: dict = {}  # key: (collective's end, version, bytes) of a copy not seen freed
    frees = []
    for time, action, (key, version), size in timeline:
        if action == Action.CREATE:
            if key in unfreed:  # the allocator gave its storage out again
                end, last, made = unfreed.pop(key)
                frees.append((end, Action.DESTROY, (key, last), made))
            end = end_of_collective(time)
            if end is not None:
                unfreed[key] = (end, version, size)
        elif action == Action.DESTROY:
            unfreed.pop(key, None)
        elif action == Action.INCREMENT_VERSION and key in unfreed:
            end, _, made = unfreed[key]
            unfreed[key] = (end, version + 1, made)
    for key, (end, last, made) in unfreed.items():
        frees.append((end, Action.DESTROY, (key, last), made))
    # Stable: a free lands after what the timeline has at the same instant.
    return sorted([*timeline, *frees], key=lambda event: event[0])


def note_tensor_memory(backend, profiler) -> None:
    """The backend's tensor_memory from its profiled step, where --tensor-memory asks."""
    if backend.settings.tensor_memory:
        backend.tensor_memory = tensor_memory_at_peak(profiler, backend.device)
