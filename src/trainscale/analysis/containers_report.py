"""A study's containers table and figure (the `container` axis): what running
the ranks inside each runtime cost against the bare host, seed 002's Fig. 3.

tables/containers.{csv,md,tex}: a row per framework, node count, GPUs per node
and container: images/sec and its ratio to the bare point of the same shape,
start-up (the launcher's start of the processes to the first timed step,
seconds_from_launch_to_first_timed_step: a container's own start counts), and
what the rank saw that is known to slow a container (trainscale.core.isolation):
/dev/shm's size, a network namespace of its own, a seccomp filter, a CPU quota;
and, where the study probed the link the point's ranks cross from inside the
same container (trainscale probe), the all-reduce's bus bandwidth at the
largest message and its ratio to the bare host's.
figures/containers.{png,pdf}: images/sec, one bar per runtime, grouped by
framework and GPU count.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from trainscale.analysis.outputs import CONTAINERS
from trainscale.catalogue.settings import RunSettings
from trainscale.core.records import read_record
from trainscale.launching.containers import BARE
from trainscale.network.probe import probe_container, read_probes, transport_of

# What makes two runs the same point but for the container. The table and the
# figure name model, batch and network only where the study varies them.
POINT = ["model", "batch_size", "network"]
SHAPE = ["framework", *POINT, "nodes", "gpus_per_node"]
GBIT = 8e-9  # bytes per second -> Gbit/s


def _busbw_gbit(record: dict, probes: list[dict]) -> float | None:
    """The all-reduce bus bandwidth (largest message) of the probe of the link
    the run's ranks cross, in its container, over its framework's transport
    (or another launcher of the same library); None where none was probed."""
    link = "inter-node" if record["nodes"] >= 2 else "intra-node"
    if record["nodes"] * record["gpus_per_node"] < 2:
        return None  # one rank talks to no one
    names = {f.name for f in dataclasses.fields(RunSettings)}
    # A record's settings are RunSettings' fields (older records lack some).
    shape = {k: record[k] for k in ("framework", "nodes", "gpus_per_node")}
    settings = RunSettings(
        **{**{k: v for k, v in record["settings"].items() if k in names}, **shape}
    )
    transport = transport_of(settings)
    container = record["settings"].get("container", BARE)
    found = [
        p
        for p in probes
        if p["link"] == link
        and probe_container(p) == container
        and transport
        and p["transport"].split("-")[0] == transport.split("-")[0]
    ]
    if not found:
        return None
    probe = min(found, key=lambda p: p["transport"] != transport)
    return probe["all_reduce"][-1]["busbw"] * GBIT


def _row(record: dict, probes: list[dict]) -> dict:
    isolation = record["provenance"].get("isolation") or {}
    container = record.get("container") or {}
    return {
        "framework": record["framework"],
        "model": record["model"],
        "batch_size": record["batch_size"],
        "network": record["settings"].get("network", ""),
        "nodes": record["nodes"],
        "gpus_per_node": record["gpus_per_node"],
        "gpus": record["nodes"] * record["gpus_per_node"],
        # Records older than the axis ran on the bare host.
        "container": record["settings"].get("container", BARE),
        "runtime": container.get("runtime", "bare host"),
        "runtime_version": container.get("runtime_version", ""),
        "images_per_sec": record["images_per_sec"]["mean"],
        "images_per_sec_std": record["images_per_sec"]["std"],
        "block_rates": record["images_per_sec"].get("samples") or [],
        "startup_seconds": record.get("seconds_from_launch_to_first_timed_step"),
        "dev_shm_mib": isolation.get("dev_shm_mib"),
        "network_namespace": isolation.get("network_namespace"),
        "seccomp": isolation.get("seccomp"),
        "cpu_quota_cores": isolation.get("cpu_quota_cores"),
        "all_reduce_busbw_gbit_per_s": _busbw_gbit(record, probes),
    }


def _combine_repeats(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per shape and container: the mean of the repeats' means and
    start-ups, and the std of all their blocks together (as the study's tables,
    trainscale.analysis.tidy)."""
    combined = []
    for _, group in rows.groupby([*SHAPE, "container"], sort=False):
        row = group.iloc[0].copy()
        blocks = np.concatenate([np.asarray(b, float) for b in group["block_rates"]])
        row["images_per_sec"] = group["images_per_sec"].mean()
        if len(group) > 1 and len(blocks) > 1:
            row["images_per_sec_std"] = float(np.std(blocks, ddof=1))
        row["startup_seconds"] = pd.to_numeric(group["startup_seconds"]).mean()
        row["repeats"] = len(group)
        combined.append(row)
    return pd.DataFrame(combined).drop(columns=["block_rates"]).reset_index(drop=True)


def containers_table(records: list[dict], probes: list[dict] = ()) -> pd.DataFrame:
    """A row per shape and container, of the ok records (repeats combined),
    with ratios to bare."""
    rows = pd.DataFrame([_row(r, list(probes)) for r in records if r["status"] == "ok"])
    if rows.empty:
        return rows
    rows = _combine_repeats(rows)
    # No quota, no probe (None): an empty cell, not the word.
    for column in ("cpu_quota_cores", "all_reduce_busbw_gbit_per_s"):
        rows[column] = pd.to_numeric(rows[column])
    bare = rows[rows["container"] == BARE].set_index(SHAPE)
    keys = list(zip(*(rows[c] for c in SHAPE)))

    def of_bare(column: str) -> list:
        return [bare[column].get(key) if key in bare.index else None for key in keys]

    rows["of_bare_images_per_sec"] = rows["images_per_sec"] / pd.Series(
        of_bare("images_per_sec"), dtype=float
    )
    rows["startup_over_bare_seconds"] = rows["startup_seconds"] - pd.Series(
        of_bare("startup_seconds"), dtype=float
    )
    rows["of_bare_busbw"] = rows["all_reduce_busbw_gbit_per_s"] / pd.Series(
        of_bare("all_reduce_busbw_gbit_per_s"), dtype=float
    )
    # A namespace of its own: not the bare run's of the same shape (one host).
    rows["own_network_namespace"] = [
        None if host is None else ns != host
        for ns, host in zip(rows["network_namespace"], of_bare("network_namespace"))
    ]
    rows["bare_first"] = rows["container"] != BARE  # the bare host first in each shape
    rows = rows.sort_values([*SHAPE, "bare_first", "container"])
    return rows.drop(columns=["network_namespace", "bare_first"]).reset_index(drop=True)


LABELS = {
    "batch_size": "batch per GPU",
    "gpus_per_node": "GPUs per node",
    "images_per_sec": "images/sec",
    "images_per_sec_std": "± std",
    "of_bare_images_per_sec": "÷ bare",
    "startup_seconds": "start-up (s)",
    "startup_over_bare_seconds": "start-up − bare (s)",
    "dev_shm_mib": "/dev/shm (MiB)",
    "own_network_namespace": "own network namespace",
    "seccomp": "seccomp (0 none, 2 filter)",
    "cpu_quota_cores": "CPU quota (cores)",
    "runtime_version": "version",
    "all_reduce_busbw_gbit_per_s": "all-reduce busbw (Gbit/s)",
    "of_bare_busbw": "busbw ÷ bare",
}


def varying(table: pd.DataFrame) -> list[str]:
    """The columns of POINT that the study varies (the others say nothing)."""
    return [c for c in POINT if not table.empty and table[c].nunique() > 1]


def plot_bars(table: pd.DataFrame, axis: str, paths: list[str], title: str) -> None:
    """Images/sec, a bar per value of `axis` (a container, a system), grouped
    by point: seed 002's Fig. 3. The groups name what the table varies."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from trainscale.analysis.plotting import legend
    from trainscale.core.records import atomic_path

    values = list(dict.fromkeys(table[axis])) if not table.empty else [BARE]
    shown = ["model", "batch_size", "network", "dataset"]
    key = ["framework", *[c for c in shown if c in table and table[c].nunique() > 1], "gpus"]
    groups = list(dict.fromkeys(zip(*(table[c] for c in key)))) if not table.empty else []
    width = 0.8 / len(values)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(groups) + 2), 4.2), layout="constrained")
    for i, name in enumerate(values):
        mine = table[table[axis] == name].set_index(key)
        heights = [mine["images_per_sec"].get(g, float("nan")) for g in groups]
        spread = mine.get("images_per_sec_std")
        errors = None if spread is None else [spread.get(g, float("nan")) for g in groups]
        xs = [x + i * width for x in range(len(groups))]
        ax.bar(xs, heights, width, yerr=errors, capsize=3, label=name or "(none)")
    ax.set_xticks([x + width * (len(values) - 1) / 2 for x in range(len(groups))])
    ax.set_xticklabels([" ".join(map(str, g[:-1])) + f"\n{g[-1]} GPU(s)" for g in groups])
    ylabel = "images/sec (± std over blocks)" if "images_per_sec_std" in table else "images/sec"
    ax.set(ylabel=ylabel, title=title)
    legend(fig, [ax])
    for path in paths:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=150)
    plt.close(fig)


def write_containers(
    records: list[str], probes: list[str], folder: str, figures: list[str]
) -> None:
    """tables/containers.* into `folder` and the figure to `figures`, from run
    records and the study's probe records."""
    from trainscale.analysis.rendering import write_table

    table = containers_table([read_record(path) for path in records], read_probes(probes))
    caption = (
        "Containers: each runtime against the bare host, same points "
        "(start-up: the launcher's start of the ranks to the first timed step)"
    )
    # GPUs in all: the figure's groups; the table has nodes and GPUs per node.
    unvaried = [c for c in POINT if c not in varying(table)]
    shown = table.drop(columns=["gpus", *unvaried], errors="ignore")
    write_table(shown, folder, CONTAINERS, caption, LABELS, data=table)
    plot_bars(table, "container", figures, "Training throughput by container runtime")
