"""An accuracy study through local Snakemake, for real, on the real digits.

Two frameworks (one of each ecosystem) on 1 and 2 CPU replicas train
seed 003's small CNN on scikit-learn's UCI digits, written as MNIST IDX files
by the workflow's own rule and read by the IDX reader, until a stated test
accuracy; the records hold their curves and the tables and figure follow.
TensorFlow's is Horovod's Keras API (horovod-fit): accuracy mode driving
Keras's fit epoch by epoch (a custom loop's is tests/harness/test_accuracy_mode.py's).
"""

import json
import os

import pandas as pd
import pytest
from conftest import run_study_in_a_copy

from trainscale.core.accuracy import Target, learning_rate, time_to_target
from trainscale.core.records import record_paths

TARGET = 0.85
EPOCHS = 12
STUDY = {
    "study": "digits-accuracy",
    "reference": None,
    "train_env": ".venv-train",
    "torch_env": ".venv-torch",
    "grid": {
        "framework": ["horovod-fit", "torch-ddp"],
        "nodes": [1],
        "gpus_per_node": [1, 2],
        "model": ["small_cnn"],
        "batch_size": [32],
    },
    "benchmark": {
        "mode": "accuracy",
        "dataset": "digits",
        "data_dir": "results/digits-accuracy/data",
        "image_size": 16,
        "device": "cpu",
        "epochs": EPOCHS,
        "target_accuracy": TARGET,
        "lr_scaling": "linear",
        "warmup_epochs": 2,
    },
}


@pytest.fixture(scope="module")
def study(run_store):
    return run_study_in_a_copy(run_store, STUDY, until=("accuracy",))


def _records(folder):
    # The records, not their timelines beside them (trainscale.core.faults).
    for path in record_paths(os.path.join(folder, "runs")):
        with open(path) as handle:
            yield json.load(handle)


@pytest.mark.slow
def test_every_run_reaches_the_target_and_records_its_curve(study):
    """Over a minute where the study runs first (its fixture): 4 runs train
    the real digits to 85 % test accuracy, up to 12 epochs each, one at a time."""
    records = list(_records(study))
    assert len(records) == 4
    for record in records:
        curve = record["curve"]
        assert record["status"] == "ok" and record["mode"] == "accuracy"
        assert record["dataset"] == "digits" and record["input_channels"] == 1
        assert record["test_examples"] == 300 and record["train_examples"] == 1497
        assert record["steps_per_epoch"] == 1497 // record["global_batch_size"]
        # Trained until the target, and not one epoch longer.
        assert record["final_test_accuracy"] >= TARGET
        assert all(p["test_accuracy"] < TARGET for p in curve[:-1])
        assert record["epochs_to_target"] == len(curve) <= EPOCHS
        assert record["training_seconds"] == curve[-1]["wall_seconds"]
        # The stated rule, applied to the recorded curve.
        assert (record["time_to_target_seconds"], record["epochs_to_target"]) == time_to_target(
            curve, Target("test_accuracy", TARGET)
        )
        # Each of the 10 digits scored on its own: the test split's 300
        # examples, and their correct ones the whole's accuracy.
        per_class = record["final_test_accuracy_per_class"]
        examples = record["test_examples_per_class"]
        assert len(per_class) == len(examples) == 10 and sum(examples) == 300
        assert record["test_class_names"] == [str(digit) for digit in range(10)]
        correct = sum(a * e for a, e in zip(per_class, examples, strict=True))
        assert correct / 300 == pytest.approx(record["final_test_accuracy"])
        walls = [p["wall_seconds"] for p in curve]
        assert walls == sorted(walls) and walls[0] > 0
        assert record["startup_seconds"] > 0  # off the clock


@pytest.mark.slow
def test_learning_rates_follow_the_scaling_and_warm_up(study):
    """Over a minute where it is the first to ask for the study (its fixture:
    4 runs to 85 % test accuracy, one at a time)."""
    for record in _records(study):
        replicas = record["replicas"]
        assert record["peak_learning_rate"] == pytest.approx(1e-3 * replicas)  # linear
        steps = record["steps_per_epoch"]
        for point in record["curve"]:
            # The rate of the epoch's last step: warm-up from 1e-3 over 2 epochs.
            done = point["epoch"] - 1 + (steps - 1) / steps
            expected = learning_rate(1e-3, replicas, "linear", 2.0, done)
            assert point["learning_rate"] == pytest.approx(expected)
        if replicas == 2:
            assert record["curve"][0]["learning_rate"] < record["peak_learning_rate"]


@pytest.mark.slow
def test_accuracy_tables_and_figure(study):
    """Over a minute where it is the first to ask for the study (its fixture)."""
    table = pd.read_csv(os.path.join(study, "tables", "accuracy.csv"))
    fit = "Horovod (Keras fit)"
    assert sorted(zip(table["framework"], table["gpus"])) == [
        (fit, 1), (fit, 2), ("PyTorch DDP", 1), ("PyTorch DDP", 2)
    ]  # fmt: skip
    assert (table["final_accuracy_mean"] >= TARGET).all() and set(table["reached"]) == {"1/1"}
    assert (table["time_to_target_mean"] > 0).all()
    # Seed 003's columns: the test loss, a replica's memory used of what it
    # had (on a CPU its peak RSS of its share of the host) and no GPU to use.
    assert (table["final_test_loss"] > 0).all() and table["gpu_utilisation_percent"].isna().all()
    for shown in table["memory_used_of_total"]:
        used, total = (float(part) for part in shown.removesuffix(" MiB").split(" / "))
        assert 0 < used < total
    ranks = pd.read_csv(os.path.join(study, "tables", "ranks.csv"))
    assert set(ranks["throughput_rank"]) == {1, 2} == set(ranks["time_to_target_rank"])
    # Each cell's classes: the mean of its one run's, lowest to highest.
    per_class = pd.read_csv(os.path.join(study, "tables", "accuracy_per_class.csv"))
    assert list(zip(per_class["framework"], per_class["gpus"])) == list(
        zip(table["framework"], table["gpus"])
    )
    names = {"horovod-fit": "Horovod (Keras fit)", "torch-ddp": "PyTorch DDP"}
    by_cell = {
        (names[r["framework"]], r["replicas"]): r["final_test_accuracy_per_class"]
        for r in _records(study)
    }
    for _, row in per_class.iterrows():
        expected = by_cell[row["framework"], row["gpus"]]
        assert [row[f"class {i}"] for i in range(10)] == pytest.approx(expected)
        assert row["lowest_accuracy"] == pytest.approx(min(expected))
        assert row["highest_accuracy"] == pytest.approx(max(expected))
        assert expected[row["lowest_class"]] == min(expected)
    curves = pd.read_csv(os.path.join(study, "curves.csv"))
    assert len(curves) == sum(len(r["curve"]) for r in _records(study))
    for ext in ("png", "pdf"):
        assert os.path.getsize(os.path.join(study, "figures", f"accuracy.{ext}")) > 1000
    with open(os.path.join(study, "tables", "accuracy.md")) as handle:
        markdown = handle.read()
    assert "to 85% test accuracy" in markdown
