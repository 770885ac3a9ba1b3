"""`trainscale plan --measured`'s validation, shown with every plan: how
well the plan predicts what it did not see.

- Held out, per scheme (a framework and its knobs, as the study ran it):
  the scheme's runs at its largest rank count (of two or more, its one-rank
  runs among them) are left out, the terms are fitted to the rest of the
  study (its own smaller runs among them), and
  each left-out run is predicted with its 95 % band. Per scheme: the mean
  absolute error (%) and the share of held-out runs inside their band. A
  scheme measured at one size has nothing of its own to hold out against,
  and is listed so.
- Regret: at the largest rank count the study measured more than one
  configuration, the plan fitted to the smaller runs only ranks those
  configurations; its first choice's measured rate against the best
  measured one says how much slower the plan's choice ran.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from trainscale.analysis.parallel_plan_figure import Checked, checked
from trainscale.analysis.parallel_plan_fit import (
    FittedTerms,
    fit_terms_to,
    measured_configurations,
    study_rows,
)
from trainscale.analysis.predict import PredictError


@dataclass(frozen=True)
class Validation:
    held_out: tuple[tuple[str, Checked], ...]  # (scheme, the run beside its prediction)
    one_size: tuple[str, ...]  # schemes measured at one rank count only
    ranks: int | None  # where the regret is taken
    choice: str | None  # the plan's first choice there, fitted below it
    best: str | None  # the fastest measured there
    regret: float | None  # 1 - choice's measured rate / best's


def validate(throughput: str, workload, assumed) -> Validation:
    """The study's held-out errors and the plan's regret (module docstring)."""
    rows, records = study_rows(throughput)
    rows = rows.assign(scheme=[_scheme(f, k) for f, k in zip(rows["framework"], rows["knobs"])])
    held, one_size = [], []
    for scheme, own in rows.groupby("scheme"):
        if own["gpus"].max() < 2:
            continue  # one device: no scheme of parallelism
        if own["gpus"].nunique() < 2:
            one_size.append(scheme)
            continue
        left_out = own[own["gpus"] == own["gpus"].max()]
        fitted = _fitted(rows.drop(left_out.index), records, workload, assumed)
        held += [(scheme, pair) for pair in _predicted(fitted, left_out, records)]
    ranks, choice, best, regret = _regret(rows, records, workload, assumed)
    return Validation(tuple(held), tuple(one_size), ranks, choice, best, regret)


def _scheme(framework: str, knobs: str) -> str:
    return f"{framework} {knobs}" if knobs else framework


def _fitted(fit_rows, records, workload, assumed) -> FittedTerms | None:
    """The terms fit_rows fit; None where they cannot."""
    try:
        return fit_terms_to(fit_rows, records, workload, assumed)
    except PredictError:
        return None


def _predicted(fitted: FittedTerms | None, target_rows, records) -> list[Checked]:
    """target_rows' runs predicted with `fitted`'s terms (none without them)."""
    if fitted is None:
        return []
    return checked(list(measured_configurations(target_rows, records)), fitted.terms, fitted.draws)


def _regret(rows: pd.DataFrame, records, workload, assumed):
    counts = rows.loc[rows["gpus"] > 1].groupby("gpus")["scheme"].nunique()
    if not (counts > 1).any():
        return None, None, None, None
    ranks = int(counts[counts > 1].index.max())
    below, at = rows[rows["gpus"] < ranks], rows[rows["gpus"] == ranks]
    fitted = _fitted(below, records, workload, assumed)  # once, for every scheme there
    measured, predicted = {}, {}
    for scheme, own in at.groupby("scheme"):
        pairs = _predicted(fitted, own, records)
        if not pairs:
            return ranks, None, None, None  # nothing below them to fit
        name = f"{scheme} ({pairs[0].measured.configuration.name})"
        measured[name] = np.mean([pair.measured.tokens_per_sec for pair in pairs])
        predicted[name] = pairs[0].predicted.tokens_per_sec
    choice, best = max(predicted, key=predicted.get), max(measured, key=measured.get)
    return ranks, choice, best, float(1 - measured[choice] / measured[best])


def render_validation(validation: Validation) -> str:
    """The held-out table, the per-scheme summary and the regret, as Markdown."""
    v = validation
    lines = ["", "Held out (each scheme's largest runs, predicted from the rest of the study):", ""]
    lines += ["| scheme | configuration | measured tokens/sec | predicted | error (%) | in band |"]
    lines += ["|---|---|---|---|---|---|"]
    for scheme, pair in v.held_out:
        inside = {None: "no band", True: "yes", False: "no"}[pair.inside_band]
        lines.append(
            f"| {scheme} | {pair.measured.configuration.name} | "
            f"{pair.measured.tokens_per_sec:,.0f} | {pair.predicted.tokens_per_sec:,.0f} | "
            f"{pair.error_percent:+.1f} | {inside} |"
        )
    for scheme in sorted({s for s, _ in v.held_out}):
        own = [pair for s, pair in v.held_out if s == scheme]
        mape = np.mean([abs(pair.error_percent) for pair in own])
        inside = sum(bool(pair.inside_band) for pair in own)
        lines.append(f"\n{scheme}: held-out MAPE {mape:.1f} %, {inside} of {len(own)} in band.")
    if v.one_size:
        lines.append(f"\nMeasured at one size only, nothing held out: {', '.join(v.one_size)}.")
    if v.regret is not None:
        lines.append(
            f"\nRegret at {v.ranks} ranks: fitted below them, the plan ranks {v.choice} "
            f"first; measured, it ran {100 * v.regret:.1f} % slower than the best, {v.best}."
        )
    elif v.ranks is not None:
        lines.append(f"\nRegret at {v.ranks} ranks: no fit below them to rank by.")
    return "\n".join(lines) + "\n"
