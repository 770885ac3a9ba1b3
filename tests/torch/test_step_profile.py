"""The live tensor bytes a record's step peaked at (--tensor-memory): torch's
memory timeline, less the collectives' own copies it never saw freed.
Gloo's reduce-scatter clones its input, and its worker thread, which the
profiler does not watch, often drops the last reference: left in, such a
copy of FSDP2's head gradient lifted a gpt-tiny rank's peak by 12.87 MB once
or twice, by the ranks' timing. The memory study measures it for real
(tests/workflow/test_sharding_study.py); this is the correction's rule on
timelines whose answer is known."""

from torch.profiler._memory_profiler import Action

from trainscale.frameworks.torch.step_profile import close_collective_copies

MB = 1_000_000
REDUCE_SCATTER = (10, 20)  # a collective's (start, end) times


def peak(timeline) -> int:
    """The most bytes live at once, as torch's timeline sums them."""
    live = most = 0
    for _, action, _, size in timeline:
        live += size if action in (Action.PREEXISTING, Action.CREATE) else 0
        live -= size if action == Action.DESTROY else 0
        most = max(most, live)
    return most


def test_a_collectives_copy_never_seen_freed_is_freed_at_its_end():
    timeline = [
        (-1, Action.PREEXISTING, ("weights", 0), 50 * MB),
        (12, Action.CREATE, ("clone", 0), 13 * MB),  # gloo's copy of the input
        (14, Action.INCREMENT_VERSION, ("clone", 0), 13 * MB),
        (30, Action.CREATE, ("gradient", 0), 13 * MB),  # the next unit's, later
        (40, Action.DESTROY, ("gradient", 0), 13 * MB),
    ]
    closed = close_collective_copies(timeline, [REDUCE_SCATTER])
    # Freed where its collective ends, at the version it had reached.
    assert (20, Action.DESTROY, ("clone", 1), 13 * MB) in closed
    assert [event[0] for event in closed] == sorted(event[0] for event in closed)
    assert peak(timeline) == 76 * MB and peak(closed) == 63 * MB


def test_a_copys_storage_made_again_frees_it_first_and_the_rest_is_kept():
    timeline = [
        (11, Action.CREATE, ("storage", 0), 13 * MB),  # in the collective
        (15, Action.CREATE, ("freed", 0), 6 * MB),  # in it, and seen freed
        (18, Action.DESTROY, ("freed", 0), 6 * MB),
        (25, Action.CREATE, ("kept", 0), 6 * MB),  # outside any collective
        (30, Action.CREATE, ("storage", 0), 13 * MB),  # the allocator's again
    ]
    closed = close_collective_copies(timeline, [REDUCE_SCATTER])
    added = [event for event in closed if event not in timeline]
    # One free, the first copy's; the second making of that storage was
    # outside a collective, and what the timeline saw freed or made
    # elsewhere is as it was.
    assert added == [(20, Action.DESTROY, ("storage", 0), 13 * MB)]
    assert peak(timeline) == 32 * MB and peak(closed) == 19 * MB
    assert close_collective_copies(timeline, []) == timeline
