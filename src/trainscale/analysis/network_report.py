"""A study's network table and figure, from its probe records (trainscale.network.probe).

tables/network.{csv,md,tex}: a row per probe (network, container, transport, link):
the one-way latency of a 1-byte ping-pong, the ping-pong bandwidth and the
all-reduce's bus bandwidth at the largest message, in Gbit/s, and the
ping-pong's share of the network's rated speed where cluster.networks gives
one. figures/network.{png,pdf}: bandwidth against message size, a line per
network, container (where not the bare host), transport and measure, a panel
per link: seed 002's Fig. 2.
"""

from __future__ import annotations

import pandas as pd

from trainscale.analysis.outputs import NETWORK
from trainscale.network.probe import DEFAULT_NETWORK, probe_container, read_probes

GBIT = 8e-9  # bytes per second -> Gbit/s


def _network_name(record: dict) -> str:
    return record["network"] or DEFAULT_NETWORK


def _series_name(record: dict) -> str:
    """Network, container (unless the bare host) and transport: a figure's line."""
    container = probe_container(record)
    inside = [] if container == "none" else [container]
    return " ".join([_network_name(record), *inside, record["transport"]])


def network_table(records: list[dict], rated_gbit: dict[str, float]) -> pd.DataFrame:
    """A row per probe; `rated_gbit`: a network's rated speed by name (if known)."""
    rows = []
    for r in records:
        ping, reduce = r["ping_pong"], r["all_reduce"]
        incast = r.get("incast") or []  # a probe of 3 ranks or more, since issue 31
        network = _network_name(r)
        rated = rated_gbit.get(network)
        ping_gbit = ping[-1]["bandwidth"] * GBIT if ping else None
        rows.append(
            {
                "network": network,
                "container": probe_container(r),
                "transport": r["transport"],
                "backend": r["backend"],
                "link": r["link"],
                "ranks": r["ranks"],
                "latency_us": ping[0]["latency"] * 1e6 if ping else None,
                "all_reduce_smallest_us": reduce[0]["seconds"] * 1e6,
                "largest_bytes": reduce[-1]["bytes"],
                "ping_pong_gbit_per_s": ping_gbit,
                "all_reduce_busbw_gbit_per_s": reduce[-1]["busbw"] * GBIT,
                # The server's link: on one node all of it, across nodes the
                # remote workers' share (the network's).
                "incast_server_link_gbit_per_s": (
                    incast[-1]["network_bw" if r["link"] == "inter-node" else "server_link_bw"]
                    * GBIT
                    if incast
                    else None
                ),
                "rated_gbit_per_s": rated,
                "ping_pong_of_rated": ping_gbit / rated if rated and ping_gbit else None,
            }
        )
    table = pd.DataFrame(rows)
    # A column only where some probe ran in a container.
    if not table.empty and (table["container"] == "none").all():
        table = table.drop(columns=["container"])
    return table


LABELS = {
    "latency_us": "latency (µs, 1 B)",
    "all_reduce_smallest_us": "all-reduce 4 B (µs)",
    "largest_bytes": "largest (B)",
    "ping_pong_gbit_per_s": "ping-pong (Gbit/s)",
    "all_reduce_busbw_gbit_per_s": "all-reduce busbw (Gbit/s)",
    "incast_server_link_gbit_per_s": "incast, server link (Gbit/s)",
    "rated_gbit_per_s": "rated (Gbit/s)",
    "ping_pong_of_rated": "ping-pong / rated",
}


def network_curves(records: list[dict]) -> pd.DataFrame:
    """Bandwidth (Gbit/s) against message size: a row per record, measure and size."""
    rows = []
    for r in records:
        series = _series_name(r)
        for p in r["ping_pong"]:
            rows.append((r["link"], f"{series} ping-pong", p["bytes"], p["bandwidth"] * GBIT))
        for c in r["all_reduce"]:
            rows.append((r["link"], f"{series} all-reduce busbw", c["bytes"], c["busbw"] * GBIT))
        for c in r.get("incast") or []:
            rows.append(
                (r["link"], f"{series} incast server link", c["bytes"], c["server_link_bw"] * GBIT)
            )
    return pd.DataFrame(rows, columns=["link", "series", "bytes", "gbit_per_s"])


def plot_network(curves: pd.DataFrame, paths: list[str], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from trainscale.analysis.plotting import legend
    from trainscale.core.records import atomic_path

    links = sorted(curves["link"].unique(), reverse=True) or ["no probe"]
    fig, axes = plt.subplots(
        1, len(links), figsize=(5.5 * len(links), 4.2), squeeze=False, layout="constrained"
    )
    # One colour per series in every panel (a link's panel lacks some).
    colours = {name: f"C{i % 10}" for i, name in enumerate(sorted(curves["series"].unique()))}
    for ax, link in zip(axes[0], links, strict=True):
        for series, rows in curves[curves["link"] == link].groupby("series"):
            dashed = "--" if "all-reduce" in series else "-"
            ax.plot(rows["bytes"], rows["gbit_per_s"], dashed, marker=".", label=series,
                    color=colours[series])  # fmt: skip
        ax.set(xscale="log", yscale="log", title=link, xlabel="message (bytes)")
        ax.set_ylabel("bandwidth (Gbit/s)")
    legend(fig, axes[0])  # below the panels, where it covers no curve
    fig.suptitle(title)
    for path in paths:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=150)
    plt.close(fig)


def write_network(paths: list[str], folder: str, figures: list[str], rated_gbit: dict) -> None:
    """tables/network.* into `folder` and the figure to `figures`, from probe records."""
    from trainscale.analysis.rendering import write_table

    records = read_probes(paths)
    caption = "Network probe: latency and bandwidth between ranks, by network and transport"
    write_table(network_table(records, rated_gbit), folder, NETWORK, caption, LABELS)
    plot_network(network_curves(records), figures, "Bandwidth against message size")
