"""The drawing every figure of trainscale.analysis.figures shares: one panel per
(model, batch size, shared knobs), one line per series in a fixed colour and
marker, one legend, written as PNG and PDF atomically. matplotlib, in
seaborn's look (THEME).
"""

from __future__ import annotations

import functools

import matplotlib

matplotlib.use("Agg")  # files only, no display (clusters and CI have none)

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from trainscale.analysis.tables import PANEL  # noqa: E402
from trainscale.analysis.tidy import series_label  # noqa: E402
from trainscale.catalogue.registry import FRAMEWORKS, table_order  # noqa: E402
from trainscale.core.records import atomic_path  # noqa: E402

THROUGHPUT = "Throughput (images/sec, all GPUs)"
# Filled markers: a framework's own; open ones mark its variants (variant_style).
MARKERS = ("o", "s", "D", "^", "v", "P", "*", "X", "h", "p", "<", ">", "d", "H", "8")
# A colour for a line on white: neither faint nor next to black.
LINE_LIGHTNESS = (25.0, 70.0)  # CIELAB L*

# seaborn 0.13's colorblind palette, and what its set_theme(style="whitegrid",
# context="paper", palette="colorblind") sets, as data: importing seaborn
# (and scipy.stats with it) took about a second of every process that draws
# (bench/README.md). tests/workflow/test_figures.py holds both to seaborn's.
COLORBLIND = (
    "#0173b2", "#de8f05", "#029e73", "#d55e00", "#cc78bc",
    "#ca9161", "#fbafe4", "#949494", "#ece133", "#56b4e9",
)  # fmt: skip
_TICKS = {"color": ".15", "major.size": 4.8, "major.width": 1.0}
_TICKS.update({"minor.size": 3.2, "minor.width": 0.8, "labelsize": 8.8})
THEME = {
    **{f"xtick.{key}": value for key, value in _TICKS.items()},
    **{f"ytick.{key}": value for key, value in _TICKS.items()},
    "xtick.bottom": False,
    "ytick.left": False,
    "axes.axisbelow": True,
    "axes.edgecolor": ".8",
    "axes.grid": True,
    "axes.labelcolor": ".15",
    "axes.labelsize": 9.6,
    "axes.linewidth": 1.0,
    "axes.prop_cycle": matplotlib.cycler(color=COLORBLIND),
    "axes.titlesize": 9.6,
    "font.sans-serif": ["Arial", "DejaVu Sans", "Liberation Sans", "Bitstream Vera Sans"]
    + ["sans-serif"],
    "font.size": 9.6,
    "grid.color": ".8",
    "legend.fontsize": 8.8,
    "legend.title_fontsize": 9.6,
    "lines.linewidth": 1.2,
    "lines.markersize": 4.8,
    "lines.solid_capstyle": "round",
    "patch.edgecolor": "w",
    "patch.force_edgecolor": True,
    "patch.linewidth": 0.8,
    "text.color": ".15",
}


# set_theme's colour codes too: "k" (an error bar's default colour) a dark
# grey, "bgrmyc" the palette's (seaborn's colorblind6).
COLOR_CODES = dict(zip("bgrmyc", (COLORBLIND[i] for i in (0, 2, 3, 4, 8, 9))), k=(0.1, 0.1, 0.1))


def set_theme() -> None:
    """Every figure's look: THEME and COLOR_CODES (seaborn's whitegrid, paper, colorblind)."""
    plt.rcParams.update(THEME)
    for code, colour in COLOR_CODES.items():
        matplotlib.colors.colorConverter.colors[code] = matplotlib.colors.to_rgb(colour)


def _cielab(rgb) -> np.ndarray:
    """sRGB (0-1, last axis) to CIELAB under D65: distances there are what
    the eye tells apart (CIE76's delta E)."""
    rgb = np.asarray(rgb, dtype=np.float64)
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    to_xyz = np.array(
        [[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]
    )
    xyz = linear @ to_xyz.T / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.stack(
        [116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]), 200 * (f[..., 1] - f[..., 2])], -1
    )


@functools.lru_cache(maxsize=8)
def distinct_colours(count: int) -> tuple:
    """`count` colours, each the one farthest (in CIELAB) from every colour
    before it among the sRGB colours of LINE_LIGHTNESS: seaborn's colorblind
    blue, orange, green and vermilion first. Greedy, so the first k are the
    same for any count: a framework added to the registry changes no other's."""
    levels = np.linspace(0.0, 1.0, 16)
    grid = np.stack(np.meshgrid(levels, levels, levels, indexing="ij"), -1).reshape(-1, 3)
    lab = _cielab(grid)
    line = (lab[:, 0] >= LINE_LIGHTNESS[0]) & (lab[:, 0] <= LINE_LIGHTNESS[1])
    grid, lab = grid[line], lab[line]
    chosen = [matplotlib.colors.to_rgb(c) for c in COLORBLIND[:4]][:count]
    nearest = np.full(len(grid), np.inf)
    for colour in chosen:
        nearest = np.minimum(nearest, np.linalg.norm(lab - _cielab(colour), axis=-1))
    while len(chosen) < count:
        best = int(np.argmax(nearest))
        chosen.append(tuple(float(x) for x in grid[best]))
        nearest = np.minimum(nearest, np.linalg.norm(lab - lab[best], axis=-1))
    return tuple(chosen)


# A framework's lines that differ by something else (hosts, GPUs, a knob of
# its own, measured vs reference) differ by line style, then by an open marker.
LINESTYLES = ("-", "--", ":", "-.")


def style_at(index: int) -> dict:
    """The colour and marker of the `index`-th framework: a colour no other
    framework has (distinct_colours), for any number of frameworks."""
    colours = distinct_colours(max(index + 1, len(FRAMEWORKS) + 1))  # one cached call
    return {"color": colours[index], "marker": MARKERS[index % len(MARKERS)]}


def framework_style(framework: str) -> dict:
    """The colour and marker of `framework` in every figure of every study:
    fixed by its place in the registry, so a reader learns them once (a
    framework no longer registered takes the place after the last)."""
    return style_at(table_order(framework))


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
    set_theme()
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


# A bar's GPU count, where bars of several counts stand side by side.
HATCHES = ("", "//", "..", "xx", "\\\\", "++", "--", "||", "oo", "**")


def bars(ax, frame: pd.DataFrame, names: list[str], counts: list[int], x: str) -> None:
    """A group of bars per series of `names` (in that order, each in its
    framework's colour): one bar per value of `x` it has, hatched by that
    value's place in `counts`, the group centred on its tick; the spread as
    an error bar. The legend says which hatch is which."""
    width = 0.8 / len(counts)
    for j, name in enumerate(names):
        rows = frame[frame["series"] == name].sort_values(x)
        colour = framework_style(rows["framework"].iloc[0])["color"]
        for i, row in enumerate(rows.itertuples(index=False)):
            offset = (i - (len(rows) - 1) / 2) * width
            hatch = HATCHES[counts.index(getattr(row, x)) % len(HATCHES)]
            ax.bar(
                j + offset,
                row.images_per_sec_mean,
                width,
                yerr=row.images_per_sec_std,
                color=colour,
                hatch=hatch,
                capsize=3,
                edgecolor="white",
                linewidth=0,
            )
    for i, count in enumerate(counts):
        key = plt.Rectangle((0, 0), 0, 0, facecolor="lightgray", edgecolor="dimgray")
        key.set(hatch=HATCHES[i % len(HATCHES)], label=plural(count, "GPU"))
        ax.add_patch(key)
    ax.set_xticks(range(len(names)), [series_label(name) for name in names])
    ax.tick_params(axis="x", labelrotation=30)
    for label in ax.get_xticklabels():
        label.set_horizontalalignment("right")


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
