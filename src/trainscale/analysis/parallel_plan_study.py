"""The cells `trainscale plan` would measure next, written as a study, so
that `plan -> snakemake -> plan --measured` closes the loop:

- the cells that fit a term still assumed: a one-rank run of the model
  (a rank's FLOP/s), torch-ddp on one node at 1 rank and at every power of
  two up to the node's GPUs (the link in a node; the step model takes the
  compute from the series' own one-rank cell), and on 2 nodes of 1 rank
  where the plan spans nodes (the network);
- the first configuration that fits, that a trainscale framework runs and
  that the study has not measured yet, at its full size, to hold the
  plan's first choice against a measurement; and the next such
  configuration too when the refits put it first in more than SWAP_SHARE
  of draws (the ranking is not settled between the two).
"""

from __future__ import annotations

import numpy as np

from trainscale.analysis.parallel_plan import Cluster, Prediction, Workload

SWAP_SHARE = 0.05


def swap_share(first: Prediction, second: Prediction) -> float:
    """The share of the refits in which `second` is faster than `first`."""
    if not first.draw_rates:
        return 0.0
    return float(np.mean(np.array(second.draw_rates) > np.array(first.draw_rates)))


def next_cells(
    predictions: list[Prediction], cluster: Cluster, labels: dict, measured=()
) -> list[tuple]:
    """(framework, nodes, GPUs per node, knobs, why) of each cell to measure."""
    cells = []
    if not labels["flops_per_sec"].startswith("fitted"):
        cells.append(("torch-single", 1, 1, {}, "a rank's FLOP/s"))
    if not labels["intra_gb_per_s"].startswith("fitted"):
        counts = [g for g in (1, 2, 4, 8, 16, 32) if g <= cluster.gpus_per_node]
        cells += [("torch-ddp", 1, g, {}, "the link in a node") for g in counts]
    if cluster.nodes > 1 and not labels["inter_gb_per_s"].startswith("fitted"):
        cells += [("torch-ddp", n, 1, {}, "the network") for n in (1, 2)]
    done = {m.configuration.name for m in measured}
    runnable = [
        p
        for p in predictions
        if p.fits and p.configuration.frameworks() and p.configuration.name not in done
    ]
    chosen = runnable[:1]
    if len(runnable) > 1 and swap_share(*runnable[:2]) > SWAP_SHARE:
        chosen = runnable[:2]
    for rank, p in enumerate(chosen, 1):
        framework, knobs = p.configuration.frameworks()[0]
        cells.append((framework, cluster.nodes, cluster.gpus_per_node, knobs, f"choice {rank}"))
    return list({cell[:3] + (tuple(cell[3].items()),): cell for cell in cells}.values())


def study_config(
    name: str, cells: list[tuple], workload: Workload, cluster: Cluster, device: str
) -> dict:
    """A study of `cells`: their frameworks, sizes and knobs as grid axes, each
    framework held to its own sizes and knob values by `constraints.only`."""
    knob_values: dict[str, set] = {}
    only = []
    for framework in dict.fromkeys(cell[0] for cell in cells):
        mine = [cell for cell in cells if cell[0] == framework]
        then = {
            "nodes": sorted({c[1] for c in mine}),
            "gpus_per_node": sorted({c[2] for c in mine}),
        }
        for _, _, _, knobs, _ in mine:
            for knob, value in knobs.items():
                knob_values.setdefault(knob, set()).add(value)
                then[knob] = sorted({*then.get(knob, []), value})
        only.append({"when": {"framework": framework}, "then": then})
    replicas = cluster.nodes * cluster.gpus_per_node
    grid = {
        "framework": list(dict.fromkeys(cell[0] for cell in cells)),
        "nodes": sorted({cell[1] for cell in cells}),
        "gpus_per_node": sorted({cell[2] for cell in cells}),
        "model": [workload.model],
        "batch_size": [max(1, workload.global_batch // replicas)],
        **{knob: sorted(values) for knob, values in knob_values.items()},
    }
    benchmark = {
        "dataset": "synthetic",
        "seq_len": workload.seq_len,
        "device": device,
        "vocab_size": workload.vocabulary,
        "optimizer": workload.optimizer,
    }
    if workload.precision != "fp32":
        benchmark["precision"] = workload.precision
    return {
        "study": name,
        "reference": None,
        "train_env": ".venv-train",
        "torch_env": ".venv-torch",
        "grid": grid,
        "constraints": {"only": only},
        "benchmark": benchmark,
        "figures": {"weak_scaling_framework": "torch-ddp"},
    }
