"""An accuracy study's tables and figure, from its run records. pandas, no
TensorFlow, no torch. The definitions (the clock, a cell's time-to-target over
its repeats) are trainscale.core.accuracy's.

- accuracy.csv: one row per run (final test accuracy and loss, time and
  epochs to the target, training images/sec); curves.csv: one row per epoch
  of every run.
- tables/accuracy: per framework and GPU count, final accuracy and test loss,
  time-to-target with how many runs reached it, epochs-to-target, images/sec
  while training, and seed 003's memory used of the total and GPU utilisation.
- tables/ranks: per GPU count, each framework's rank by images/sec beside its
  rank by time-to-target ("faster per step is not always faster to the target").
- tables/accuracy_per_class: per framework and GPU count, the final test
  accuracy of each class (seed 003's "car 74 %, cat 36 %"): its lowest,
  median and highest class, and every class where there are at most 20.
- figures/accuracy: test accuracy against wall time, one line per framework
  and GPU count, the target as a dashed line.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from trainscale.analysis.outputs import ACCURACY, ACCURACY_PER_CLASS, RANKS, figure_files
from trainscale.analysis.rendering import write_table
from trainscale.analysis.tidy import add_series, record_row, series_label, series_order
from trainscale.core.accuracy import cell_time_to_target
from trainscale.core.records import read_record

CELL = ["model", "dataset", "image_size", "batch_size", "panel_knobs", "series", "gpus"]


def run_row(study: str, path: str, knob_axes: list | None = None) -> dict:
    """tidy's row of the run, and what an accuracy run adds to it."""
    record = read_record(path)
    accuracy = (
        "final_test_accuracy", "final_test_loss", "final_test_perplexity", "target_accuracy",
        "time_to_target_seconds", "epochs_to_target", "epochs_run", "training_seconds",
        "peak_learning_rate", "global_batch_size",
    )  # fmt: skip
    row = {**record_row(study, path, knob_axes), **{key: record.get(key) for key in accuracy}}
    # A record from before text models had its target in target_accuracy.
    row["target_metric"] = record.get("target_metric", "test_accuracy")
    row["target"] = record.get("target", record.get("target_accuracy"))
    # A list: per_class_table reads it; accuracy.csv, one row per run, does not.
    row["per_class"] = record.get("final_test_accuracy_per_class") or []
    row["class_names"] = record.get("test_class_names") or []
    return row


METRIC_LABELS = {"test_accuracy": "Test accuracy", "test_perplexity": "Validation perplexity"}


def study_target(runs: pd.DataFrame) -> tuple[str, float | None]:
    """The study's target metric, and its one target (None: none, or several)."""
    metrics = sorted(set(runs["target_metric"].dropna())) or ["test_accuracy"]
    targets = sorted({t for t in runs["target"].dropna() if t > 0})
    return metrics[0], targets[0] if len(targets) == 1 else None


def curve_rows(path: str, run: dict) -> list[dict]:
    keys = ("framework", "knobs", "gpus", "repeat", "model", "batch_size")
    return [{**{k: run[k] for k in keys}, **point} for point in read_record(path).get("curve", [])]


def accuracy_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: its runs' accuracy, time-to-target (MLPerf's rule) and rate."""
    rows = []
    ok = runs[runs["status"] == "ok"]
    for cell, group in ok.groupby(CELL, sort=False):
        times = [None if pd.isna(t) else float(t) for t in group["time_to_target_seconds"]]
        time = cell_time_to_target(times)
        accuracy = group["final_test_accuracy"].astype(float)
        rates = group["images_per_sec_mean"].astype(float)
        # One run has no spread: its cell shows the number alone.
        spread = len(group) > 1
        rows.append(
            {
                **dict(zip(CELL, cell, strict=True)),
                "framework": series_label(cell[CELL.index("series")]),
                "final_accuracy_mean": accuracy.mean(),
                "final_accuracy_std": accuracy.std(ddof=1) if spread else np.nan,
                "time_to_target_mean": time["mean"],
                "time_to_target_std": time["std"] if spread else np.nan,
                # Published runs may have had no target (seed 004).
                "reached": f"{time['reached']}/{time['runs']}"
                if (group["target"].fillna(0) > 0).any()
                else "no target",
                "epochs_to_target": group["epochs_to_target"].astype(float).mean(),
                "training_seconds": group["training_seconds"].astype(float).mean(),
                "images_per_sec_mean": rates.mean(),
                "images_per_sec_std": rates.std(ddof=1) if spread else np.nan,
                "final_test_loss": group["final_test_loss"].astype(float).mean(),
                **_memory_and_utilisation(group),
            }
        )
    table = pd.DataFrame(rows)
    return table if table.empty else _in_table_order(table)


def _memory_and_utilisation(group: pd.DataFrame) -> dict:
    """Seed 003's columns: a replica's memory used of what it had ("used /
    12288 MiB": on GPUs NVML's peak, as nvidia-smi shows it, else the
    allocator's; on CPUs the process's peak RSS of its share of the host),
    and the GPU's utilisation (NVML; none on CPUs)."""
    nvml = group["gpu_memory_peak_mib"].astype(float)
    used = nvml if nvml.notna().all() else group["peak_memory_per_replica_mib"].astype(float)
    total = group["memory_capacity_per_replica_mib"].astype(float).min()
    return {
        "memory_used_of_total": f"{used.max():.0f} / {total:.0f} MiB"
        if used.notna().any() and not np.isnan(total)
        else "",
        "gpu_utilisation_percent": group["gpu_utilisation_percent"].astype(float).mean(),
    }


def _in_table_order(table: pd.DataFrame) -> pd.DataFrame:
    """Cells by model, batch, panel and GPUs, then frameworks in the tables' order."""
    table = table.assign(order=[series_order(s) for s in table["series"]])
    table = table.sort_values(["model", "batch_size", "panel_knobs", "gpus", "order"])
    return table.drop(columns=["order"]).reset_index(drop=True)


# Every class a column of its own up to this many (CIFAR-10's, MNIST's); beyond
# (CIFAR-100's), the lowest, median and highest only.
CLASS_COLUMNS_UP_TO = 20


def per_class_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per cell whose records score each class: each class's final test
    accuracy, the mean over the cell's runs; which class is lowest and highest."""
    rows = []
    scored = runs[(runs["status"] == "ok") & (runs["per_class"].map(len) > 0)]
    for cell, group in scored.groupby(CELL, sort=False):
        # A class the test split lacks is None in its record: no accuracy.
        accuracies = [[np.nan if a is None else a for a in run] for run in group["per_class"]]
        mean = np.asarray(accuracies, dtype=float).mean(axis=0)
        lowest, highest = int(np.nanargmin(mean)), int(np.nanargmax(mean))
        names = class_names(group)
        row = {
            **dict(zip(CELL, cell, strict=True)),
            "framework": series_label(cell[CELL.index("series")]),
            "runs": len(group),
            "lowest_class": names[lowest],
            "lowest_accuracy": mean[lowest],
            "median_accuracy": float(np.nanmedian(mean)),
            "highest_class": names[highest],
            "highest_accuracy": mean[highest],
        }
        if len(mean) <= CLASS_COLUMNS_UP_TO:
            row.update({f"class {name}": value for name, value in zip(names, mean)})
        rows.append(row)
    table = pd.DataFrame(rows)
    if table.empty:  # records from before it, or a text model's
        return pd.DataFrame({"note": ["no record scores each class"]})
    return _in_table_order(table).drop(columns=["series"])


def class_names(runs: pd.DataFrame) -> list[str]:
    """The names the runs' records give their classes (the first that does),
    else the labels; a class's column and its rows say it."""
    named = [names for names in runs["class_names"] if len(names)]
    return list(named[0]) if named else [str(i) for i in range(len(runs["per_class"].iloc[0]))]


def ranks_table(cells: pd.DataFrame, clock: str = "time_to_target") -> pd.DataFrame:
    """Per GPU count (and panel): rank by images/sec beside rank by time-to-target,
    or (`clock` "training_seconds", a study without a target) by training time."""
    if cells.empty:
        return cells
    time = "time_to_target_mean" if clock == "time_to_target" else clock
    parts = []
    for _, group in cells.groupby(["model", "batch_size", "panel_knobs", "gpus"], sort=True):
        group = group.copy()
        rates = group["images_per_sec_mean"].astype(float)
        group["throughput_rank"] = rates.rank(ascending=False, method="min").astype(int)
        # A cell that never reached the target ranks after every one that did.
        times = group[time].astype(float).fillna(np.inf)
        group[f"{clock}_rank"] = times.rank(method="min").astype(int)
        same = group["throughput_rank"] == group[f"{clock}_rank"]
        group["same_rank"] = np.where(same, "yes", "no")
        parts.append(group)
    columns = [
        "model",
        "batch_size",
        "panel_knobs",
        "gpus",
        "framework",
        "images_per_sec_mean",
        "throughput_rank",
        time,
        *(["reached"] if clock == "time_to_target" else []),
        f"{clock}_rank",
        "same_rank",
    ]
    return pd.concat(parts)[columns].reset_index(drop=True)


def accuracy_figure(
    curves: pd.DataFrame, target: float | None, paths: list[str], metric: str = "test_accuracy"
) -> None:
    """The target's metric (test accuracy, or a text model's validation
    perplexity) against wall time (on the clock): one line per run."""
    from trainscale.analysis.plotting import LINESTYLES, finish, framework_style, panels_of

    fig, panels = panels_of(curves)
    # The framework's colour and marker (plotting.framework_style), a line style per GPU count.
    styles = {g: i for i, g in enumerate(sorted(set(curves["gpus"])))}
    keys = sorted({(series_order(s), s, g) for s, g in zip(curves["series"], curves["gpus"])})
    for ax, variant in panels:
        for _, series, gpus in keys:
            label = f"{series_label(series)}, {gpus} GPU{'s' if gpus > 1 else ''}"
            runs = variant[(variant["series"] == series) & (variant["gpus"] == gpus)]
            for repeat, run in runs.groupby("repeat"):
                ax.plot(
                    run["wall_seconds"],
                    run[metric],
                    **{**framework_style(series.partition(" ")[0]), "marker": "."},
                    linestyle=LINESTYLES[styles[gpus] % len(LINESTYLES)],
                    label=label if repeat == runs["repeat"].min() else None,
                )
        if target:
            ax.axhline(target, color="black", linewidth=0.8, linestyle=":", label="target")
        ax.set(xlabel="Wall time on the clock (s)", ylabel=METRIC_LABELS[metric])
        if metric == "test_accuracy":
            ax.set_ylim(0, 1)
        ax.set_xlim(left=0)
    finish(fig, panels, paths, f"{METRIC_LABELS[metric]} against training time")


def write_accuracy(
    study: str, records: list[str], folder: str, knob_axes: list | None = None
) -> pd.DataFrame:
    """accuracy.csv and curves.csv in `folder`; tables/accuracy, tables/ranks,
    tables/accuracy_per_class, figures/accuracy. `knob_axes`: the study's
    (tidy.record_knobs)."""
    from trainscale.core.records import atomic_write_text

    runs, curves = [], []
    for path in sorted(records):
        run = run_row(study, path, knob_axes)
        runs.append(run)
        curves += curve_rows(path, run)
    runs = add_series(pd.DataFrame(runs))
    per_run = runs.drop(columns=["per_class", "class_names"])
    atomic_write_text(os.path.join(folder, "accuracy.csv"), per_run.to_csv(index=False))
    curves = add_series(pd.DataFrame(curves, columns=[*curve_columns(), "knobs"]))
    atomic_write_text(os.path.join(folder, "curves.csv"), curves.to_csv(index=False))
    cells = accuracy_table(runs)
    tables = os.path.join(folder, "tables")
    metric, target = study_target(runs)
    targets = [t for t in runs["target"].dropna() if t > 0]
    if target and metric == "test_perplexity":
        aim = f"to validation perplexity {target:g}"
    else:
        aim = f"to {target:.0%} test accuracy" if target else "(no single target)"
    write_table(
        cells.drop(columns=["series"], errors="ignore"),
        tables,
        ACCURACY,
        f"Accuracy and time {aim} ({study})",
        ACCURACY_LABELS,
    )
    # Without a target, the time on the clock is the whole training time.
    clock = "time_to_target" if targets else "training_seconds"
    goal = aim if targets else "to the end of training (no target)"
    write_table(
        ranks_table(cells, clock),
        tables,
        RANKS,
        f"Faster per step is not always faster {goal} ({study})",
        ACCURACY_LABELS,
    )
    write_table(
        per_class_table(runs),
        tables,
        ACCURACY_PER_CLASS,
        f"Final test accuracy of each class ({study})",
        ACCURACY_LABELS,
    )
    accuracy_figure(curves, target, figure_files(folder, [ACCURACY]), metric)
    return per_run


def curve_columns() -> list[str]:
    return [
        "framework",
        "gpus",
        "repeat",
        "model",
        "batch_size",
        "epoch",
        "wall_seconds",
        "train_seconds",
        "images_per_sec",
        "train_loss",
        "test_loss",
        "test_accuracy",
        "test_perplexity",
        "learning_rate",
    ]


ACCURACY_LABELS = {
    "model": "Model",
    "dataset": "Data",
    "image_size": "Size",
    "batch_size": "Batch/GPU",
    "panel_knobs": "Knobs",
    "gpus": "GPUs",
    "framework": "Framework",
    "final_accuracy": "Final test accuracy",
    "time_to_target": "Time to target (s)",
    "reached": "Runs reaching it",
    "epochs_to_target": "Epochs to target",
    "training_seconds": "Training time (s)",
    "runs": "Runs",
    "note": "Note",
    "lowest_class": "Lowest class",
    "lowest_accuracy": "Lowest accuracy",
    "median_accuracy": "Median accuracy",
    "highest_class": "Highest class",
    "highest_accuracy": "Highest accuracy",
    "images_per_sec": "Images/sec training",
    "images_per_sec_mean": "Images/sec training",
    "throughput_rank": "Rank by images/sec",
    "time_to_target_mean": "Time to target (s)",
    "time_to_target_rank": "Rank by time to target",
    "training_seconds_rank": "Rank by training time",
    "same_rank": "Same rank",
    "final_test_loss": "Final test loss",
    "memory_used_of_total": "Memory used / total (per replica)",
    "gpu_utilisation_percent": "GPU utilisation (%)",
}
