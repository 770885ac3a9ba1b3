"""A study's systems table and figure (the `system` axis): the same points on
each node type the cluster defines (cluster.systems), side by side, seed
004's two Titan RTX against four V100 per node.

tables/systems.{csv,md,tex}: a row per framework, model, batch, data set,
node count, GPUs per node and system: the system's partition and device
facts as the study declares them, images/sec and its ratio to the first
system of the grid on the same point, and the MFU: the run's own where its
device is in trainscale.harness.flops.PEAK_TFLOPS, else its achieved TFLOP/s
against the system's declared peak (peak_tflops) for the arithmetic it ran.
Accuracy-mode records add their training time and final test accuracy.
figures/systems.{png,pdf}: images/sec, one bar per system, grouped by point.
"""

from __future__ import annotations

import pandas as pd

from trainscale.analysis.containers_report import plot_bars
from trainscale.analysis.outputs import SYSTEMS
from trainscale.core.records import read_record

# What makes two runs the same point but for the system.
SHAPE = ["framework", "model", "batch_size", "dataset", "nodes", "gpus_per_node"]


def _mfu(record: dict, system: dict) -> tuple[float | None, str]:
    """The record's MFU, or its achieved TFLOP/s over the system's declared
    peak for its arithmetic; and which of the two it is."""
    if record.get("mfu") is not None:
        return record["mfu"], "run's device"
    achieved = record.get("achieved_tflops")
    peak = (system.get("peak_tflops") or {}).get(record.get("peak_precision") or "")
    if achieved and peak:
        return achieved / (peak * record["nodes"] * record["gpus_per_node"]), "system's peak"
    return None, ""


def _row(record: dict, systems: dict) -> dict:
    name = record["settings"].get("system", "")
    system = systems.get(name, {})
    mfu, basis = _mfu(record, system)
    accuracy = record.get("mode") == "accuracy"
    return {
        **{column: record.get(column) for column in SHAPE},
        "gpus": record["nodes"] * record["gpus_per_node"],
        "system": name,
        "partition": system.get("partition") or "",
        "gpu_model": system.get("gpu_model") or "",
        "device_memory_gib": system.get("device_memory_gib"),
        "images_per_sec": record["images_per_sec"]["mean"],
        "mfu": mfu,
        "mfu_basis": basis,
        "training_seconds": record.get("training_seconds") if accuracy else None,
        "final_test_accuracy": record.get("final_test_accuracy"),
        "hosts": ",".join(sorted(set(record.get("provenance", {}).get("hosts") or []))),
    }


def systems_table(records: list[dict], systems: dict, order: list[str]) -> pd.DataFrame:
    """A row per point and system, of the ok records (repeats averaged), in
    the grid's order of systems, with each point's ratio to the first."""
    rows = pd.DataFrame([_row(r, systems) for r in records if r["status"] == "ok"])
    if rows.empty:
        return rows
    numeric = ["images_per_sec", "mfu", "training_seconds", "final_test_accuracy"]
    rows[numeric] = rows[numeric].apply(pd.to_numeric)
    first = [c for c in rows.columns if c not in numeric]
    rows = rows.groupby(first, dropna=False, sort=False)[numeric].mean().reset_index()
    rank = {name: i for i, name in enumerate(order)}
    rows["rank"] = rows["system"].map(lambda name: rank.get(name, len(rank)))
    rows = rows.sort_values([*SHAPE, "rank"]).reset_index(drop=True)
    baseline = rows.groupby(SHAPE, dropna=False)["images_per_sec"].transform("first")
    rows["of_first_system"] = rows["images_per_sec"] / baseline
    return rows.drop(columns=["rank"])


LABELS = {
    "batch_size": "batch per GPU",
    "gpus_per_node": "GPUs per node",
    "gpu_model": "GPU (GRES type)",
    "device_memory_gib": "device memory (GiB)",
    "images_per_sec": "images/sec",
    "of_first_system": "÷ first system",
    "mfu": "MFU",
    "mfu_basis": "MFU against",
    "training_seconds": "training (s)",
    "final_test_accuracy": "test accuracy",
    "hosts": "nodes it ran on",
}


def write_systems(records: list[str], config: dict, folder: str, figures: list[str]) -> None:
    """tables/systems.* into `folder` and the figure to `figures`, from run
    records and the study's config (its cluster.systems and grid)."""
    from trainscale.analysis.rendering import write_table

    systems = (config.get("cluster") or {}).get("systems") or {}
    # Only a grid axis gives a study two systems (study_outputs.systems).
    order = list(config["grid"].get("system", []))
    table = systems_table([read_record(path) for path in records], systems, order)
    caption = (
        "Systems: the same points on each node type (cluster.systems), the "
        "ratio to the grid's first system, and the nodes SLURM ran each on"
    )
    empty = [c for c in table.columns if table[c].isna().all() or (table[c] == "").all()]
    shown = table.drop(columns=["gpus", *empty], errors="ignore")
    write_table(shown, folder, SYSTEMS, caption, LABELS, data=table)
    plot_bars(table, "system", figures, "Training throughput by system")
