"""The throughput definitions (trainscale.core.timing) on hand-made block times:
sums over processes, per-replica rates, the time budget."""

import numpy as np
import pytest

from trainscale.core.timing import BlockBudget, BlockTimes, mean_std


def test_totals_are_sums_over_processes_not_rank0_times_size():
    # Two processes, one replica each, 100 images per block. Process 1 is slow:
    # the honest total is the sum of the two rates, not 2 x rank 0's rate.
    blocks = BlockTimes(images_per_block=100, replicas_in_process=1, steps_per_block=10)
    assert blocks.local_rate(0.5) == 200.0
    assert blocks.add(0.5, [200.0, 100.0], [0.5, 1.0]) == 300.0
    assert blocks.add(0.25, [400.0, 200.0], [0.25, 0.5]) == 600.0
    summary = blocks.summary()
    assert summary["images_per_sec"]["samples"] == [300.0, 600.0]
    # Each process's own rates are kept: the totals are their sums.
    assert summary["process_images_per_sec"] == [[200.0, 400.0], [100.0, 200.0]]
    assert summary["images_per_sec"]["mean"] == 450.0
    assert summary["images_per_sec"]["std"] == pytest.approx(np.std([300, 600], ddof=1))
    assert summary["per_replica_images_per_sec"]["mean"] == 225.0
    assert summary["step_time_ms"]["p50"] == pytest.approx(37.5)
    assert summary["timed_seconds"] == 0.75
    # Every image counted once: each process's rate times its own seconds
    # (the writer's 0.5 s and 0.25 s would count only 300 of the 400).
    assert summary["timed_images"] == 400.0


def test_per_replica_divides_by_replicas_in_process():
    blocks = BlockTimes(images_per_block=400, replicas_in_process=4, steps_per_block=1)
    blocks.add(1.0, [400.0], [1.0])
    assert blocks.summary()["per_replica_images_per_sec"]["mean"] == 100.0


def test_single_block_has_zero_std():
    assert mean_std([5.0]) == {"mean": 5.0, "std": 0.0}


def _blocks_timed(budget: BlockBudget, seconds_per_block: float) -> int:
    while not budget.done_after(seconds_per_block):
        pass
    return budget.blocks


def test_without_a_budget_every_block_is_timed():
    assert _blocks_timed(BlockBudget(most=7), 100.0) == 7


def test_a_budget_stops_once_the_blocks_have_taken_it():
    # 1.0 s budget, 0.3 s blocks: the 4th block ends at 1.2 s, past the budget.
    assert _blocks_timed(BlockBudget(most=100, seconds=1.0), 0.3) == 4
    # A CPU 7x slower fits fewer blocks in the same time...
    assert _blocks_timed(BlockBudget(most=100, seconds=1.0), 2.1) == 2
    # ...but never fewer than two (a std needs two), nor more than `most`.
    assert _blocks_timed(BlockBudget(most=100, seconds=1.0), 50.0) == 2
    assert _blocks_timed(BlockBudget(most=3, seconds=100.0), 0.01) == 3
    assert _blocks_timed(BlockBudget(most=1, seconds=1.0), 0.01) == 1
