"""The step model meets the network probe (trainscale.network.probe): per series, the
inter-node link the model fits beside the one the probe measured on the
series' network, and the held-out error with the link fitted and with it
fixed to the probe's numbers.

- The model's link bandwidth is nccl-tests' bus bandwidth: a ring moves
  2(p-1)/p x B bytes at it (trainscale.analysis.predict), so it compares with the
  probe's all-reduce busbw at the gradient's size (interpolated between the
  swept sizes, in logs). Its latency is per ring step: the probe's smallest
  all-reduce over its 2(n-1) steps.
- The fit here sees the inter-node link once: it is fitted on the 1-node
  cells and the smallest multi-node cell, and held out on the other cells
  (link_split). Fitted that way and again with the inter-node link fixed to
  the probe's (Series.inter_link), the held-out error says which link
  explains the larger cells. The `predict.link: probe` setting fixes it the
  same way for the study's predictions (trainscale.analysis.predict_report).
- A fitted bandwidth more than AGREEMENT_FACTOR from the probe's is flagged:
  the probe moves one buffer between otherwise idle ranks, a step moves the
  gradient between busy ones, so the two agree within a factor, not exactly.

A series whose network has no inter-node probe (a published study) keeps the
fitted link alone, and its row says so.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from trainscale.analysis.outputs import PREDICTED_VS_PROBE
from trainscale.analysis.predict import Cell, PredictError, Series, StepModel, best_fit
from trainscale.catalogue.registry import framework_spec
from trainscale.catalogue.settings import SETTING, RunSettings
from trainscale.network.probe import probe_container, read_probes
from trainscale.study.study import parse_knobs

AGREEMENT_FACTOR = 2.0


@dataclass(frozen=True)
class ProbedLink:
    bandwidth: float  # bytes per second: the all-reduce's bus bandwidth at the gradient's size
    latency: float  # seconds per ring step
    ranks: int


def probed_link(series: Series, probes: list[dict]) -> ProbedLink | None:
    """The inter-node probe of the series' network, container and transport, if one ran."""
    knobs = dict(parse_knobs(series.knobs))
    values = {k: SETTING[k].from_text(v) for k, v in knobs.items() if k in SETTING}
    settings = RunSettings(framework=series.framework, **values)
    transport = framework_spec(series.framework).launch.probe_transport(settings)
    # A launcher the grid does not vary is not in the series' knobs: a probe
    # of the same library over another launcher (horovod-gloo for -mpi) then
    # stands for it, the series' own first.
    family = transport.split("-")[0]
    found = [
        p
        for p in probes
        if p["link"] == "inter-node"
        and p["network"] == knobs.get("network", "")
        and probe_container(p) == knobs.get("container", "none")
        and p["transport"].split("-")[0] == family
    ]
    if not transport or not found:
        return None
    record = min(found, key=lambda p: p["transport"] != transport)
    return all_reduce_link(record, series.gradient_bytes)


def all_reduce_link(record: dict, size: float) -> ProbedLink:
    """A probe record's link as a ring sees it: the all-reduce's bus
    bandwidth at `size` bytes (interpolated in logs between the swept
    sizes) and the latency of one of its 2 (n - 1) steps (the smallest
    all-reduce's time over them)."""
    sweep = record["all_reduce"]
    sizes = np.log([row["bytes"] for row in sweep])
    busbw = np.log([row["busbw"] for row in sweep])
    bandwidth = float(np.exp(np.interp(math.log(size), sizes, busbw)))
    steps = 2 * (record["ranks"] - 1)
    return ProbedLink(bandwidth, sweep[0]["seconds"] / steps, record["ranks"])


def with_link(series: Series, link: ProbedLink) -> Series:
    """The series with its inter-node link fixed to the probe's."""
    return dataclasses.replace(series, inter_link=(1 / link.bandwidth, link.latency))


def with_probed_links(series_list: list[Series], probe_paths: list[str]) -> list[Series]:
    """Each series with its network's probed inter-node link fixed (the
    `predict.link: probe` setting); a series with no such probe as it was."""
    probes = read_probes(probe_paths)
    found = [(series, probed_link(series, probes)) for series in series_list]
    return [with_link(series, link) if link else series for series, link in found]


def link_split(cells) -> tuple[list[Cell], list[Cell]]:
    """(fit, held out): the 1-node cells and the multi-node cell of fewest GPUs; the rest."""
    across = sorted((c for c in cells if c.nodes > 1), key=lambda c: (c.gpus, c.nodes))
    fit = [c for c in cells if c.nodes == 1] + across[:1]
    return fit, across[1:]


def _mape(model: StepModel, held) -> float:
    predicted = model.images_per_sec([c.nodes for c in held], [c.gpus_per_node for c in held])
    measured = np.array([c.images_per_sec for c in held])
    return 100 * float(np.mean(np.abs(predicted / measured - 1)))


def probe_row(series: Series, probes: list[dict]) -> dict:
    """One series: fitted and probed inter-node link, agreement, held-out errors."""
    row = {"framework": series.framework, "model": series.model,
           "batch_size": series.batch_size, "knobs": series.knobs}  # fmt: skip
    link = probed_link(series, probes)
    fit, held = link_split(series.cells)
    try:
        fitted, _ = best_fit(series, fit)
    except PredictError as err:
        return {**row, "note": str(err)}
    spb, latency = fitted.parameters[2:4]
    row.update(
        algorithm=fitted.algorithm,
        fit_cells=len(fit),
        held_out_cells=len(held),
        fitted_inter_gb_per_s=1e-9 / spb if spb > 0 else math.inf,
        fitted_inter_latency_us=latency * 1e6,
        fitted_held_out_mape_percent=_mape(fitted, held) if held else None,
    )
    if "inter" in fitted.tied:
        return {**row, "note": "no multi-node cell: the inter-node link is not fitted"}
    if link is None:
        return {**row, "note": "no inter-node probe of this network: the fitted link stands alone"}
    ratio = row["fitted_inter_gb_per_s"] / (link.bandwidth * 1e-9)
    agrees = 1 / AGREEMENT_FACTOR <= ratio <= AGREEMENT_FACTOR
    pinned, _ = best_fit(with_link(series, link), fit)
    return {
        **row,
        "probe_inter_gb_per_s": link.bandwidth * 1e-9,
        "probe_inter_latency_us": link.latency * 1e6,
        "fitted_over_probe": ratio,
        "agrees": agrees,
        "probe_link_held_out_mape_percent": _mape(pinned, held) if held else None,
        "note": "" if agrees
        else f"fitted and probed bandwidth differ by more than {AGREEMENT_FACTOR:g}x",
    }  # fmt: skip


def probe_table(series_list: list[Series], probe_paths: list[str]) -> pd.DataFrame:
    probes = read_probes(probe_paths)
    rows = [
        probe_row(s, probes)
        for s in series_list
        if not framework_spec(s.framework).one_device and any(c.nodes > 1 for c in s.cells)
    ]
    if not probe_paths:
        rows = [{**r, "note": "no probe in this study: the fitted link stands alone"} for r in rows]
    return pd.DataFrame(rows)


LABELS = {
    "fit_cells": "fit cells",
    "held_out_cells": "held-out cells",
    "fitted_inter_gb_per_s": "fitted inter-node GB/s",
    "fitted_inter_latency_us": "fitted latency (µs)",
    "probe_inter_gb_per_s": "probe busbw GB/s",
    "probe_inter_latency_us": "probe latency (µs)",
    "fitted_over_probe": "fitted / probe",
    "fitted_held_out_mape_percent": "held-out MAPE, link fitted (%)",
    "probe_link_held_out_mape_percent": "held-out MAPE, probe's link (%)",
}


def write_probe_comparison(tidy_csv: str, probe_paths: list[str], folder: str) -> None:
    """tables/predicted_vs_probe.{csv,md,tex}: the fitted link beside the probe's."""
    from trainscale.analysis.predict_series import read_study_table, study_series
    from trainscale.analysis.rendering import write_table

    table = probe_table(study_series(read_study_table(tidy_csv)), probe_paths)
    if table.empty:
        table = pd.DataFrame({"note": ["no series spans two nodes: no inter-node link to fit"]})
    caption = (
        "The step model's inter-node link beside the network probe's, fitted on the "
        f"1-node cells and one multi-node cell (flagged beyond {AGREEMENT_FACTOR:g}x)"
    )
    write_table(table, folder, PREDICTED_VS_PROBE, caption, LABELS)
    print(table.to_string(), flush=True)
