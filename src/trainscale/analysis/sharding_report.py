"""The memory study: where, as a model grows, each scheme starts to save
memory against DDP, what it costs in speed, and the largest model each fits.

Read from a study's tidy table (throughput.csv) of text models measured at
several sizes. A *scheme* is a framework with the knobs it reads (DeepSpeed
at ZeRO's stage 3, tensor parallelism in groups of 2: tidy's `series`); it is compared
with torch-ddp at the same replicas, batch, sequence length and knobs every
framework reads (precision), so only the scheme differs.

- `sharding_memory`: one row per scheme, replica count and model: the
  parameters, the peak memory per replica (MiB), its ratio to DDP's, and
  tokens/sec beside it; a run that did not end ok says its status (`oom`).
- `sharding_crossover`: one row per scheme and replica count: the smallest
  measured model at which the scheme's peak is below DDP's (the crossover,
  measured: between the largest size where it was not and that one), and the
  largest measured model that ended ok with its peak within the memory limit
  of its replica count (a run that ran out of memory does not fit).
- `memory_model_check`: with `tensor_memory: true`, each run's live tensor
  bytes at its peak against the memory model's count for its configuration
  (trainscale.analysis.memory_check).
- `figures/sharding_memory`: peak memory per replica against parameters
  (both logarithmic), one line per scheme, a panel per replica count, the
  memory limit dashed.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from trainscale.analysis.outputs import MEMORY_MODEL_CHECK, SHARDING_CROSSOVER, SHARDING_MEMORY
from trainscale.analysis.tidy import add_series, series_label, series_order

BASELINE = "torch-ddp"
# A scheme is compared with DDP within these.
SAME = ["batch_size", "gpus", "panel_knobs", "device"]


def memory_rows(tidy: pd.DataFrame) -> pd.DataFrame:
    """sharding_memory: every scheme's peak per replica, against DDP's."""
    frame = tidy[tidy["tokens_per_sec_mean"].notna() | (tidy["status"] != "ok")].copy()
    frame = frame[frame["trainable_parameters"].notna()]
    ok = frame[frame["status"] == "ok"]
    ddp = (
        ok[ok["framework"] == BASELINE]
        .groupby([*SAME, "model"])["peak_memory_per_replica_mib"]
        .mean()
        .rename("ddp_peak_mib")
    )
    rows = (
        frame.groupby(["series", *SAME, "model"], dropna=False)
        .agg(
            parameters=("trainable_parameters", "max"),
            peak_mib=("peak_memory_per_replica_mib", "mean"),
            tokens_per_sec=("tokens_per_sec_mean", "mean"),
            status=("status", lambda s: "ok" if (s == "ok").all() else s[s != "ok"].iloc[0]),
        )
        .reset_index()
        .join(ddp, on=[*SAME, "model"])
    )
    rows["vs_ddp"] = rows["peak_mib"] / rows["ddp_peak_mib"]
    rows["order"] = [series_order(s) for s in rows["series"]]
    rows = rows.sort_values(["gpus", "order", "parameters"]).drop(columns="order")
    return rows.reset_index(drop=True)


def crossover_rows(memory: pd.DataFrame, limits_mib: dict) -> pd.DataFrame:
    """sharding_crossover: per scheme and replicas, where it starts to save
    memory against DDP, and the largest model within the limit at that
    replica count (limits_mib: replicas -> MiB or None)."""
    rows = []
    for (series, gpus), part in memory.groupby(["series", "gpus"], sort=False):
        limit_mib = limits_mib.get(gpus)
        part = part.sort_values("parameters")
        ok = part[part["status"] == "ok"]
        saves = ok[ok["vs_ddp"] < 1]
        below = ok[(ok["vs_ddp"] >= 1) & (ok["parameters"] < saves["parameters"].min())]
        fits = ok if limit_mib is None else ok[ok["peak_mib"] <= limit_mib]
        rows.append(
            {
                "series": series,
                "framework": series_label(series),
                "gpus": gpus,
                "saves_from_parameters": saves["parameters"].min() if len(saves) else np.nan,
                "saves_from_model": saves["model"].iloc[0] if len(saves) else "",
                "not_yet_at_parameters": below["parameters"].max() if len(below) else np.nan,
                "largest_fitting_model": fits["model"].iloc[-1] if len(fits) else "",
                "largest_fitting_parameters": fits["parameters"].iloc[-1] if len(fits) else np.nan,
                "memory_limit_mib": limit_mib,
            }
        )
    return pd.DataFrame(rows)


def memory_limits_mib(tidy: pd.DataFrame, configured_gib: float | None) -> dict:
    """The limit models must fit in, per replica count: the configured one,
    else the smallest memory a replica had at that count (the record's: a
    GPU's own, or on a CPU its share of the cgroup's or machine's, which
    shrinks as the replicas sharing them grow)."""
    limits = {}
    for gpus, runs in tidy.groupby("gpus"):
        capacity = runs.get("memory_capacity_per_replica_mib", pd.Series(dtype=float)).dropna()
        measured = float(capacity.min()) if len(capacity) else None
        limits[gpus] = configured_gib * 1024 if configured_gib else measured
    return limits


def sharding_figure(memory: pd.DataFrame, limits_mib: dict, paths: list[str]) -> None:
    from trainscale.analysis.plotting import finish, panels_of, variant_style

    # A panel per replica count (and batch and shared knobs), the models along x.
    panelled = memory.assign(model=[f"{g} replica(s)" for g in memory["gpus"]])
    fig, panels = panels_of(panelled)
    # A framework's schemes (ZeRO's stages) share its colour, each its own line style.
    ordered = sorted(set(memory["series"]), key=series_order)
    nth = {s: [o for o in ordered if o.split()[0] == s.split()[0]].index(s) for s in ordered}
    for ax, variant in panels:
        top = variant["peak_mib"].max()
        for series, line in sorted(variant.groupby("series"), key=lambda kv: series_order(kv[0])):
            style = variant_style(series.partition(" ")[0], nth[series])
            ok = line[line["status"] == "ok"]
            ax.plot(ok["parameters"], ok["peak_mib"], label=series_label(series), **style)
            for parameters in line.loc[line["status"] != "ok", "parameters"]:
                ax.annotate("OOM", (parameters, top), color=style["color"], ha="center",
                            fontsize="small")  # fmt: skip
        limit_mib = limits_mib.get(variant["gpus"].iloc[0])
        if limit_mib:
            ax.axhline(limit_mib, color="black", linestyle="--", linewidth=0.8, label="limit")
        ax.set(xscale="log", yscale="log", xlabel="Parameters",
               ylabel="Peak memory per replica (MiB)")  # fmt: skip
    finish(fig, panels, paths, "Peak memory per replica against model size (OOM: out of memory)")


def write_sharding(tidy_csv: str, folder: str, figures: list[str], limit_gib=None) -> None:
    """tables/sharding_memory and tables/sharding_crossover in `folder`, and the figure."""
    from trainscale.analysis.rendering import write_table
    from trainscale.analysis.repeats import combine_repeats
    from trainscale.analysis.tidy import load_tidy

    tidy = combine_repeats(load_tidy(tidy_csv))
    memory = memory_rows(tidy)
    limits = memory_limits_mib(tidy, limit_gib)
    tables = os.path.join(folder, "tables")
    shown = memory.assign(framework=[series_label(s) for s in memory["series"]])
    write_table(shown.drop(columns=["series"]), tables, SHARDING_MEMORY,
                "Peak memory per replica by scheme and model size, against DDP")  # fmt: skip
    crossover = crossover_rows(memory, limits)
    write_table(crossover.drop(columns=["series"]), tables, SHARDING_CROSSOVER,
                "Where each scheme starts to save memory against DDP, and the largest "
                "model within the memory limit")  # fmt: skip
    sharding_figure(memory, limits, figures)
    write_memory_check(tidy_csv, tables)


def write_memory_check(tidy_csv: str, tables: str) -> None:
    """tables/memory_model_check: the memory model against the runs' live
    tensor bytes (trainscale.analysis.memory_check)."""
    from trainscale.analysis.memory_check import memory_check_rows
    from trainscale.analysis.predict_series import read_study_table
    from trainscale.analysis.rendering import write_table

    check = memory_check_rows(add_series(read_study_table(tidy_csv)))  # a record per row
    caption = "The memory model's bytes a rank against the live tensor bytes at each run's peak"
    if check.empty:
        caption += " (no run counted them: run the study with tensor_memory: true)"
    write_table(check, tables, MEMORY_MODEL_CHECK, caption)
