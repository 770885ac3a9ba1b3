"""Repeats of a grid point combined into one row, and the reference study's
rows so combined. pandas, no TensorFlow, no torch.

Definitions (also in the docs: explanation/definitions.md): the mean of the
repeats' means, and the pooled std — the std of all their blocks together,
computed from each repeat's block count, mean and std. Only runs that ended
`ok` are averaged.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from trainscale.analysis.tidy import ENERGY, POINT, add_scaling, add_series, collect


def _pooled(group: pd.DataFrame) -> pd.Series:
    means = group["images_per_sec_mean"].to_numpy(float)
    stds = group["images_per_sec_std"].to_numpy(float)
    counts = group["blocks"].to_numpy(float)
    mean = float(means.mean())
    if len(group) == 1:
        std = float(stds[0])
    elif np.isnan(counts).any():
        # Block counts unknown (published numbers): the spread of the means.
        std = float(means.std(ddof=1))
    else:
        # The std of all blocks of all repeats together, around their grand mean.
        total = counts.sum()
        grand = (counts * means).sum() / total
        spread = ((counts - 1) * stds**2 + counts * (means - grand) ** 2).sum()
        std = math.sqrt(spread / (total - 1))
    return pd.Series(
        {
            "images_per_sec_mean": mean,
            "images_per_sec_std": std,
            "repeats": len(group),
            "achieved_tflops": group["achieved_tflops"].astype(float).mean(),
            "mfu": group["mfu"].astype(float).mean(),
            "peak_memory_per_replica_mib": group["peak_memory_per_replica_mib"]
            .astype(float)
            .mean(),
            "gpu_utilisation_percent": group["gpu_utilisation_percent"].astype(float).mean(),
            "gpu_memory_peak_mib": group["gpu_memory_peak_mib"].astype(float).max(),
            **{key: group[key].astype(float).mean() for key in ENERGY},
            "tokens_per_sec_mean": group["tokens_per_sec_mean"].astype(float).mean(),
            "trainable_parameters": group["trainable_parameters"].astype(float).max(),
            "memory_capacity_per_replica_mib": group["memory_capacity_per_replica_mib"]
            .astype(float)
            .min(),
        }
    )


def combine_repeats(tidy: pd.DataFrame) -> pd.DataFrame:
    """One row per grid point and device, repeats combined.

    Only runs that ended `ok` are averaged. A point with no ok run keeps a row
    with no numbers and its status (`oom`, `timeout`, `failed`), so the tables
    can say why its cell is empty.
    """
    # Tidy tables written before MFU, memory (or knob axes) have no such columns.
    measures = (
        "achieved_tflops",
        "mfu",
        "peak_memory_per_replica_mib",
        "gpu_utilisation_percent",
        "gpu_memory_peak_mib",
        *ENERGY,
        "tokens_per_sec_mean",
        "trainable_parameters",
        "memory_capacity_per_replica_mib",
    )
    tidy = tidy.assign(**{c: np.nan for c in measures if c not in tidy})
    tidy = tidy.assign(knobs=tidy["knobs"].fillna("") if "knobs" in tidy else "")
    keys = POINT + ["device", "gpus"]
    columns = keys + [
        "images_per_sec_mean",
        "images_per_sec_std",
        "repeats",
        *measures,
        "status",
    ]
    ok = tidy[tidy["status"] == "ok"]
    parts = []
    if not ok.empty:
        pooled = ok.groupby(keys, sort=True).apply(_pooled, include_groups=False).reset_index()
        pooled["repeats"] = pooled["repeats"].astype(int)
        pooled["status"] = "ok"
        parts.append(pooled)
    done = set(map(tuple, ok[keys].to_numpy().tolist()))
    for point, group in tidy[tidy["status"] != "ok"].groupby(keys, sort=True):
        if tuple(point) not in done:
            status = "/".join(sorted(set(group["status"])))
            parts.append(
                pd.DataFrame(
                    [
                        {
                            **dict(zip(keys, point, strict=True)),
                            "images_per_sec_mean": math.nan,
                            "images_per_sec_std": math.nan,
                            "repeats": 0,
                            **{measure: math.nan for measure in measures},
                            # What did not fit is still a model of a size.
                            "trainable_parameters": group["trainable_parameters"].max(),
                            "status": status,
                        }
                    ]
                )
            )
    if not parts:
        return pd.DataFrame(columns=columns + ["speedup", "efficiency", "panel_knobs", "series"])
    combined = pd.concat(parts, ignore_index=True).sort_values(keys, kind="stable")
    return add_series(add_scaling(combined.reset_index(drop=True)))


def ok_only(combined: pd.DataFrame) -> pd.DataFrame:
    return combined[combined["status"] == "ok"]


def reference_combined(reference: str | None, records: list[str]) -> pd.DataFrame | None:
    """The reference study's combined rows, from its cached records (the rule's input)."""
    if not reference:
        return None
    return combine_repeats(collect(reference, records))
