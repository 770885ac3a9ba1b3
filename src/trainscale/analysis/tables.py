"""The study's tables: the paper's Table I and II, efficiency, the reference
study beside this one, and each torch framework beside its TensorFlow
counterpart. Each is built per panel (model, batch, shared knobs) from the
combined rows of trainscale.analysis.repeats, and written by trainscale.analysis.rendering.
"""

from __future__ import annotations

import pandas as pd

from trainscale.analysis.outputs import (
    CROSS_ECOSYSTEM,
    EFFICIENCY,
    TABLE1,
    TABLE2,
    VS_REFERENCE,
)
from trainscale.analysis.rendering import write_table
from trainscale.analysis.repeats import combine_repeats, ok_only, reference_combined
from trainscale.analysis.tidy import load_tidy, series_label, series_order
from trainscale.catalogue.registry import REGISTRY, table_order
from trainscale.catalogue.registry import label as framework_label
from trainscale.study.study import KNOB_AXES, join_knobs, parse_knobs


def _varies(frame: pd.DataFrame, column: str) -> bool:
    """Whether any row has knobs in `column`: only then do tables show it."""
    return bool(len(frame)) and bool(frame[column].astype(bool).any())


def _series_in(frame: pd.DataFrame) -> list[str]:
    return sorted(set(frame["series"]), key=series_order)


PANEL = ["model", "batch_size", "panel_knobs"]


def _per_panel(combined: pd.DataFrame, build) -> pd.DataFrame:
    """Build a table per (model, batch size, shared knobs) and stack them, those first.

    The paper's tables hold one model and batch; a study may have several, and
    knob axes every framework reads (precision, XLA). The knobs column is only
    there when the grid varies such knobs.
    """
    parts = []
    with_knobs = _varies(combined, "panel_knobs")
    for (model, batch_size, knobs), part in combined.groupby(PANEL, sort=True):
        table = build(part)
        if with_knobs:
            table.insert(0, "knobs", knobs)
        table.insert(0, "batch_size", batch_size)
        table.insert(0, "model", model)
        parts.append(table)
    if not parts:
        return pd.DataFrame(columns=PANEL[:2])
    return pd.concat(parts, ignore_index=True)


def table1(combined: pd.DataFrame, reference: pd.DataFrame | None = None) -> pd.DataFrame:
    """Frameworks on ONE node: rows = GPUs; `<series>_mean/_std` columns.

    A series is a framework, plus the knobs only it reads when the grid varies
    them. With a reference, `<series>_reference_mean` and `<series>_ratio`
    (measured / reference) follow each series whose framework the reference
    also has for the same model (the reference may differ in batch, data or
    device: its settings are in its records).
    """

    def build(part):
        one_node = part[part["nodes"] == 1]
        model = part["model"].iloc[0]
        table = pd.DataFrame({"gpus": sorted(one_node["gpus_per_node"].unique())})
        ref = None
        if reference is not None:
            ref = reference[(reference["nodes"] == 1) & (reference["model"] == model)]
        for series in _series_in(one_node):
            mine = one_node[one_node["series"] == series].set_index("gpus_per_node")
            table[f"{series}_mean"] = table["gpus"].map(mine["images_per_sec_mean"])
            table[f"{series}_std"] = table["gpus"].map(mine["images_per_sec_std"])
            table[f"{series}_status"] = table["gpus"].map(mine["status"])
            framework = series.partition(" ")[0]
            theirs = None
            if ref is not None and framework in set(ref["framework"]):
                theirs = ref[ref["framework"] == framework].set_index("gpus_per_node")
            # One reference value per row or none: a reference of several
            # systems or data sets per cell (seed 004's two nodes) is compared
            # row by row in vs_reference, which names them.
            if theirs is not None and not theirs.index.has_duplicates:
                reference_mean = table["gpus"].map(theirs["images_per_sec_mean"])
                table[f"{series}_reference_mean"] = reference_mean
                table[f"{series}_ratio"] = table[f"{series}_mean"] / reference_mean
        return table

    return _per_panel(combined, build)


def table2(combined: pd.DataFrame, framework: str = "horovod") -> pd.DataFrame:
    """One framework, rows = GPUs per node, `n<N>_mean/_std` columns per node count.

    With knobs only this framework reads, one block per their values (column `series`).
    """

    def build(part):
        blocks = []
        for series in _series_in(part):
            one = part[part["series"] == series]
            table = pd.DataFrame({"gpus_per_node": sorted(one["gpus_per_node"].unique())})
            for nodes in sorted(one["nodes"].unique()):
                column = one[one["nodes"] == nodes].set_index("gpus_per_node")
                table[f"n{nodes}_mean"] = table["gpus_per_node"].map(column["images_per_sec_mean"])
                table[f"n{nodes}_std"] = table["gpus_per_node"].map(column["images_per_sec_std"])
                table[f"n{nodes}_status"] = table["gpus_per_node"].map(column["status"])
            if series != framework:
                table.insert(0, "series", series_label(series))
            blocks.append(table)
        return pd.concat(blocks, ignore_index=True)

    return _per_panel(combined[combined["framework"] == framework], build)


def read_knobs(combined: pd.DataFrame) -> list[str]:
    """Each row's knobs that its framework reads: the panel's and its own (a
    folder of a study written before runs were labelled only by what they
    read, or a hand-made row, may name knobs its framework does not read)."""
    return [
        join_knobs([*parse_knobs(panel), *parse_knobs(series.partition(" ")[2])])
        for panel, series in zip(combined["panel_knobs"], combined["series"], strict=True)
    ]


def efficiency_table(combined: pd.DataFrame) -> pd.DataFrame:
    columns = [
        "model",
        "batch_size",
        "framework",
        "nodes",
        "gpus_per_node",
        "gpus",
        "images_per_sec_mean",
        "speedup",
        "efficiency",
        "achieved_tflops",
        "mfu",
        "peak_memory_per_replica_mib",
        "gpu_utilisation_percent",
        "gpu_memory_peak_mib",
        "status",
    ]
    # Tidy tables written before NVML sampling have no such columns.
    combined = combined.assign(**{c: float("nan") for c in columns if c not in combined})
    combined = combined.assign(knobs=read_knobs(combined))
    if _varies(combined, "knobs"):
        columns.insert(2, "knobs")
    frame = combined[columns].copy()
    frame["order"] = frame["framework"].map(table_order)
    knobs = ["knobs"] if "knobs" in columns else []
    keys = ["model", "batch_size", *knobs, "order", "nodes", "gpus_per_node"]
    return frame.sort_values(keys).drop(columns="order").reset_index(drop=True)


def reference_table(combined: pd.DataFrame, reference: pd.DataFrame) -> pd.DataFrame:
    """Every grid point the reference also has (same framework, model, nodes, GPUs per
    node): measured, reference, and measured / reference, with the settings of both."""
    keys = ["framework", "model", "nodes", "gpus_per_node"]
    settings = ["dataset", "batch_size", "image_size", "device"]
    combined, reference = ok_only(combined), ok_only(reference)
    # Several reference points per cell (its own axes: seed 004's systems) are
    # told apart by their knobs.
    theirs_knobs = ["knobs"] if reference.duplicated(keys).any() else []
    theirs = reference[
        keys + settings + theirs_knobs + ["images_per_sec_mean", "images_per_sec_std"]
    ]
    theirs = theirs.rename(columns={c: f"reference_{c}" for c in theirs.columns if c not in keys})
    merged = combined.merge(theirs, on=keys)
    merged["ratio"] = merged["images_per_sec_mean"] / merged["reference_images_per_sec_mean"]
    knobs = ["knobs"] if _varies(merged, "knobs") else []
    columns = keys + [
        *knobs,
        "gpus",
        *settings,
        "images_per_sec_mean",
        "images_per_sec_std",
        *(f"reference_{c}" for c in settings + theirs_knobs),
        "reference_images_per_sec_mean",
        "reference_images_per_sec_std",
        "ratio",
    ]
    return merged[columns].sort_values(keys + knobs).reset_index(drop=True)


CROSS_KEYS = ["model", "batch_size", "panel_knobs", "nodes", "gpus_per_node", "shared_knobs"]


def _shared_knobs(frame: pd.DataFrame, other: str) -> list[str]:
    """Each row's own knobs that framework `other` reads too ('<knob>=<value>':
    Horovod's compression, read by both Horovods)."""
    return [
        join_knobs(
            (name, text)
            for name, text in parse_knobs(knobs)
            if name not in panel and other in (KNOB_AXES.get(name) or ())
        )
        for knobs, panel in zip(frame["knobs"], frame["panel_knobs"].map(_names), strict=True)
    ]


def _names(knobs: str) -> set[str]:
    return {name for name, _ in parse_knobs(knobs)}


def cross_ecosystem_table(combined: pd.DataFrame) -> pd.DataFrame:
    """Each framework beside the other ecosystem's framework the registry holds
    it against (torch-ddp vs horovod, the TensorFlow one), at equal model,
    batch, shared knobs (precision), nodes and GPUs per node, and equal values
    of the knobs both read (Horovod's compression): total images/sec of both,
    their ratio, and each one's weak-scaling efficiency against its own 1-GPU run.
    """
    ok = ok_only(combined)
    rows = []
    for spec in REGISTRY:
        if not spec.compared_with:
            continue
        mine = ok[ok["framework"] == spec.name]
        theirs = ok[ok["framework"] == spec.compared_with]
        mine = mine.assign(shared_knobs=_shared_knobs(mine, spec.compared_with))
        theirs = theirs.assign(shared_knobs=_shared_knobs(theirs, spec.name))
        merged = mine.merge(theirs, on=CROSS_KEYS, suffixes=("", "_versus"))
        rows.append(
            pd.DataFrame(
                {
                    **{key: merged[key] for key in CROSS_KEYS},
                    "gpus": merged["gpus"],
                    "framework": merged["series"].map(series_label),
                    "versus": merged["series_versus"].map(series_label),
                    "framework_images_per_sec_mean": merged["images_per_sec_mean"],
                    "framework_images_per_sec_std": merged["images_per_sec_std"],
                    "versus_images_per_sec_mean": merged["images_per_sec_mean_versus"],
                    "versus_images_per_sec_std": merged["images_per_sec_std_versus"],
                    "ratio": merged["images_per_sec_mean"] / merged["images_per_sec_mean_versus"],
                    "efficiency": merged["efficiency"],
                    "versus_efficiency": merged["efficiency_versus"],
                    "order": table_order(spec.name),
                }
            )
        )
    columns = [*CROSS_KEYS, "gpus", "framework", "versus"]
    columns += [
        f"{who}_images_per_sec_{stat}"
        for who in ("framework", "versus")
        for stat in ("mean", "std")
    ]
    columns += ["ratio", "efficiency", "versus_efficiency"]
    if not rows:
        return pd.DataFrame(columns=columns)
    table = pd.concat(rows, ignore_index=True)
    keys = ["model", "batch_size", "panel_knobs", "order", "nodes", "gpus_per_node"]
    table = table.sort_values(keys, kind="stable").drop(columns="order")
    for knobs in ("panel_knobs", "shared_knobs"):
        if not table[knobs].astype(bool).any():
            table = table.drop(columns=knobs)
    return table.reset_index(drop=True)


def write_tables(
    tidy_csv: str,
    folder: str,
    reference: str | None,
    framework: str,
    reference_records: list[str] = (),
) -> None:
    """Every table of a study into `folder`: Table I, Table II (`framework`'s),
    efficiency, across ecosystems, and against `reference` where there is one."""
    tidy = load_tidy(tidy_csv)
    combined = combine_repeats(tidy)
    ref = reference_combined(reference, list(reference_records))
    study = tidy["study"].iloc[0] if len(tidy) else "?"
    device = ", ".join(sorted(set(tidy["device"]))) or "?"
    _write_table1(combined, ref, folder, reference, f"{study}, {device}")
    _write_table2(combined, folder, framework, f"{study}, {device}")
    write_table(
        efficiency_table(combined),
        folder,
        EFFICIENCY,
        f"Speed-up and weak-scaling efficiency vs each framework's 1-GPU run, model "
        f"FLOPs utilisation (MFU: achieved / the devices' peak; empty where the device's "
        f"peak is unknown), and peak memory per replica (the GPU allocator's peak; on "
        f"CPUs the process's peak resident memory); GPU utilisation and memory as NVML "
        f"saw them while it trained (mean utilisation, peak memory in use; empty on "
        f"CPUs, which it does not sample) ({study})",
        EFFICIENCY_LABELS,
    )
    write_table(
        cross_ecosystem_table(combined),
        folder,
        CROSS_ECOSYSTEM,
        f"Across ecosystems: each torch framework beside the TensorFlow framework it "
        f"mirrors, total images/sec at equal model, batch, precision and GPUs; ratio = "
        f"torch / TensorFlow; efficiency against each one's own 1-GPU run ({study}, {device})",
        CROSS_ECOSYSTEM_LABELS,
    )
    if reference:
        _write_vs_reference(combined, ref, folder, study, reference)
    print(f"tables: written to {folder}")


EFFICIENCY_LABELS = {
    "achieved_tflops": "TFLOP/s",
    "mfu": "MFU",
    "peak_memory_per_replica_mib": "Peak memory per replica (MiB)",
    "gpu_utilisation_percent": "GPU utilisation (%)",
    "gpu_memory_peak_mib": "GPU memory in use, peak (MiB)",
}
CROSS_ECOSYSTEM_LABELS = {
    "model": "Model",
    "batch_size": "Batch/GPU",
    "panel_knobs": "Knobs",
    "shared_knobs": "Knobs of both",
    "nodes": "Nodes",
    "gpus_per_node": "GPUs per node",
    "gpus": "GPUs",
    "framework": "Framework",
    "versus": "Versus",
    "framework_images_per_sec": "Framework (images/sec)",
    "versus_images_per_sec": "Versus (images/sec)",
    "ratio": "torch / TF",
    "efficiency": "Efficiency",
    "versus_efficiency": "Versus efficiency",
}


def _write_table1(combined, ref, folder: str, reference: str | None, where: str) -> None:
    """Table I; `where`: the study and its devices, for the caption."""
    labels = {"gpus": "GPUs", "model": "Model", "batch_size": "Batch/GPU", "knobs": "Knobs"}
    for series in set(combined["series"]) if len(combined) else ():
        label = series_label(series)
        labels[series] = f"{label} (images/sec)"
        labels[f"{series}_reference_mean"] = f"{label} ({reference})"
        labels[f"{series}_ratio"] = f"{label} measured / {reference}"
    caption = f"Table I: frameworks on one node, total images/sec ({where})"
    write_table(table1(combined, ref), folder, TABLE1, caption, labels)


def _write_table2(combined, folder: str, framework: str, where: str) -> None:
    """Table II, `framework`'s; `where`: the study and its devices, for the caption."""
    t2 = table2(combined, framework)
    node_labels = {
        c[:-5]: f"{c[1:-5]} node{'s' if c[1:-5] != '1' else ''}"
        for c in t2.columns
        if c.endswith("_mean")
    }
    node_labels.update(
        {
            "gpus_per_node": "GPUs per node",
            "model": "Model",
            "batch_size": "Batch/GPU",
            "knobs": "Knobs",
            "series": "Framework",
        }
    )
    caption = (
        f"Table II: {framework_label(framework)}, total images/sec "
        f"by GPUs per node and nodes ({where})"
    )
    write_table(t2, folder, TABLE2, caption, node_labels)


def _write_vs_reference(combined, ref, folder: str, study: str, reference: str) -> None:
    ref_labels = {
        "images_per_sec": f"{study} (images/sec)",
        "reference_images_per_sec": f"{reference} (images/sec)",
        "ratio": f"measured / {reference}",
    }
    ref_labels.update(
        {
            f"reference_{c}": f"{c} ({reference})"
            for c in ("dataset", "batch_size", "image_size", "device", "knobs")
        }
    )
    write_table(
        reference_table(combined, ref),
        folder,
        VS_REFERENCE,
        f"{study} vs {reference} at the grid points both have (their settings "
        "may differ: see the columns)",
        ref_labels,
    )
