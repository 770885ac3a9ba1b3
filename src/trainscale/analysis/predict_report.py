"""The step model's tables and figure for a study (trainscale.analysis.predict fits it):
predictions for the config's `predict` grid with 95 % bands, the fitted
parameters, and the held-out check.

With `predict.link: probe` (a study that ran the network probe), each
series' inter-node link is fixed to the probe's numbers on its network
(trainscale.analysis.predict_probe) instead of fitted; a series with no such probe
keeps the fitted link, and its parameter row says so.

Needs NumPy, SciPy and pandas: no TensorFlow, no torch.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from trainscale.analysis.outputs import (
    PREDICTED,
    PREDICTED_CROSSOVER,
    PREDICTED_HOLDOUT,
    PREDICTED_PARAMETERS,
)
from trainscale.analysis.predict import (
    PredictError,
    Series,
    StepModel,
    bootstrap,
)
from trainscale.analysis.predict_crossover import crossover_table, shown_crossover
from trainscale.analysis.predict_probe import with_probed_links
from trainscale.analysis.predict_series import holdout_split, read_study_table, study_series
from trainscale.catalogue.registry import framework_spec, label


def _feasible(series: Series, nodes: list[int], gpus_per_node: list[int]):
    spec = framework_spec(series.framework)
    for n in nodes:
        for g in gpus_per_node:
            if spec.one_device and n * g > 1:
                continue
            if spec.one_node and n > 1:
                continue
            yield n, g


def _assumed(series: Series, model: StepModel, nodes: int, gpus_per_node: int) -> str:
    """What a prediction at this cell takes beyond the series' measured
    cells, in a few words each ("" where it interpolates between them)."""
    cells = series.cells
    most_nodes = max(c.nodes for c in cells)
    most_per_node = max(c.gpus_per_node for c in cells)
    assumed = []
    if all(c.nodes * c.gpus_per_node == 1 for c in cells):
        assumed.append("no multi-GPU cell measured")
    if nodes > most_nodes:
        assumed.append(f"more nodes than measured ({most_nodes})")
    if gpus_per_node > most_per_node:
        assumed.append(f"more GPUs per node than measured ({most_per_node})")
    links = {"intra": gpus_per_node > 1, "inter": nodes > 1}
    for link in model.tied:
        if links.get(link) and not (link == "inter" and series.inter_link):
            assumed.append(f"{link}-node link never measured: taken equal to the other")
    return "; ".join(assumed)


def predicted_table(fitted: dict, nodes, gpus_per_node, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for series, result in fitted.items():
        if isinstance(result, str):
            continue
        single = series.batch_size / result.model.compute
        measured = {(c.nodes, c.gpus_per_node): c for c in series.cells}
        for n, g in _feasible(series, nodes, gpus_per_node):
            point, low, high = result.predict([n], [g], rng)
            cell = measured.get((n, g))
            rows.append(
                {
                    "framework": series.framework,
                    "model": series.model,
                    "batch_size": series.batch_size,
                    "knobs": series.knobs,
                    "nodes": n,
                    "gpus_per_node": g,
                    "gpus": n * g,
                    "predicted_images_per_sec": float(point[0]),
                    "low_images_per_sec": float(low[0]),
                    "high_images_per_sec": float(high[0]),
                    "predicted_efficiency": float(point[0]) / (n * g * single),
                    "low_efficiency": float(low[0]) / (n * g * single),
                    "high_efficiency": float(high[0]) / (n * g * single),
                    "measured_images_per_sec": cell.images_per_sec if cell else np.nan,
                    "measured_std": cell.std if cell else np.nan,
                    "assumed": _assumed(series, result.model, n, g),
                }
            )
    return pd.DataFrame(rows)


def _interval(values) -> tuple[float, float]:
    low, high = np.percentile(np.asarray(values), [2.5, 97.5])
    return float(low), float(high)


def _tied_note(series: Series, model: StepModel) -> str:
    """Say which link is fixed to the probe's, and which no cell crossed where
    it matters (not for a one-node framework's network)."""
    notes = ["inter-node link fixed to the network probe's"] if series.inter_link else []
    tied = [
        t for t in model.tied if not (t == "inter" and framework_spec(series.framework).one_node)
    ]
    if tied:
        notes.append(
            f"{tied[0]}-node link not crossed by any fitted cell: taken equal to the other"
        )
    return "; ".join(notes)


def parameters_table(fitted: dict) -> pd.DataFrame:
    """The fitted parameters with units and 95 % intervals: bandwidths in GB/s,
    latencies in µs, the overlap as a fraction of the backward pass."""
    rows = []
    for series, result in fitted.items():
        if isinstance(result, str):
            rows.append({"framework": series.framework, "model": series.model, "note": result})
            continue
        model = result.model
        row = {
            "framework": series.framework,
            "model": series.model,
            "batch_size": series.batch_size,
            "knobs": series.knobs,
            "algorithm": model.algorithm,
            "gradient_mb": series.gradient_bytes / 1e6,
            "compute_ms": model.compute * 1e3,
            "fit_rms_percent": 100 * result.rms,
        }
        links = {"intra": (0, 1), "inter": (2, 3)}
        if framework_spec(series.framework).one_node:  # no network to speak of
            links.pop("inter")
        for name, (per_byte, latency) in links.items():
            bandwidths = [1e-9 / max(r.parameters[per_byte], 1e-30) for r in result.refits]
            latencies = [r.parameters[latency] * 1e6 for r in result.refits]
            row[f"{name}_gb_per_s"] = 1e-9 / max(model.parameters[per_byte], 1e-30)
            row[f"{name}_gb_per_s_low"], row[f"{name}_gb_per_s_high"] = _interval(bandwidths)
            row[f"{name}_latency_us"] = model.parameters[latency] * 1e6
            row[f"{name}_latency_us_low"], row[f"{name}_latency_us_high"] = _interval(latencies)
        overlaps = [r.parameters[4] for r in result.refits]
        row["overlap"] = model.parameters[4]
        row["overlap_low"], row["overlap_high"] = _interval(overlaps)
        row["note"] = _tied_note(series, model)
        rows.append(row)
    return pd.DataFrame(rows)


def holdout_table(series_list: list[Series], seed: int = 0) -> pd.DataFrame:
    """Per series: fit on the smaller cells, the error on the larger ones."""
    rng = np.random.default_rng(seed)
    rows = []
    for series in series_list:
        fit_cells, held, rule = holdout_split(series.cells)
        row = {"framework": series.framework, "model": series.model,
               "batch_size": series.batch_size, "knobs": series.knobs, "fit_on": rule,
               "fit_cells": len(fit_cells), "held_out_cells": len(held)}  # fmt: skip
        if not held:
            rows.append({**row, "note": "no larger cells to hold out"})
            continue
        try:
            result = bootstrap(series, fit_cells, seed=seed)
        except PredictError as err:
            rows.append({**row, "note": str(err)})
            continue
        point, low, high = result.predict(
            [c.nodes for c in held], [c.gpus_per_node for c in held], rng
        )
        measured = np.array([c.images_per_sec for c in held])
        errors = np.abs(point / measured - 1)
        inside = int(np.sum((measured >= low) & (measured <= high)))
        rows.append(
            {
                **row,
                "algorithm": result.model.algorithm,
                "mape_percent": 100 * float(np.mean(errors)),
                "worst_percent": 100 * float(np.max(errors)),
                "inside_band": inside,
                "note": _tied_note(series, result.model),
            }
        )
    return pd.DataFrame(rows)


def fit_study(series_list: list[Series], seed: int = 0) -> dict:
    """Each series' bootstrap on all its cells, or the one line why not."""
    fitted = {}
    for series in series_list:
        if framework_spec(series.framework).one_device:
            continue
        try:
            fitted[series] = bootstrap(series, seed=seed)
        except PredictError as err:
            fitted[series] = str(err)
    return fitted


# A bandwidth (GB/s) whose refits reach 0 seconds per byte: the data do not
# bound it. Only a bandwidth: 100,000 images/sec is a throughput like any other.
UNBOUNDED_GB_PER_S = 1e5


def _band(value, low, high, digits: int = 1, spec: str = "", unbounded_above=math.inf) -> str:
    """The value and its interval, `digits` decimals (or a format `spec`);
    "unbounded" above `unbounded_above`."""
    if pd.isna(value):
        return ""
    spec = spec or f".{digits}f"
    upper = "unbounded" if high > unbounded_above else f"{high:{spec}}"
    shown = "unbounded" if value > unbounded_above else f"{value:{spec}}"
    return f"{shown} ({low:{spec}} to {upper})"


def _shown_predicted(table: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "Framework": [label(f) for f in table["framework"]],
            "Model": table["model"],
            "Batch/GPU": table["batch_size"],
            "Knobs": table["knobs"],
            "Nodes": table["nodes"],
            "GPUs per node": table["gpus_per_node"],
            "GPUs": table["gpus"],
            "Predicted images/sec (95 % band)": [
                _band(*v, digits=0)
                for v in table[
                    ["predicted_images_per_sec", "low_images_per_sec", "high_images_per_sec"]
                ].to_numpy()  # fmt: skip
            ],
            "Efficiency (95 % band)": [
                _band(*v, digits=2)
                for v in table[
                    ["predicted_efficiency", "low_efficiency", "high_efficiency"]
                ].to_numpy()  # fmt: skip
            ],
            "Measured images/sec": [
                "" if pd.isna(m) else f"{m:.0f} ± {s:.0f}"
                for m, s in zip(
                    table["measured_images_per_sec"], table["measured_std"], strict=True
                )  # fmt: skip
            ],
            "Assumed beyond the measured cells": table["assumed"],
        }
    )


def _shown_parameters(table: pd.DataFrame) -> pd.DataFrame:
    shown = {"Framework": [label(f) for f in table["framework"]], "Model": table["model"]}
    if "algorithm" not in table:
        return pd.DataFrame({**shown, "Note": table["note"]})
    shown.update(
        {
            "Algorithm": table["algorithm"].fillna(""),
            "Gradient (MB)": [f"{v:.1f}" if pd.notna(v) else "" for v in table["gradient_mb"]],
            "Compute (ms/step)": [f"{v:.1f}" if pd.notna(v) else "" for v in table["compute_ms"]],
        }
    )
    # Bandwidths to 3 significant digits: a shaped link's 0.0192 GB/s is not 0.0.
    for name, unit, spec in (("intra_gb_per_s", "Intra-node GB/s", ".3g"),
                             ("intra_latency_us", "Intra-node latency (µs)", ".0f"),
                             ("inter_gb_per_s", "Inter-node GB/s", ".3g"),
                             ("inter_latency_us", "Inter-node latency (µs)", ".0f"),
                             ("overlap", "Overlap", ".2f")):  # fmt: skip
        if name not in table:
            continue
        unbounded = UNBOUNDED_GB_PER_S if name.endswith("gb_per_s") else math.inf
        shown[unit] = [
            _band(v, lo, hi, spec=spec, unbounded_above=unbounded)
            for v, lo, hi in table[[name, f"{name}_low", f"{name}_high"]].to_numpy()
        ]
    shown["Fit error (% RMS)"] = [
        f"{v:.1f}" if pd.notna(v) else "" for v in table["fit_rms_percent"]
    ]
    shown["Note"] = table["note"].fillna("")
    return pd.DataFrame(shown)


def _shown_holdout(table: pd.DataFrame) -> pd.DataFrame:
    names = {"framework": "Framework", "model": "Model", "batch_size": "Batch/GPU",
             "knobs": "Knobs", "fit_on": "Fit on", "fit_cells": "Fit cells",
             "held_out_cells": "Held-out cells", "algorithm": "Algorithm",
             "mape_percent": "MAPE (%)", "worst_percent": "Worst (%)",
             "inside_band": "Inside the 95 % band", "note": "Note"}  # fmt: skip
    shown = table.rename(columns=names)
    shown["Framework"] = [label(f) for f in shown["Framework"]]
    for column in ("MAPE (%)", "Worst (%)"):
        if column in shown:
            shown[column] = [f"{v:.1f}" if pd.notna(v) else "" for v in shown[column]]
    if "Inside the 95 % band" in shown:
        shown["Inside the 95 % band"] = [
            f"{int(i)} of {int(n)}" if pd.notna(i) else ""
            for i, n in zip(shown["Inside the 95 % band"], shown["Held-out cells"], strict=True)
        ]
    return shown.fillna("")


TABLES = {
    PREDICTED: ("Predicted throughput and efficiency, with 95 % bands", _shown_predicted),
    PREDICTED_PARAMETERS: (
        "The fitted step model per series (95 % intervals from the bootstrap)",
        _shown_parameters,
    ),
    PREDICTED_HOLDOUT: (
        "Held-out check: fitted on the smaller cells, error on the larger ones",
        _shown_holdout,
    ),
    PREDICTED_CROSSOVER: (
        "Parameter server against all-reduce, predicted as the workers grow",
        shown_crossover,
    ),
}


def _write(table: pd.DataFrame, folder: str, name: str) -> None:
    """CSV: every number; Markdown and LaTeX: the readable columns."""
    from trainscale.analysis.rendering import to_latex, to_markdown, write_formats

    caption, shown = TABLES[name]
    empty = (
        "no parameter server and all-reduce fitted alike"
        if name == PREDICTED_CROSSOVER
        else ("no series to fit")
    )
    display = shown(table) if len(table) else pd.DataFrame({"Note": [empty]})
    display = display.astype(str)
    write_formats(folder, name, table, to_markdown(display, caption), to_latex(display, caption))


def write_predictions(
    tidy_csv: str,
    folder: str,
    figure_paths: list[str],
    nodes: list[int],
    gpus_per_node: list[int],
    seed: int = 0,
    link: str = "fitted",
    probe_paths: list[str] = (),
) -> None:
    """tables/predicted{,_parameters,_holdout,_crossover}.{csv,md,tex} and the figure, for
    a study; with `link` "probe", each series' inter-node link fixed to its
    network's probe (`probe_paths`: the study's probe records) where one ran."""
    from trainscale.analysis.figures import predicted as draw

    series_list = study_series(read_study_table(tidy_csv))
    if link == "probe":
        series_list = with_probed_links(series_list, list(probe_paths))
    fitted = fit_study(series_list, seed)
    predicted = predicted_table(fitted, nodes, gpus_per_node, seed)
    holdout = holdout_table([s for s in series_list if s in fitted], seed)
    _write(predicted, folder, PREDICTED)
    _write(parameters_table(fitted), folder, PREDICTED_PARAMETERS)
    _write(holdout, folder, PREDICTED_HOLDOUT)
    crossover = crossover_table(fitted, holdout, nodes, gpus_per_node)
    _write(crossover, folder, PREDICTED_CROSSOVER)
    draw(series_list, fitted, predicted, figure_paths)
    print(holdout.to_string(), flush=True)
