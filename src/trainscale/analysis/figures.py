"""The paper's weak-scaling figures, the framework comparison, efficiency,
MFU, memory, the refactoring trade-off and the reference study
(trainscale.analysis.plotting draws them).

Every figure is written as PNG and PDF, atomically. Points whose runs did not
end `ok` are left out (the tables show why); the combined frame passed in
holds only ok points.
"""

from __future__ import annotations

import pandas as pd

from trainscale.analysis import outputs as out
from trainscale.analysis.plotting import (
    THROUGHPUT,
    bars,
    finish,
    framework_style,
    host_series,
    legend,
    panels_of,
    plot,
    plt,
    plural,
    set_theme,
    variant_style,
    wrapped,
)
from trainscale.analysis.predict_series import series_rows
from trainscale.analysis.tidy import series_label, series_order
from trainscale.catalogue.registry import FRAMEWORKS, base_of, framework_spec
from trainscale.catalogue.registry import label as framework_label
from trainscale.core.gpt import TEXT_MODELS
from trainscale.core.records import atomic_path
from trainscale.launching.examples import WORKLOADS


def _weak_scaling(combined, framework, paths, note, x, line_of, xlabel, line_label, over):
    part = combined[combined["framework"] == framework]
    # Knobs only this framework reads (Horovod's compression) get lines of their own.
    own = [s.partition(" ")[2] for s in part["series"]]
    part = part.assign(line=list(zip(own, part[line_of], strict=True)))
    fig, panels = plot(
        part,
        x,
        "line",
        lambda key: line_label(key[1]) + (f", {key[0]}" if key[0] else ""),
        xlabel,
        THROUGHPUT,
    )
    finish(fig, panels, paths, f"Weak scaling of {framework_label(framework)} with {over}", note)


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
        lambda g: plural(g, "GPU") + "/host",
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
        lambda n: plural(n, "host"),
        "GPUs per host",
    )


# What a run's efficiency is taken against must match it in these.
BASE_KEYS = ["model", "dataset", "image_size", "batch_size", "device", "panel_knobs"]


def against_a_base(combined: pd.DataFrame) -> pd.DataFrame:
    """The rows with an efficiency: against the framework's own 1-GPU run (the
    tables' definition), or, where it has none, against its ecosystem's
    single-device framework's 1-GPU run at the same model, data, batch and
    shared knobs, the base the seeds use; column `base` names that framework
    ('' for its own run)."""
    frame = combined.copy()
    frame["base"] = ""
    ones = combined[(combined["gpus"] == 1) & (combined["status"] == "ok")]
    rates = ones.set_index(["framework", *BASE_KEYS])["images_per_sec_mean"]
    rates = rates[~rates.index.duplicated()]
    for index, row in frame[frame["efficiency"].isna()].iterrows():
        if row["framework"] not in FRAMEWORKS:  # a cached record's, since removed
            continue
        base = base_of(row["framework"])
        key = (base, *(row[k] for k in BASE_KEYS))
        if base != row["framework"] and key in rates.index:
            frame.loc[index, "efficiency"] = row["images_per_sec_mean"] / rates[key] / row["gpus"]
            frame.loc[index, "base"] = base
    return frame.dropna(subset=["efficiency"])


def efficiency(combined: pd.DataFrame, paths: list[str], note=None):
    """Weak-scaling efficiency vs total GPUs, per framework and host count, with
    the ideal; a line against its ecosystem's single-device run says so."""
    frame = against_a_base(combined)
    frame["series"] = [
        f"{series} (vs {framework_label(base)})" if base else series
        for series, base in zip(host_series(frame), frame["base"], strict=True)
    ]
    ylabel = "Weak-scaling efficiency (speed-up / GPUs)"
    fig, panels = plot(frame, "gpus", "series", str, "GPUs (all hosts)", ylabel, "efficiency", None)
    for ax, variant in panels:
        if not variant.empty:
            ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="ideal")
    title = (
        "Weak-scaling efficiency against each framework's 1-GPU run "
        "(or, where it has none, its ecosystem's single-device run)"
    )
    finish(fig, panels, paths, title, note)


def frameworks(combined: pd.DataFrame, paths: list[str], note=None):
    """Table I as a plot: on one host, a bar per framework (and its own knobs)
    and GPU count, in the registry's order, its spread as an error bar."""
    part = combined[combined["nodes"] == 1]
    counts = sorted(set(part["gpus_per_node"]))
    fig, panels = panels_of(part)
    for ax, variant in panels:
        if not variant.empty:
            names = sorted(set(variant["series"]), key=series_order)
            bars(ax, variant, names, counts, "gpus_per_node")
        ax.set(ylabel=THROUGHPUT)
    names = sorted(set(part["series"]), key=series_order)
    title = (
        " vs ".join(series_label(s) for s in names)
        if len(names) <= 3
        else f"{len(names)} frameworks"
    )
    finish(fig, panels, paths, f"{title} on one host", note)


def memory(combined: pd.DataFrame, paths: list[str], note=None):
    """Peak memory per replica vs total GPUs, one line per series (a framework
    and its own knobs: ZeRO stage, FSDP's resharding) and host count: what
    sharding buys (seed 003)."""
    frame = combined.dropna(subset=["peak_memory_per_replica_mib"]).copy()
    frame["series"] = host_series(frame)
    ylabel = "Peak memory per replica (MiB)"
    y = "peak_memory_per_replica_mib"
    fig, panels = plot(frame, "gpus", "series", str, "GPUs (all hosts)", ylabel, y, None)
    title = "Peak memory per replica\n(GPU allocator's peak; on CPUs, peak resident memory)"
    finish(fig, panels, paths, title, note)


def utilisation(combined: pd.DataFrame, paths: list[str], note=None):
    """Model FLOPs utilisation vs total GPUs, per framework and host count."""
    frame = combined.dropna(subset=["mfu"]).copy()
    frame["series"] = host_series(frame)
    ylabel = "MFU (achieved / peak FLOP/s)"
    fig, panels = plot(frame, "gpus", "series", str, "GPUs (all hosts)", ylabel, "mfu", None)
    if frame.empty and len(combined):
        devices = ", ".join(sorted(set(combined["device"])))
        why = f"No MFU: the peak of this study's devices ({devices}) is not in trainscale's table."
        note = f"{why} {note}" if note else why
    finish(fig, panels, paths, "Model FLOPs utilisation", note)


def _shared_gpu_count(variant: pd.DataFrame) -> int | None:
    """The most GPUs at which every multi-device framework of a panel has a result."""
    counts = [
        set(part["gpus"])
        for framework, part in variant.groupby("framework")
        if not framework_spec(framework).one_device
    ]
    shared = set.intersection(*counts) if counts else set()
    return max(shared) if shared else None


def refactoring_tradeoff(combined: pd.DataFrame, refactoring: pd.DataFrame, paths, note=None):
    """The paper's trade-off: each framework's throughput on N GPUs against the
    lines its example changes from the single-device script (its base, at 0
    lines, on 1 GPU). N is the most GPUs every multi-device framework of the
    panel reached, on the fewest nodes."""
    # Per workload: a panel of a text model takes the examples that train a
    # GPT (a table written before there were two has images only).
    image, text = WORKLOADS["image"][1], WORKLOADS["text"][1]
    workloads = refactoring["workload"] if "workload" in refactoring else [image] * len(refactoring)
    touched = {
        (framework, workload): lines
        for framework, workload, lines in zip(
            refactoring["framework"], workloads, refactoring["lines_touched"], strict=True
        )
    }
    frame = combined[combined["framework"].isin({framework for framework, _ in touched})]
    fig, panels = panels_of(frame)
    for ax, variant in panels:
        shared = _shared_gpu_count(variant)
        # A panel may hold no row (a study whose every run failed).
        models = set(variant["model"])
        workload = text if models and models <= set(TEXT_MODELS) else image
        for series, part in sorted(variant.groupby("series"), key=lambda kv: series_order(kv[0])):
            framework = part["framework"].iloc[0]
            gpus = 1 if framework_spec(framework).one_device else shared or part["gpus"].max()
            point = part[part["gpus"] == gpus].sort_values("nodes").head(1)
            if point.empty or (framework, workload) not in touched:
                continue
            ax.errorbar(
                [touched[framework, workload]],
                point["images_per_sec_mean"],
                yerr=point["images_per_sec_std"],
                label=f"{series_label(series)}, {plural(int(gpus), 'GPU')}",
                **framework_style(framework),
                linestyle="none",
                capsize=3,
            )
        ax.set(xlabel="Lines of the single-device script touched", ylabel=THROUGHPUT)
        ax.set_xlim(left=-2)
    finish(fig, panels, paths, "Throughput against refactoring effort", note)


def predicted(series_list, fitted: dict, table: pd.DataFrame, paths: list[str]):
    """Per fitted series: the measured cells (mean ± std), the predicted
    throughput for each GPUs-per-node of the target grid with its 95 % band
    (hollow circles where it assumes what no cell measured), and the ideal
    line (the 1-GPU rate times the GPUs)."""
    shown = [s for s in series_list if s in fitted and not isinstance(fitted[s], str)]
    set_theme()
    columns = min(3, max(1, len(shown)))
    rows = -(-max(1, len(shown)) // columns)
    fig, axes = plt.subplots(
        rows, columns, figsize=(4.6 * columns, 3.8 * rows), layout="constrained", squeeze=False
    )
    for ax in list(axes.flat)[len(shown) :]:
        ax.set_visible(False)
    for ax, series in zip(axes.flat, shown, strict=False):
        part = series_rows(table, series)
        for index, (gpus_per_node, line) in enumerate(part.groupby("gpus_per_node")):
            line = line.sort_values("gpus")
            style = variant_style(series.framework, index)
            ax.plot(line["gpus"], line["predicted_images_per_sec"], **style,
                    label=f"predicted, {gpus_per_node} GPUs/node")  # fmt: skip
            band = (line["low_images_per_sec"], line["high_images_per_sec"])
            ax.fill_between(line["gpus"], *band, color=style["color"], alpha=0.2)
            # Beyond what was measured (the table's Assumed column): hollow.
            beyond = line[line["assumed"] != ""]
            ax.scatter(beyond["gpus"], beyond["predicted_images_per_sec"], marker="o",
                       facecolors="white", edgecolors=style["color"], zorder=3)  # fmt: skip
        if series.servers:  # where it and each comparable all-reduce cross
            _all_reduce_beside(ax, series, shown, table)
        cells = series.cells
        ax.errorbar([c.gpus for c in cells], [c.images_per_sec for c in cells],
                    yerr=[c.std for c in cells], fmt="o", color="black", markersize=3,
                    capsize=2, label="measured")  # fmt: skip
        single = series.batch_size / fitted[series].model.compute
        most = max([c.gpus for c in cells] + list(part["gpus"]))
        ax.plot([1, most], [single, single * most], color="gray", linestyle="--", label="ideal")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        title = f"{series.name} ({fitted[series].model.algorithm})"
        ax.set_title(wrapped(title, fig.get_figwidth() / columns, 9), fontsize="small")
        ax.set(xlabel="GPUs (all hosts)", ylabel=THROUGHPUT)
    if not shown:
        axes.flat[0].text(0.5, 0.5, "no series to fit", ha="center", va="center")
    # One legend for every panel, outside them: measured, ideal, and each
    # GPUs-per-node line (in its panel's framework colour).
    legend(fig, axes.flat)
    title = (
        "Predicted throughput: the fitted step model, its 95 % band (hollow: beyond what was "
        "measured), and the measured cells"
    )
    fig.suptitle(wrapped(title, fig.get_figwidth()))
    for path in paths:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=150)
    plt.close(fig)


def _all_reduce_beside(ax, server, shown, table: pd.DataFrame) -> None:
    """In a parameter server's panel, the predicted line of each fitted
    all-reduce series of its workload (trainscale.analysis.predict_crossover)."""
    from trainscale.analysis.predict_crossover import comparable

    for ring in shown:
        if ring.servers or not comparable(server, ring):
            continue
        part = series_rows(table, ring).sort_values("gpus")
        ax.plot(part["gpus"], part["predicted_images_per_sec"],
                **variant_style(ring.framework, 0),
                label=f"predicted, {framework_label(ring.framework)}")  # fmt: skip


def vs_reference(comparison: pd.DataFrame, reference: str, paths: list[str], note=None):
    """Measured and reference throughput at the grid points both have."""
    from trainscale.analysis.tidy import add_series

    comparison = add_series(comparison.assign(knobs=comparison.get("knobs", "")))
    names = [
        f"{series_label(s)}, {n}n"
        for s, n in zip(comparison["series"], comparison["nodes"], strict=True)
    ]
    measured = comparison.assign(series=[f"{name} measured" for name in names])
    published = comparison.assign(
        series=[f"{name} {reference}" for name in names],
        images_per_sec_mean=comparison["reference_images_per_sec_mean"],
        images_per_sec_std=comparison["reference_images_per_sec_std"],
    )
    both = pd.concat([measured, published])
    fig, panels = plot(both, "gpus", "series", str, "GPUs (all hosts)", THROUGHPUT)
    mine = ", ".join(sorted(set(comparison["device"])))
    theirs = ", ".join(sorted(set(comparison["reference_device"])))
    title = f"This study ({mine}) vs {reference} ({theirs})"
    if comparison.empty:
        title = f"This study vs {reference}: no grid point in common"
    finish(fig, panels, paths, title, note)


def write_figures(
    tidy_csv: str,
    folder: str,
    reference: str | None,
    framework: str,
    reference_records: list[str] = (),
    workers: int = 1,
    refactoring_csv: str | None = None,
) -> None:
    """Every figure of a study, each drawn on its own by one of `workers` processes.

    Drawing is most of the time of a big study's analysis, and the figures
    are independent: on the rule's threads they are drawn side by side.
    """
    import os

    from trainscale.analysis.repeats import combine_repeats, ok_only, reference_combined
    from trainscale.analysis.tables import reference_table
    from trainscale.analysis.tidy import load_tidy

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
        return [os.path.join(folder, f"{name}.{ext}") for ext in out.FIGURE_FORMATS]

    drawings = [
        (weak_scaling_hosts, (combined, framework, paths(out.WEAK_SCALING_HOSTS), note)),
        (weak_scaling_gpus, (combined, framework, paths(out.WEAK_SCALING_GPUS), note)),
        (efficiency, (combined, paths(out.EFFICIENCY), note)),
        (frameworks, (combined, paths(out.FRAMEWORKS), note)),
        (utilisation, (combined, paths(out.MFU), note)),
        (memory, (combined, paths(out.MEMORY), note)),
    ]
    if refactoring_csv:
        refactoring = pd.read_csv(refactoring_csv)
        drawings.append(
            (refactoring_tradeoff, (combined, refactoring, paths(out.REFACTORING_TRADEOFF), note))
        )
    if reference:
        comparison = reference_table(
            combined, reference_combined(reference, list(reference_records))
        )
        drawings.append((vs_reference, (comparison, reference, paths(out.VS_REFERENCE), note)))
    workers = _draw_all(drawings, workers)
    print(f"figures: written to {folder} ({workers} process(es))")


def _draw_all(drawings: list, workers: int) -> int:
    """Each (draw, args) of `drawings`, in up to `workers` processes; how many drew."""
    workers = max(1, min(workers, len(drawings)))
    if workers == 1:
        for draw, args in drawings:
            draw(*args)
        return workers
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # fork: the children start with this process's imports and frames.
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        for done in [pool.submit(draw, *args) for draw, args in drawings]:
            done.result()  # a figure's error is raised here
    return workers
