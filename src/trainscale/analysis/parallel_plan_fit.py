"""`trainscale plan`'s step terms fitted to a study's records (its tidy
throughput.csv and the records it names), with their bootstrap refits for
the plan's 95 % bands, and the study's measured configurations for
predicted-against-measured.

- A rank's achieved FLOP/s: from every one-rank run of a GPT (its record's
  training FLOPs a sequence times its sequences/sec), the plan's model's
  own where the study ran it; redrawn from each run's timed blocks.
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
from dataclasses import dataclass

import numpy as np
import pandas as pd

from trainscale.analysis.parallel_plan import (
    Cluster,
    Configuration,
    StepTerms,
    Workload,
    step_terms,
)
from trainscale.analysis.predict import BOOTSTRAP_FITS, PredictError, bootstrap
from trainscale.analysis.predict_series import read_study_table, study_series
from trainscale.catalogue.knobs import ZERO_STAGE
from trainscale.catalogue.model_parallel_knobs import (
    PIPELINE_MICROBATCHES,
    PIPELINE_SCHEDULE,
    PIPELINE_STAGES,
    TENSOR_PARALLEL,
)
from trainscale.core.gpt import GPT_SHAPES
from trainscale.core.records import read_record

# Data-parallel frameworks whose step is one all-reduce of the gradient:
# the series the links are fitted on, the first found.
ALL_REDUCE_SERIES = ("torch-ddp", "horovod-torch", "ray-train")


@dataclass(frozen=True)
class Measured:
    """A run of the study as a plan's configuration, on its own cluster shape."""

    configuration: Configuration
    workload: Workload
    cluster: Cluster
    tokens_per_sec: float
    samples: tuple[float, ...]  # its timed blocks' tokens/sec
    framework: str = ""  # what ran it, with the knobs it read

    def step_seconds(self, rng=None) -> float:
        """Its step time: from its mean, or from its blocks redrawn."""
        rate = self.tokens_per_sec
        if rng is not None and len(self.samples) > 1:
            rate = float(np.mean(rng.choice(self.samples, size=len(self.samples))))
        return self.workload.global_batch * self.workload.seq_len / rate


@dataclass(frozen=True)
class FittedTerms:
    terms: StepTerms  # the point fit
    draws: tuple[StepTerms, ...]  # the refits to redrawn records
    labels: dict[str, str]  # per StepTerms field: where its number came from
    measured: tuple[Measured, ...] = ()


def _text_rows(throughput: str) -> pd.DataFrame:
    tidy = read_study_table(throughput)
    return tidy[(tidy["status"] == "ok") & tidy["model"].isin(list(GPT_SHAPES))]


def _compute(rows: pd.DataFrame, records: dict, model: str, rng) -> tuple[float, np.ndarray, str]:
    """A rank's FLOP/s: the point, its draws and its label."""
    ones = rows[rows["gpus"] == 1]
    own = ones[ones["model"] == model]
    ones = own if len(own) else ones
    if ones.empty:
        raise PredictError("no one-rank run of a GPT to fit a rank's FLOP/s to")
    rates = []  # per run, FLOP/s per timed block: its FLOPs a sequence x sequences/sec
    for path in ones["record"]:
        record = records[path]
        rate = record["images_per_sec"]
        samples = np.asarray(rate.get("samples") or [rate["mean"]], dtype=float)
        rates.append(record["training_flops_per_image"] * samples)
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
    rows, records = study_rows(throughput)
    return fit_terms_to(rows, records, workload, assumed, seed)


def study_rows(throughput: str) -> tuple[pd.DataFrame, dict]:
    """A study's ok runs of a GPT (its tidy table's rows) and their records, by path."""
    rows = _text_rows(throughput)
    return rows, {path: read_record(path) for path in rows["record"]}


def fit_terms_to(
    rows: pd.DataFrame, records: dict, workload: Workload, assumed: StepTerms, seed: int = 0
) -> FittedTerms:
    """fit_terms on these rows of a study (a subset: the held-out validation's)."""
    rng = np.random.default_rng(seed)
    flops, flops_draws, flops_label = _compute(rows, records, workload.model, rng)
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
    measured = measured_configurations(rows, records)
    for term, uses in SCHEME_TERMS.items():
        cells = [m for m in measured if uses(m.configuration)]
        if cells:
            point = dataclasses.replace(point, **{term: _scheme_term(term, cells, point)})
            draws = [
                dataclasses.replace(d, **{term: _scheme_term(term, cells, d, rng)}) for d in draws
            ]
            labels[term] = f"fitted: the excess of {len(cells)} measured run(s) over the rest"
    if measured:
        error = model_error(measured, point)
        point = dataclasses.replace(point, model_error=error)
        draws = [dataclasses.replace(d, model_error=error) for d in draws]
        labels["model_error"] = f"fitted: the RMS error over {len(measured)} measured run(s)"
    return FittedTerms(point, tuple(draws), labels, measured)


def model_error(measured, terms: StepTerms) -> float:
    """The relative RMS error of `terms`' predictions of the measured runs
    (each on its own cluster shape) against their tokens/sec."""
    errors = [
        m.step_seconds() / sum(step_terms(m.configuration, m.cluster, m.workload, terms).values())
        - 1
        for m in measured
    ]
    return float(np.sqrt(np.mean(np.square(errors))))


# The terms a scheme's own runs fit, and which configurations use each.
SCHEME_TERMS = {
    "tensor_call_s": lambda config: config.tensor > 1,
    "send_s": lambda config: config.pipeline > 1,
    "shard_call_s": lambda config: config.shard_stage == 3 and config.data > 1,
    "partition_step_s": lambda config: config.shard_stage in (1, 2) and config.data > 1,
}


def _scheme_term(term: str, cells, terms: StepTerms, rng=None) -> float:
    """Least squares of the measured steps' excess over the prediction without
    `term`, per use of it (the step is linear in it); none below zero."""
    num = den = 0.0
    for cell in cells:
        without = dataclasses.replace(terms, **{term: 0.0})
        base = sum(step_terms(cell.configuration, cell.cluster, cell.workload, without).values())
        unit = dataclasses.replace(terms, **{term: 1.0})
        uses = sum(step_terms(cell.configuration, cell.cluster, cell.workload, unit).values())
        uses -= base
        num += uses * (cell.step_seconds(rng) - base)
        den += uses * uses
    return max(0.0, num / den)


def measured_configurations(rows: pd.DataFrame, records: dict) -> tuple[Measured, ...]:
    """The study's runs of more than one rank as the plan's configurations,
    with the workload each ran and its tokens/sec."""
    found = []
    for _, row in rows.iterrows():
        record = records[row["record"]]
        s, ranks = record["settings"], int(row["gpus"])
        config = configuration_of(row["framework"], ranks, s)
        if config is None or ranks < 2:
            continue
        library = "gloo" if s.get("device") == "cpu" else "nccl"
        shape = Cluster(int(row["nodes"]), int(row["gpus_per_node"]), float("inf"), library)
        samples = record["images_per_sec"].get("samples") or []
        tokens = tuple(s["seq_len"] * float(x) for x in samples)
        workload = workload_of(s, ranks)
        rate = float(row["tokens_per_sec_mean"])
        ran = " ".join(filter(None, [row["framework"], row["knobs"]]))
        found.append(Measured(config, workload, shape, rate, tokens, ran))
    return tuple(found)


def workload_of(settings: dict, ranks: int) -> Workload:
    """What a run of `ranks` ranks trained, from its record's settings: every
    framework's global batch is its batch size times its ranks."""
    s = settings
    return Workload(
        s["model"],
        s["seq_len"],
        s["vocab_size"],
        s["batch_size"] * ranks,
        s.get("precision", "fp32"),
        s.get("optimizer", "adam"),
    )


def configuration_of(framework: str, ranks: int, s: dict) -> Configuration | None:
    """The plan's configuration a run of `framework` on `ranks` ranks with
    settings `s` was; None for a framework the plan has no scheme for."""
    if framework in ("torch-single", "torch-ddp", "torch-fsdp", "deepspeed"):
        # DeepSpeed's stage is its knob; FSDP2 shards as ZeRO-3 does.
        stage = {"torch-single": 0, "torch-ddp": 0, "torch-fsdp": 3}.get(
            framework, s.get(ZERO_STAGE.name, 0)
        )
        return Configuration(ranks, 1, 1, int(stage))
    if framework == "torch-tp":
        tensor = s.get(TENSOR_PARALLEL.name) or ranks
        return Configuration(ranks // tensor, tensor, 1, 3 if ranks > tensor else 0)
    if framework == "torch-pipeline":
        stages = s.get(PIPELINE_STAGES.name) or ranks  # 0: one pipeline of every rank
        microbatches = s.get(PIPELINE_MICROBATCHES.name) or stages  # 0: one a stage
        schedule = s.get(PIPELINE_SCHEDULE.name, "1f1b")
        return Configuration(ranks // stages, 1, stages, 0, microbatches, schedule=schedule)
    return None
