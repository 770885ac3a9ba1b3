"""The drawing every figure of trainscale.analysis.figures shares: one panel per
(model, batch size, shared knobs), one line per series in a fixed colour and
marker, one legend, written as PNG and PDF atomically. matplotlib + seaborn.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only, no display (clusters and CI have none)

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from trainscale.analysis.tables import PANEL  # noqa: E402
from trainscale.analysis.tidy import series_label  # noqa: E402
from trainscale.core.records import atomic_path  # noqa: E402
from trainscale.study.registry import table_order  # noqa: E402

THROUGHPUT = "Throughput (images/sec, all GPUs)"
# seaborn's colorblind palette has pink, grey, yellow and light blue last,
# too faint for a line on white: their dark versions take their places; then
# black, a dark olive, a dark purple, a dark teal, a brick red, a navy and
# an ochre: 17 frameworks, 17 colours (the filled markers run out at 15).
PALETTE = (
    sns.color_palette("colorblind", n_colors=6)
    + sns.color_palette("dark")[6:10]
    + [(0.0, 0.0, 0.0), (0.4, 0.4, 0.0), (0.35, 0.0, 0.45), (0.0, 0.3, 0.3)]
    + [(0.6, 0.15, 0.1), (0.1, 0.1, 0.45), (0.7, 0.5, 0.0)]
)
MARKERS = ("o", "s", "D", "^", "v", "P", "*", "X", "h", "p", "<", ">", "d", "H", "8", "+", "x")
# A framework's lines that differ by something else (hosts, GPUs, a knob of
# its own, measured vs reference) differ by line style, then by an open marker.
LINESTYLES = ("-", "--", ":", "-.")


def framework_style(framework: str) -> dict:
    """The colour and marker of `framework` in every figure of every study:
    fixed by its place in the registry, so a reader learns them once."""
    index = table_order(framework)
    return {"color": PALETTE[index % len(PALETTE)], "marker": MARKERS[index % len(MARKERS)]}


def variant_style(framework: str, variant: int) -> dict:
    """The style of a framework's `variant`-th line (0 first): its colour and
    marker, a line style of its own, the marker open from the fifth on."""
    style = framework_style(framework)
    style["linestyle"] = LINESTYLES[variant % len(LINESTYLES)]
    if variant // len(LINESTYLES) % 2:
        style["markerfacecolor"] = "white"
    return style


def wrapped(text: str, inches: float, fontsize: float = 12.0) -> str:
    """`text` broken into lines that fit `inches` at `fontsize` points: a title
    or note wider than its figure is cut off at both edges, not shrunk."""
    import textwrap

    # An average character is a little over half the font size wide.
    width = max(20, int(inches * 72 / (0.6 * fontsize)))
    return "\n".join(textwrap.fill(line, width) for line in text.split("\n"))


def panels_of(frame: pd.DataFrame):
    """The figure and one panel per (model, batch size, shared knobs) the frame holds.

    Small multiples, not one tangle: a big study (5 models x 7 batch sizes)
    would otherwise draw hundreds of lines with a legend larger than the plot.
    Yields (axes, that variant's rows); the figure is the first thing yielded.
    """
    sns.set_theme(style="whitegrid", context="paper", palette="colorblind")
    variants = sorted(frame[PANEL].drop_duplicates().itertuples(index=False))
    count = max(1, len(variants))
    columns = min(4, count)
    rows = -(-count // columns)
    # Constrained layout measures every tick label of every panel: fine for a
    # few panels, most of the drawing time for dozens; those get fixed margins.
    fig, axes = plt.subplots(
        rows,
        columns,
        figsize=(max(6.4, 3.4 * columns), max(4.2, 2.8 * rows)),
        layout="constrained" if count <= 4 else None,
        squeeze=False,
    )
    if count > 4:
        inch = 1 / fig.get_figheight()
        fig.subplots_adjust(
            left=0.07, right=0.98, top=1 - 0.9 * inch, bottom=1.2 * inch, hspace=0.5, wspace=0.3
        )
    flat = list(axes.flat)
    for ax in flat[count:]:
        ax.set_visible(False)
    if not variants:
        return fig, [(flat[0], frame)]
    panels = []
    for ax, (model, batch_size, knobs) in zip(flat, variants, strict=False):
        part = frame[
            (frame["model"] == model)
            & (frame["batch_size"] == batch_size)
            & (frame["panel_knobs"] == knobs)
        ]
        if len(variants) > 1:
            title = f"{model}, batch {batch_size}/GPU" + (f"\n{knobs}" if knobs else "")
            # A fixed y: matplotlib otherwise measures every tick label of
            # every panel at each draw to place titles (a third of the time).
            ax.set_title(title, fontsize="small", y=1.0)
        panels.append((ax, part))
    return fig, panels


def lines(ax, frame, x, hue, label, y="images_per_sec_mean", err="images_per_sec_std"):
    """One line per value of `hue`, in its framework's colour and marker; a
    framework's lines apart by line style (the same in every panel)."""
    for key, part in sorted(frame.groupby(hue), key=lambda kv: kv[0]):
        part = part.sort_values(x)
        framework = part["framework"].iloc[0]
        name = label(key)
        variants = _variants.setdefault(framework, {})
        index = variants.setdefault(name, len(variants))
        _legend_order.setdefault(name, (table_order(framework), framework, index))
        ax.errorbar(
            part[x],
            part[y],
            yerr=part[err] if err else None,
            label=name,
            capsize=3,
            **variant_style(framework, index),
        )


# Per figure: each framework's line labels, in the order first drawn, and
# where each goes in the legend (registry order, then that order).
_variants: dict[str, dict[str, int]] = {}
_legend_order: dict[str, tuple] = {}


def finish(fig, panels, paths: list[str], title: str, note: str | None = None):
    """The figure's title, one legend outside the plots (in registry order),
    its note, written as PNG and PDF."""
    fig.suptitle(wrapped(title, fig.get_figwidth()))
    for ax, _ in panels:
        if ax.has_data():
            if ax.get_yscale() == "linear":
                ax.set_ylim(bottom=0)
        else:
            ax.text(
                0.5, 0.5, "no ok runs to plot", ha="center", va="center", transform=ax.transAxes
            )
    if len(panels) > 1:  # one y label per row of panels
        for ax, _ in panels:
            if ax.get_subplotspec().colspan.start > 0:
                ax.set_ylabel("")
    # Lines of no framework (ideal, target) after the frameworks.
    legend(fig, [ax for ax, _ in panels], lambda label: _legend_order.get(label, (float("inf"),)))
    if note:
        fig.text(
            0.01, 0.005, wrapped(note, fig.get_figwidth(), 7), fontsize="x-small", color="dimgray"
        )
    for path in paths:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=150 if len(panels) <= 4 else 80)
    plt.close(fig)
    _variants.clear()
    _legend_order.clear()


def legend(fig, axes, order=None) -> None:
    """The figure's one legend, of every labelled line of `axes` (a label's
    first), sorted by `order` (a key of the label; None: as drawn). Below
    every plot: inside a plot it covers data, and beside it it runs into the
    figure's title. The figure grows by the legend's rows, so the plots keep
    their size."""
    handles = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    if not handles:
        return
    labels = sorted(handles, key=order) if order else list(handles)
    where = "outside lower center" if fig.get_layout_engine() else "lower center"
    # As many columns as the figure's width holds (about 12 characters an
    # inch at this size): long labels (knobs) get fewer.
    longest = max(len(label) for label in labels) + 6
    ncols = max(1, min(4, len(labels), int(fig.get_figwidth() * 12 // longest)))
    if fig.get_layout_engine():
        fig.set_figheight(fig.get_figheight() + 0.22 * -(-len(labels) // ncols))
    fig.legend(
        [handles[label] for label in labels], labels, loc=where, ncols=ncols, fontsize="small"
    )


def integer_ticks(ax, values):
    ticks = sorted({int(v) for v in values})
    if ticks:
        ax.set_xticks(ticks)


def plural(count, word: str) -> str:
    return f"{count} {word}{'s' if count > 1 else ''}"


def host_series(frame: pd.DataFrame) -> list[str]:
    """'Horovod, 2 hosts': one line per series (framework and its own knobs) and host count."""
    return [
        f"{series_label(s)}, {plural(n, 'host')}"
        for s, n in zip(frame["series"], frame["nodes"], strict=True)
    ]


def plot(frame, x, hue, label, xlabel, ylabel, y="images_per_sec_mean", err="images_per_sec_std"):
    """Every figure's body: its panels, one line per `hue` value in each."""
    fig, panels = panels_of(frame)
    for ax, variant in panels:
        lines(ax, variant, x, hue, label, y=y, err=err)
        integer_ticks(ax, variant[x])
        ax.set(xlabel=xlabel, ylabel=ylabel)
    return fig, panels
