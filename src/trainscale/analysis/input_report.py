"""A study's input-pipeline table and figure (seed 002's workload): each
point trained on decoded ImageNet files (core.imagenet) beside the same
point on synthetic images, and the pipeline's own rate.

tables/input_pipeline.{csv,md,tex}: a row per framework, model, batch, node
count, GPUs per node and data set read from files: its images/sec, the
same point's synthetic images/sec and the ratio (what decoding costs the
step), the decode-only rate the run measured after its timed blocks
(`input_pipeline_images_per_sec`: its processes' pipelines together, alone)
and whether it was input-bound (core.timing.INPUT_BOUND_RATIO).
figures/input_pipeline.{png,pdf}: images/sec, one bar per data set, grouped by point.
"""

from __future__ import annotations

import pandas as pd

from trainscale.analysis.containers_report import plot_bars
from trainscale.analysis.outputs import INPUT_PIPELINE
from trainscale.core.datasets import DATASETS
from trainscale.core.records import read_record

# What makes two runs the same point but for the data they read.
SHAPE = ["framework", "model", "batch_size", "image_size", "nodes", "gpus_per_node"]


def _row(record: dict) -> dict:
    return {
        **{column: record.get(column) for column in SHAPE},
        "gpus": record["nodes"] * record["gpus_per_node"],
        "dataset": record["dataset"],
        "loader_workers": record["settings"].get("loader_workers"),
        "images_per_sec": record["images_per_sec"]["mean"],
        "input_pipeline_images_per_sec": record.get("input_pipeline_images_per_sec"),
        "input_bound": record.get("input_bound"),
    }


def input_pipeline_table(records: list[dict]) -> pd.DataFrame:
    """A row per point and data set read from files, of the ok records
    (repeats averaged), with the point's synthetic rate beside it."""
    rows = pd.DataFrame([_row(r) for r in records if r["status"] == "ok"])
    if rows.empty:
        return rows
    numeric = ["images_per_sec", "input_pipeline_images_per_sec"]
    rows[numeric] = rows[numeric].apply(pd.to_numeric)
    first = [c for c in rows.columns if c not in [*numeric, "input_bound"]]
    grouped = rows.groupby(first, dropna=False, sort=False)
    # A point is input-bound if any of its repeats was.
    rows = grouped[numeric].mean().join(grouped["input_bound"].max()).reset_index()
    synthetic = rows[rows["dataset"] == "synthetic"].set_index(SHAPE)["images_per_sec"]
    decoded = rows[rows["dataset"].map(lambda name: DATASETS[name].streams)].copy()
    decoded["synthetic_images_per_sec"] = [
        synthetic.get(tuple(row[c] for c in SHAPE)) for _, row in decoded.iterrows()
    ]
    decoded["of_synthetic"] = decoded["images_per_sec"] / pd.to_numeric(
        decoded["synthetic_images_per_sec"]
    )
    order = [*SHAPE, "gpus", "dataset", "loader_workers", "images_per_sec",
             "synthetic_images_per_sec", "of_synthetic", "input_pipeline_images_per_sec",
             "input_bound"]  # fmt: skip
    return decoded[order].sort_values([*SHAPE, "dataset"]).reset_index(drop=True)


LABELS = {
    "batch_size": "batch per GPU",
    "image_size": "image side",
    "gpus_per_node": "GPUs per node",
    "loader_workers": "loader workers",
    "images_per_sec": "images/sec",
    "synthetic_images_per_sec": "synthetic images/sec",
    "of_synthetic": "÷ synthetic",
    "input_pipeline_images_per_sec": "decode only (images/sec)",
    "input_bound": "input-bound",
}


def write_input_pipeline(records: list[str], folder: str, figures: list[str]) -> None:
    """tables/input_pipeline.* into `folder` and the figure to `figures`, from run records."""
    from trainscale.analysis.rendering import write_table

    loaded = [read_record(path) for path in records]
    table = input_pipeline_table(loaded)
    caption = (
        "Input pipeline: each point on decoded ImageNet files beside the same point on "
        "synthetic images, and the pipeline's own rate, measured alone after the timed blocks"
    )
    write_table(table.drop(columns=["gpus"]), folder, INPUT_PIPELINE, caption, LABELS, data=table)
    every = [_row(r) for r in loaded if r["status"] == "ok"]
    plot_bars(pd.DataFrame(every), "dataset", figures, "Training throughput by input")
