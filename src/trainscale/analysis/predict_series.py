"""A study's series for the step model (trainscale.analysis.predict): each
framework's runs at one model, image size, batch and knobs, from the study's
tidy table and its records, with what one step moves (its registry entry's
Traffic); and the split of a series' cells for the held-out check.

Needs NumPy and pandas: no TensorFlow, no torch.
"""

from __future__ import annotations

import dataclasses
import json
import os

import pandas as pd

from trainscale.analysis.predict import PARAMETER_SERVER, Cell, PredictError, Series
from trainscale.analysis.tidy import load_tidy
from trainscale.catalogue.models import KNOWN_TRAINABLE_PARAMETERS
from trainscale.catalogue.registry import FRAMEWORKS, base_of, framework_spec, table_order
from trainscale.catalogue.traffic import Traffic


def _record(path: str) -> dict:
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def traffic(record: dict, model: str, image_size: int) -> tuple[int, Traffic]:
    """(the gradient's bytes on the wire, what a step moves), as the record's
    framework's registry entry says for the record's settings."""
    parameters = record.get("trainable_parameters") or KNOWN_TRAINABLE_PARAMETERS.get(
        (model, int(image_size))
    )
    if not parameters:
        raise PredictError(f"no trainable parameter count for {model} at {image_size}")
    settings = {"device": record.get("device"), **record.get("settings", {})}
    spec = framework_spec(record["framework"]) if record.get("framework") in FRAMEWORKS else None
    moved = spec.traffic(settings) if spec else Traffic()
    return int(parameters) * moved.bytes_per_element, moved


SERIES_KEYS = ["framework", "model", "image_size", "batch_size", "knobs"]


def read_study_table(tidy_csv: str) -> pd.DataFrame:
    """A study's tidy table (results/STUDY/throughput.csv), each record's
    path found wherever the command runs: the table names them from the
    workflow's folder (results/STUDY/runs/...), looked for from the table's
    own folder up (a row with none keeps its empty cell); a run without
    knobs has "" there, as the series and the plan name it."""
    tidy = load_tidy(tidy_csv)
    found = [_beside(path, tidy_csv) if isinstance(path, str) else path for path in tidy["record"]]
    return tidy.assign(record=found, knobs=tidy["knobs"].fillna(""))


def _beside(path: str, tidy_csv: str) -> str:
    folder = os.path.dirname(os.path.abspath(tidy_csv))
    while not os.path.exists(os.path.join(folder, path)) and folder != os.path.dirname(folder):
        folder = os.path.dirname(folder)
    return os.path.join(folder, path)


def study_series(tidy: pd.DataFrame) -> list[Series]:
    """Every series of ok runs in a tidy table, repeats pooled per cell."""
    tidy = tidy[tidy["status"] == "ok"].assign(knobs=tidy["knobs"].fillna(""))
    found = []
    for (framework, model, image_size, batch_size, knobs), rows in tidy.groupby(SERIES_KEYS):
        records = {path: _record(path) for path in rows["record"]}
        try:
            size, moved = traffic(records[rows["record"].iloc[0]], model, image_size)
        except PredictError:
            continue
        cells = []
        for (nodes, gpus_per_node), part in rows.groupby(["nodes", "gpus_per_node"]):
            samples = []
            for path in part["record"]:
                samples += (records[path].get("images_per_sec") or {}).get("samples") or []
            std = part["images_per_sec_std"].fillna(0).mean()
            mean = part["images_per_sec_mean"].mean()
            cells.append(
                Cell(int(nodes), int(gpus_per_node), float(mean), float(std), tuple(samples))
            )
        found.append(
            Series(
                framework,
                model,
                int(image_size),
                int(batch_size),
                knobs,
                size,
                tuple(cells),
                moved.passes,
                moved.refused,
                servers=moved.servers if moved.pattern == PARAMETER_SERVER else 0,
            )
        )
    found = [_with_base_cells(series, found) for series in found]
    return sorted(found, key=lambda s: (table_order(s.framework), s.model, s.batch_size, s.knobs))


def _with_base_cells(series: Series, found: list[Series]) -> Series:
    """A parameter server's series with its ecosystem base's 1-device cells."""
    if not series.servers:
        return series
    base = base_of(series.framework)
    same = (series.model, series.image_size, series.batch_size)
    cells = [
        cell
        for other in found
        if other.framework == base and (other.model, other.image_size, other.batch_size) == same
        for cell in other.cells
        if cell.gpus == 1
    ]
    return dataclasses.replace(series, single_cells=tuple(cells))


def holdout_split(cells) -> tuple[list[Cell], list[Cell], str]:
    """(fit cells, held-out cells, the rule): nodes up to half the largest, or on
    one node, GPUs up to half the largest."""
    most_nodes = max(c.nodes for c in cells)
    if most_nodes > 1:
        limit = most_nodes // 2
        fit = [c for c in cells if c.nodes <= limit]
        return fit, [c for c in cells if c.nodes > limit], f"nodes <= {limit}"
    limit = max(c.gpus_per_node for c in cells) // 2
    fit = [c for c in cells if c.gpus_per_node <= limit]
    return fit, [c for c in cells if c.gpus_per_node > limit], f"GPUs <= {limit}"


def series_rows(frame: pd.DataFrame, series: Series) -> pd.DataFrame:
    """The rows of a per-series table (predicted, held-out) that are `series`'s."""
    return frame[
        (frame["framework"] == series.framework)
        & (frame["model"] == series.model)
        & (frame["batch_size"] == series.batch_size)
        & (frame["knobs"].fillna("") == series.knobs)
    ]
