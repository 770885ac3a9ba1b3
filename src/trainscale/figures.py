"""The paper's weak-scaling figures and the framework comparison. matplotlib + seaborn.

Every figure is written as PNG and PDF, atomically. Points whose runs did not
end `ok` are left out (the tables show why); the combined frame passed in
holds only ok points.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only, no display (clusters and CI have none)

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from trainscale.analysis import FRAMEWORK_LABELS, FRAMEWORK_ORDER  # noqa: E402
from trainscale.records import atomic_path  # noqa: E402

THROUGHPUT = "Throughput (images/sec, all GPUs)"


def _setup():
    sns.set_theme(style="whitegrid", context="paper", palette="colorblind")
    return plt.subplots(figsize=(6.4, 4.2), layout="constrained")


def _lines(ax, frame, x, hue, label, y="images_per_sec_mean", err="images_per_sec_std"):
    """One line per value of `hue` (and per model/batch when the study has several)."""
    variants = frame[["model", "batch_size"]].drop_duplicates() if len(frame) else []
    several = len(variants) > 1
    groups = sorted(frame.groupby([hue, "model", "batch_size"]), key=lambda kv: kv[0])
    palette = sns.color_palette("colorblind", n_colors=max(1, len(groups)))
    markers = "osD^vP*X"
    for i, ((key, model, batch_size), part) in enumerate(groups):
        part = part.sort_values(x)
        name = label(key) + (f", {model} b{batch_size}" if several else "")
        ax.errorbar(
            part[x],
            part[y],
            yerr=part[err] if err else None,
            label=name,
            color=palette[i % len(palette)],
            marker=markers[i % len(markers)],
            capsize=3,
        )


def _finish(fig, ax, paths: list[str], title: str, note: str | None = None):
    ax.set_title(title)
    if ax.has_data():
        ax.legend(fontsize="small")
        ax.set_ylim(bottom=0)
    else:
        ax.text(0.5, 0.5, "no ok runs to plot", ha="center", va="center", transform=ax.transAxes)
    if note:
        fig.text(0.01, 0.005, note, fontsize="x-small", color="dimgray")
    for path in paths:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=150)
    plt.close(fig)


def _integer_ticks(ax, values):
    ticks = sorted({int(v) for v in values})
    if ticks:
        ax.set_xticks(ticks)


def _plural(count, word: str) -> str:
    return f"{count} {word}{'s' if count > 1 else ''}"


def _weak_scaling(combined, framework, paths, note, x, lines, xlabel, line_label, over):
    fig, ax = _setup()
    part = combined[combined["framework"] == framework]
    _lines(ax, part, x, lines, line_label)
    _integer_ticks(ax, part[x])
    ax.set(xlabel=xlabel, ylabel=THROUGHPUT)
    label = FRAMEWORK_LABELS.get(framework, framework)
    _finish(fig, ax, paths, f"Weak scaling of {label} with {over}", note)


def weak_scaling_hosts(combined: pd.DataFrame, framework: str, paths: list[str], note=None):
    """Paper Fig. 1: throughput vs number of hosts, one line per GPUs per host."""
    _weak_scaling(
        combined,
        framework,
        paths,
        note,
        "nodes",
        "gpus_per_node",
        "Hosts (nodes)",
        lambda g: _plural(g, "GPU") + "/host",
        "the number of hosts",
    )


def weak_scaling_gpus(combined: pd.DataFrame, framework: str, paths: list[str], note=None):
    """Paper Fig. 2: throughput vs GPUs per host, one line per host count."""
    _weak_scaling(
        combined,
        framework,
        paths,
        note,
        "gpus_per_node",
        "nodes",
        "GPUs per host",
        lambda n: _plural(n, "host"),
        "GPUs per host",
    )


def efficiency(combined: pd.DataFrame, paths: list[str], note=None):
    """Weak-scaling efficiency vs total GPUs, per framework and host count, with the ideal."""
    fig, ax = _setup()
    frame = combined.dropna(subset=["efficiency"]).copy()
    frame["series"] = [
        f"{FRAMEWORK_LABELS.get(f, f)}, {n} host{'s' if n > 1 else ''}"
        for f, n in zip(frame["framework"], frame["nodes"], strict=True)
    ]
    _lines(ax, frame, "gpus", "series", str, y="efficiency", err=None)
    if not frame.empty:
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="ideal")
    _integer_ticks(ax, frame["gpus"])
    ax.set(xlabel="GPUs (all hosts)", ylabel="Weak-scaling efficiency (speed-up / GPUs)")
    _finish(fig, ax, paths, "Weak-scaling efficiency against each framework's 1-GPU run", note)


def frameworks(combined: pd.DataFrame, paths: list[str], note=None):
    """Table I as a plot: frameworks on one node vs GPUs."""
    fig, ax = _setup()
    part = combined[combined["nodes"] == 1].copy()
    part["order"] = part["framework"].map(FRAMEWORK_ORDER.index)
    _lines(
        ax,
        part.sort_values("order"),
        "gpus_per_node",
        "order",
        lambda i: FRAMEWORK_LABELS[FRAMEWORK_ORDER[i]],
    )
    _integer_ticks(ax, part["gpus_per_node"])
    ax.set(xlabel="GPUs (one host)", ylabel=THROUGHPUT)
    _finish(fig, ax, paths, "Horovod vs TensorFlow on one host", note)


def vs_reference(comparison: pd.DataFrame, reference: str, paths: list[str], note=None):
    """Measured and reference throughput at the grid points both have."""
    fig, ax = _setup()
    measured = comparison.assign(
        series=[
            f"{FRAMEWORK_LABELS.get(f, f)}, {n}n measured"
            for f, n in zip(comparison["framework"], comparison["nodes"], strict=True)
        ]
    )
    published = comparison.assign(
        series=[
            f"{FRAMEWORK_LABELS.get(f, f)}, {n}n {reference}"
            for f, n in zip(comparison["framework"], comparison["nodes"], strict=True)
        ],
        images_per_sec_mean=comparison["reference_images_per_sec_mean"],
        images_per_sec_std=comparison["reference_images_per_sec_std"],
    )
    _lines(ax, pd.concat([measured, published]), "gpus", "series", str)
    _integer_ticks(ax, comparison["gpus"])
    ax.set(xlabel="GPUs (all hosts)", ylabel=THROUGHPUT)
    mine = ", ".join(sorted(set(comparison["device"])))
    theirs = ", ".join(sorted(set(comparison["reference_device"])))
    _finish(fig, ax, paths, f"This study ({mine}) vs {reference} ({theirs})", note)


def write_figures(
    tidy_csv: str,
    folder: str,
    reference: str | None,
    framework: str,
    reference_records: list[str] = (),
) -> None:
    import os

    from trainscale.analysis import (
        combine_repeats,
        load_tidy,
        ok_only,
        reference_combined,
        reference_table,
    )

    tidy = load_tidy(tidy_csv)
    combined = ok_only(combine_repeats(tidy))
    left_out = tidy[tidy["status"] != "ok"]
    note = None
    if len(left_out):
        note = (
            f"Left out: {len(left_out)} run(s) that did not end ok ("
            + ", ".join(sorted(set(left_out["status"])))
            + "); see the tables."
        )

    def paths(name):
        return [os.path.join(folder, f"{name}.{ext}") for ext in ("png", "pdf")]

    weak_scaling_hosts(combined, framework, paths("weak_scaling_hosts"), note)
    weak_scaling_gpus(combined, framework, paths("weak_scaling_gpus"), note)
    efficiency(combined, paths("efficiency"), note)
    frameworks(combined, paths("frameworks"), note)
    if reference:
        comparison = reference_table(
            combined, reference_combined(reference, list(reference_records))
        )
        vs_reference(comparison, reference, paths("vs_reference"), note)
    print(f"figures: written to {folder}")
