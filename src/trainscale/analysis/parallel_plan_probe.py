"""`trainscale plan --probe`: a cluster's links from `trainscale probe`'s
records instead of a data sheet. Each record's all-reduce sweep gives the
bus bandwidth at the size the plan's data-parallel step reduces (the
model's gradient, interpolated in logs between the swept sizes, as
trainscale.analysis.predict_probe reads it for the step model) and the
latency of one ring step (predict_probe.all_reduce_link).
An intra-node record gives the link in a node, an inter-node one the
network; a term a study's records fit (--measured) keeps its fit, and a
link the fit only took equal to the other takes the probe's.
"""

from __future__ import annotations

import dataclasses
import os

from trainscale.analysis.predict_probe import all_reduce_link
from trainscale.network.probe import read_probes

# The plan's terms of each link, as StepTerms names them.
LINK_TERMS = {"intra-node": "intra", "inter-node": "inter"}


def probed_links(paths: list[str], gradient_bytes: float) -> dict[str, dict]:
    """{term: value} and {term: label} for each link a probe record measured
    (the last record of a link wins: give one per link)."""
    found: dict[str, dict] = {}
    for path, record in zip(paths, read_probes(paths), strict=True):
        link = LINK_TERMS.get(record.get("link", ""))
        sweep = record.get("all_reduce") or []
        if link is None or not sweep or record.get("ranks", 1) < 2:
            continue
        ring = all_reduce_link(record, gradient_bytes)
        where = (
            f"probed: {record['transport']} all-reduce on {record['ranks']} ranks, bus "
            f"bandwidth at {gradient_bytes / 1e6:.3g} MB ({os.path.basename(path)})"
        )
        found[link] = {
            "values": {f"{link}_gb_per_s": ring.bandwidth / 1e9, f"{link}_latency_s": ring.latency},
            "label": where,
        }
    return found


def with_probed_links(terms, draws, labels: dict, probed: dict[str, dict]):
    """The terms, their refits and labels with each probed link in place of
    an assumed one or one only taken equal to the other link."""
    draws = list(draws)
    for link in probed.values():
        values = link["values"]
        if not all(labels[name].startswith(("assumed", "taken equal")) for name in values):
            continue  # fitted to the study's own cells: the fit stands
        terms = dataclasses.replace(terms, **values)
        draws = [dataclasses.replace(draw, **values) for draw in draws]
        labels.update({name: link["label"] for name in values})
    return terms, tuple(draws), labels
