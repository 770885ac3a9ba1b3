"""`trainscale plan`'s step terms fitted to a study's records (its tidy
throughput.csv and the records it names), with their bootstrap refits for
the plan's 95 % bands, and the study's measured configurations for
predicted-against-measured.

- A rank's achieved FLOP/s: from every one-rank run of a GPT (its FLOPs a
  token, trainscale.core.gpt, times its tokens/sec), the plan's model's own
  where the study ran it; redrawn from each run's timed blocks.
- The links and the overlap: the step model (trainscale.analysis.predict)
  fitted to the plain data-parallel series (torch-ddp, else another whose
  step is one all-reduce) of that model, or of the largest GPT the study
  ran: seconds per byte and per ring step in a node and across nodes, and
  the share of the backward pass the exchange hides behind. A link no
  measured cell crossed is taken equal to the other, as the step model
  takes it, and the plan says so.

Needs NumPy, SciPy and pandas: no TensorFlow, no torch.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from trainscale.analysis.parallel_plan import Configuration, StepTerms, Workload
from trainscale.analysis.predict import BOOTSTRAP_FITS, PredictError, bootstrap
from trainscale.analysis.predict_series import study_series
from trainscale.catalogue.knobs import ZERO_STAGE
from trainscale.core.gpt import GPT_SHAPES, training_flops_per_token

# Data-parallel frameworks whose step is one all-reduce of the gradient:
# the series the links are fitted on, the first found.
ALL_REDUCE_SERIES = ("torch-ddp", "horovod-torch", "ray-train")


@dataclass(frozen=True)
class FittedTerms:
    terms: StepTerms  # the point fit
    draws: tuple[StepTerms, ...]  # the refits to redrawn records
    labels: dict[str, str]  # per StepTerms field: where its number came from
    measured: tuple[tuple[Configuration, Workload, float], ...] = ()  # with tokens/sec


def _records(rows: pd.DataFrame) -> list[dict]:
    found = []
    for path in rows["record"]:
        with open(path) as handle:
            found.append(json.load(handle))
    return found


def _text_rows(throughput: str) -> pd.DataFrame:
    tidy = pd.read_csv(throughput)
    tidy = tidy[(tidy["status"] == "ok") & tidy["model"].isin(list(GPT_SHAPES))]
    return tidy.assign(knobs=tidy["knobs"].fillna(""))


def _compute(rows: pd.DataFrame, model: str, rng) -> tuple[float, np.ndarray, str]:
    """A rank's FLOP/s: the point, its draws and its label."""
    ones = rows[rows["gpus"] == 1]
    own = ones[ones["model"] == model]
    ones = own if len(own) else ones
    if ones.empty:
        raise PredictError("no one-rank run of a GPT to fit a rank's FLOP/s to")
    rates = []  # per run, FLOP/s per timed block
    for record in _records(ones):
        s = record["settings"]
        per_sequence = training_flops_per_token(s["model"], s["seq_len"], s["vocab_size"])
        per_sequence *= s["seq_len"]
        samples = record["images_per_sec"].get("samples") or [record["images_per_sec"]["mean"]]
        rates.append(per_sequence * np.asarray(samples, dtype=float))
    point = float(np.mean([r.mean() for r in rates]))
    draws = np.array(
        [np.mean([rng.choice(r, size=len(r)).mean() for r in rates]) for _ in range(BOOTSTRAP_FITS)]
    )
    models = ", ".join(sorted(set(ones["model"])))
    return point, draws, f"fitted: {len(rates)} one-rank run(s) of {models}"


def _link_series(tidy: pd.DataFrame, model: str):
    found = [s for s in study_series(tidy) if s.framework in ALL_REDUCE_SERIES and not s.refused]
    found = [s for s in found if len({c.gpus for c in s.cells}) > 1]
    if not found:
        return None
    own = [s for s in found if s.model == model]
    pool = own or sorted(found, key=lambda s: -list(GPT_SHAPES).index(s.model))
    return min(pool, key=lambda s: ALL_REDUCE_SERIES.index(s.framework))


def _link_terms(parameters) -> dict:
    per_byte_intra, latency_intra, per_byte_inter, latency_inter, overlap = parameters
    return {
        "intra_gb_per_s": 1e-9 / max(per_byte_intra, 1e-18),
        "intra_latency_s": latency_intra,
        "inter_gb_per_s": 1e-9 / max(per_byte_inter, 1e-18),
        "inter_latency_s": latency_inter,
        "overlap": overlap,
    }


def fit_terms(
    throughput: str, workload: Workload, assumed: StepTerms, seed: int = 0
) -> FittedTerms:
    """The terms the study's records fit; the others stay `assumed`'s."""
    rng = np.random.default_rng(seed)
    rows = _text_rows(throughput)
    flops, flops_draws, flops_label = _compute(rows, workload.model, rng)
    labels = {name: "assumed" for name in _link_terms((1, 0, 1, 0, 0))}
    labels["flops_per_sec"] = flops_label
    point = dataclasses.replace(assumed, flops_per_sec=flops)
    draws = [dataclasses.replace(assumed, flops_per_sec=float(f)) for f in flops_draws]
    series = _link_series(rows, workload.model)
    if series is not None:
        fit = bootstrap(series, fits=BOOTSTRAP_FITS)
        point = dataclasses.replace(point, **_link_terms(fit.model.parameters))
        draws = [
            dataclasses.replace(draw, **_link_terms(refit.parameters))
            for draw, refit in zip(draws, fit.refits, strict=True)
        ]
        where = f"fitted: {series.name}, {len(series.cells)} cells"
        for name in labels:
            if name != "flops_per_sec":
                labels[name] = where
        for link in fit.model.tied:
            for name in (f"{link}_gb_per_s", f"{link}_latency_s"):
                labels[name] = (
                    f"taken equal to the other link: no measured cell crossed it ({where})"
                )
    return FittedTerms(point, tuple(draws), labels, measured_configurations(rows))


def measured_configurations(rows: pd.DataFrame) -> tuple:
    """The study's data-parallel runs as the plan's configurations, with the
    workload each ran and its tokens/sec: DDP, FSDP2 and ZeRO's stages."""
    found = []
    for (_, row), record in zip(rows.iterrows(), _records(rows), strict=True):
        s, d = record["settings"], int(row["gpus"])
        stage = {"torch-ddp": 0, "torch-fsdp": 3}.get(row["framework"])
        if row["framework"] == "deepspeed":
            stage = int(s.get(ZERO_STAGE.name, 0))
        if stage is None or d < 2:
            continue
        precision = s.get("precision", "fp32")
        workload = Workload(
            s["model"],
            s["seq_len"],
            s["vocab_size"],
            s["batch_size"] * d,
            precision,
            s.get("optimizer", "sgd"),
        )
        found.append((Configuration(d, 1, 1, stage), workload, float(row["tokens_per_sec_mean"])))
    return tuple(found)
