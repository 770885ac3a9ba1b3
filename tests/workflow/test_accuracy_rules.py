"""The definitions of time-to-accuracy (trainscale.core.accuracy), on synthetic curves."""

import math

import numpy as np
import pytest

from trainscale.core.accuracy import (
    Target,
    cell_time_to_target,
    evaluation_shard,
    learning_rate,
    peak_learning_rate,
    time_to_target,
)

CURVE = [
    {"epoch": 1, "wall_seconds": 10.0, "test_accuracy": 0.50},
    {"epoch": 2, "wall_seconds": 21.0, "test_accuracy": 0.89},
    {"epoch": 3, "wall_seconds": 33.0, "test_accuracy": 0.90},
    {"epoch": 4, "wall_seconds": 44.0, "test_accuracy": 0.95},
]


def accuracy(value):
    return Target("test_accuracy", value)


def test_the_clock_stops_at_the_first_evaluation_at_or_above_the_target():
    assert time_to_target(CURVE, accuracy(0.90)) == (33.0, 3)  # "at or above": 0.90 counts
    assert time_to_target(CURVE, accuracy(0.93)) == (44.0, 4)  # not interpolated
    assert time_to_target(CURVE, accuracy(0.96)) == (None, None)  # never reached
    assert time_to_target(CURVE, accuracy(0.0)) == (None, None)  # no target


def test_a_text_models_clock_stops_at_the_first_perplexity_at_or_below_the_target():
    curve = [
        {"epoch": 1, "wall_seconds": 10.0, "test_perplexity": 9.0},
        {"epoch": 2, "wall_seconds": 20.0, "test_perplexity": 5.0},
        {"epoch": 3, "wall_seconds": 30.0, "test_perplexity": 4.0},
    ]
    perplexity = Target("test_perplexity", 5.0)
    assert not perplexity.higher_is_better
    assert time_to_target(curve, perplexity) == (20.0, 2)  # "at or below": 5.0 counts
    assert time_to_target(curve, Target("test_perplexity", 3.0)) == (None, None)


def test_five_or_more_runs_drop_the_fastest_and_slowest():
    cell = cell_time_to_target([30.0, 10.0, 31.0, 100.0, 29.0])
    assert cell["mean"] == pytest.approx(30.0) and cell["reached"] == 5
    assert cell["std"] == pytest.approx(1.0)
    # A run that never reached the target is the slowest, and is dropped...
    cell = cell_time_to_target([30.0, 10.0, 31.0, None, 29.0])
    assert cell["mean"] == pytest.approx(30.0) and cell["reached"] == 4
    # ...but two such runs leave one among those kept: the cell has no time.
    cell = cell_time_to_target([30.0, 10.0, None, None, 29.0])
    assert cell["mean"] is None and cell["reached"] == 3 and cell["runs"] == 5


def test_fewer_runs_average_all_and_only_if_all_reached():
    cell = cell_time_to_target([10.0, 12.0, 20.0])
    assert cell["mean"] == pytest.approx(14.0) and cell["std"] == pytest.approx(math.sqrt(28))
    assert cell["rule"] == "mean of all"
    assert cell_time_to_target([10.0, None])["mean"] is None
    assert cell_time_to_target([7.0]) == {
        "runs": 1, "reached": 1, "mean": 7.0, "std": 0.0, "rule": "mean of all"
    }  # fmt: skip


def test_learning_rate_scaling_and_warm_up():
    assert peak_learning_rate(0.1, 8, "none") == 0.1
    assert peak_learning_rate(0.1, 8, "linear") == pytest.approx(0.8)
    assert peak_learning_rate(0.1, 4, "sqrt") == pytest.approx(0.2)
    # Goyal et al.: from the unscaled rate to the scaled one, linearly, over the warm-up.
    assert learning_rate(0.1, 8, "linear", 2.0, 0.0) == pytest.approx(0.1)
    assert learning_rate(0.1, 8, "linear", 2.0, 1.0) == pytest.approx(0.45)
    assert learning_rate(0.1, 8, "linear", 2.0, 2.0) == pytest.approx(0.8)
    assert learning_rate(0.1, 8, "linear", 2.0, 5.5) == pytest.approx(0.8)
    assert learning_rate(0.1, 8, "linear", 0.0, 0.0) == pytest.approx(0.8)  # no warm-up


@pytest.mark.parametrize(("examples", "processes", "batch"), [(300, 2, 32), (10, 3, 4), (5, 8, 2)])
def test_every_test_example_is_counted_once_in_equal_batches(examples, processes, batch):
    shards = [evaluation_shard(examples, k, processes, batch) for k in range(processes)]
    lengths = {len(indices) for indices, _ in shards}
    assert len(lengths) == 1 and lengths.pop() % batch == 0  # same batches everywhere
    counted = np.concatenate([indices[weights == 1] for indices, weights in shards])
    assert sorted(counted.tolist()) == list(range(examples))
