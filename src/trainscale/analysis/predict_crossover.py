"""Seed 001's claim as a number: where a parameter server's predicted
throughput and an all-reduce's cross as the workers grow.

Each fitted parameter-server series (trainscale.analysis.predict, its
exchange 2 p/s x B through each server's link) is held against each fitted
all-reduce series of the same model, image size and batch per worker, and
the same values of the knobs both frameworks read (the network among them,
so a study with the network as an axis gets a row per network). Both are
predicted over the study's `predict` grid, ordered by workers; the table
says which is faster at the fewest and at the most workers, the first
worker count where the faster one changes, and each series' held-out error.

Needs NumPy and pandas: no TensorFlow, no torch.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from trainscale.analysis.predict import Series
from trainscale.analysis.predict_series import series_rows
from trainscale.catalogue.registry import framework_spec, label
from trainscale.catalogue.settings import reads_setting
from trainscale.study.study import join_knobs, parse_knobs


def comparable(server: Series, ring: Series) -> bool:
    """The same workload, and equal values of every knob both read."""
    if (server.model, server.image_size, server.batch_size) != (
        ring.model,
        ring.image_size,
        ring.batch_size,
    ):
        return False
    mine, theirs = dict(parse_knobs(server.knobs)), dict(parse_knobs(ring.knobs))
    shared = {
        k
        for k in {*mine, *theirs}
        if all(reads_setting(f, k) for f in (server.framework, ring.framework))
    }
    return all(mine.get(k) == theirs.get(k) for k in shared)


def _workers(nodes, gpus_per_node, one_node: bool) -> list[tuple[int, int]]:
    cells = sorted(
        {(n * g, n, g) for n in nodes for g in gpus_per_node if not (one_node and n > 1)}
    )
    return [(n, g) for _, n, g in cells]


def _mape(holdout: pd.DataFrame, series: Series) -> float:
    rows = series_rows(holdout, series)
    if "mape_percent" not in rows or rows["mape_percent"].isna().all():
        return np.nan
    return float(rows["mape_percent"].iloc[0])


def crossover_table(fitted: dict, holdout: pd.DataFrame, nodes, gpus_per_node) -> pd.DataFrame:
    """One row per (parameter server, all-reduce) pair of fitted series."""
    ok = {s: r for s, r in fitted.items() if not isinstance(r, str)}
    rows = []
    for server, server_fit in ok.items():
        if not server.servers:
            continue
        for ring, ring_fit in ok.items():
            if ring.servers or not comparable(server, ring):
                continue
            one_node = (
                framework_spec(server.framework).one_node or framework_spec(ring.framework).one_node
            )
            cells = _workers(nodes, gpus_per_node, one_node)
            n, g = (np.array(v) for v in zip(*cells, strict=True))
            ps_rate, ring_rate = (
                server_fit.model.images_per_sec(n, g),
                ring_fit.model.images_per_sec(n, g),
            )
            faster = np.where(ps_rate > ring_rate, "parameter server", "all-reduce")
            changes = [i for i in range(1, len(cells)) if faster[i] != faster[i - 1]]
            rows.append(
                {
                    "parameter_server": server.framework,
                    "all_reduce": ring.framework,
                    "model": server.model,
                    "batch_size": server.batch_size,
                    "servers": server.servers,
                    "knobs": join_knobs(
                        {**dict(parse_knobs(ring.knobs)), **dict(parse_knobs(server.knobs))}.items()
                    ),
                    "fewest_workers": int(n[0] * g[0]),
                    "faster_at_fewest": faster[0],
                    "most_workers": int(n[-1] * g[-1]),
                    "faster_at_most": faster[-1],
                    "crossover_workers": int(n[changes[0]] * g[changes[0]]) if changes else np.nan,
                    "ps_images_per_sec_at_most": float(ps_rate[-1]),
                    "all_reduce_images_per_sec_at_most": float(ring_rate[-1]),
                    "ps_holdout_mape_percent": _mape(holdout, server),
                    "all_reduce_holdout_mape_percent": _mape(holdout, ring),
                }
            )
    return pd.DataFrame(rows)


def shown_crossover(table: pd.DataFrame) -> pd.DataFrame:
    def number(values, spec):
        return ["" if pd.isna(v) else f"{v:{spec}}" for v in values]

    return pd.DataFrame(
        {
            "Parameter server": [label(f) for f in table["parameter_server"]],
            "Servers": table["servers"],
            "All-reduce": [label(f) for f in table["all_reduce"]],
            "Model": table["model"],
            "Batch/GPU": table["batch_size"],
            "Knobs": table["knobs"],
            "Faster at the fewest workers": [
                f"{who} ({w})"
                for who, w in zip(table["faster_at_fewest"], table["fewest_workers"], strict=True)
            ],
            "Faster at the most": [
                f"{who} ({w})"
                for who, w in zip(table["faster_at_most"], table["most_workers"], strict=True)
            ],
            "Crossover (workers)": [
                "none in the grid" if pd.isna(v) else f"{v:.0f}" for v in table["crossover_workers"]
            ],
            "At the most: PS / all-reduce images/sec": [
                f"{a:.0f} / {b:.0f}"
                for a, b in zip(
                    table["ps_images_per_sec_at_most"],
                    table["all_reduce_images_per_sec_at_most"],
                    strict=True,
                )
            ],
            "Held-out MAPE %: PS / all-reduce": [
                f"{a} / {b}"
                for a, b in zip(
                    number(table["ps_holdout_mape_percent"], ".1f"),
                    number(table["all_reduce_holdout_mape_percent"], ".1f"),
                    strict=True,
                )
            ],
        }
    )
