"""Every figure of the demo and of the published study, looked at as a person
would, through matplotlib's own artists: each framework has one colour in
every figure of a study, legends list frameworks in the registry's order, and
no title, label or legend text lies outside the canvas.

The published study's figures are drawn from its cached records; the demo's
from its grid (profiles/local/study.yaml) with made-up numbers, since what is
checked depends on its frameworks, knobs and labels, not on its speeds.
"""

import functools
import os
from pathlib import Path

import matplotlib
import pandas as pd
import pytest
from conftest import REPO, load_yaml

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from trainscale.analysis import predict, predict_report  # noqa: E402
from trainscale.analysis.figures import write_figures  # noqa: E402
from trainscale.analysis.predict_report import write_predictions  # noqa: E402
from trainscale.analysis.refactoring_report import write_refactoring  # noqa: E402
from trainscale.analysis.tidy import COLUMNS, add_scaling, collect  # noqa: E402
from trainscale.catalogue.registry import REGISTRY, table_order  # noqa: E402
from trainscale.core.records import is_record_name  # noqa: E402
from trainscale.study.schema import config_schema, validate_config  # noqa: E402
from trainscale.study.study import check_config, run_settings  # noqa: E402

SCHEMA = config_schema(os.path.join(REPO, "workflow", "schemas", "config.schema.yaml"))
# Longest first: "Horovod (PyTorch)" before "Horovod".
LABELS = sorted(((s.label, s.name) for s in REGISTRY), key=lambda pair: -len(pair[0]))


def records_of(study: str) -> list[str]:
    runs = Path(REPO, "results", study, "runs")
    return sorted(str(p) for p in runs.rglob("*.json") if is_record_name(p.name))


def demo_tidy() -> pd.DataFrame:
    """The demo's grid as throughput rows (made-up, plausible numbers)."""
    config = validate_config(load_yaml(os.path.join(REPO, "profiles/local/study.yaml")), SCHEMA)
    rows = []
    for point in check_config(config, root=REPO):
        settings = run_settings(config, point)
        rate = 100.0 * point.gpus * (0.7 + 0.03 * table_order(point.framework))
        rows.append({
            "study": "local-cpu", "framework": point.framework, "model": point.model,
            "dataset": settings.dataset, "image_size": settings.image_size,
            "batch_size": point.batch_size, "knobs": point.knobs_name, "nodes": point.nodes,
            "gpus_per_node": point.gpus_per_node, "gpus": point.gpus, "repeat": 1,
            "device": "cpu", "status": "ok", "images_per_sec_mean": rate,
            "images_per_sec_std": rate / 20, "blocks": 10,
            "per_gpu_images_per_sec": rate / point.gpus,
            "peak_memory_per_replica_mib": 300.0 + 10 * table_order(point.framework),
            "source": "measured", "settings_hash": "demo", "record": point.stem(),
        })  # fmt: skip
    return add_scaling(pd.DataFrame(rows)).reindex(columns=COLUMNS)


def draw_study(folder: Path, tidy: pd.DataFrame, reference: str | None, monkeypatch):
    """Every figure the workflow draws for a study (figures, predict), kept open."""
    drawn = []
    monkeypatch.setattr(plt, "close", lambda fig=None: drawn.append(fig))
    # The predicted figure's artists (lines, bands, legend, labels) are the
    # same whatever the bootstrap's count of refits; 20 of its 200 draw them
    # (the bootstrap was half of each study's predict: about 5 s here).
    monkeypatch.setattr(predict_report, "bootstrap", functools.partial(predict.bootstrap, fits=20))
    csv = folder / "throughput.csv"
    tidy.to_csv(csv, index=False)
    frameworks = sorted(set(tidy["framework"]), key=table_order)
    write_refactoring(frameworks, str(folder))
    figures = folder / "figures"
    write_figures(
        str(csv), str(figures), reference, "horovod",
        reference_records=records_of(reference) if reference else [],
        refactoring_csv=str(folder / "refactoring.csv"),
    )  # fmt: skip
    write_predictions(str(csv), str(folder), [str(figures / "predicted.png")], [1, 2, 4], [2])
    return drawn


def framework_of(label: str, *contexts: str) -> str | None:
    """The framework a legend entry is a line of: named by its label, else by
    its panel's or its figure's title (a weak-scaling figure's lines are GPU
    counts of the framework its title names); None for 'ideal', 'measured'."""
    if label in ("ideal", "measured", "target"):
        return None
    for text in (label, *contexts):
        for name, framework in LABELS:
            if text.startswith(name) or (text is not label and f" {name} " in f" {text} "):
                return framework
    return None


def colour_of(handle) -> str | None:
    line = handle.lines[0] if hasattr(handle, "lines") else handle
    return to_hex(line.get_color()) if hasattr(line, "get_color") else None


def legend_entries(fig):
    """(label, colour, framework) of every legend entry, in legend order."""
    title = fig._suptitle.get_text() if fig._suptitle else ""
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            yield label, colour_of(handle), framework_of(label, ax.get_title(), title)


def drawn_texts(fig):
    """Every text the figure draws: titles, notes, legends, axis labels, and the
    labels of the ticks in view (matplotlib keeps others, undrawn, elsewhere)."""
    yield from fig.texts
    for legend in fig.legends:
        yield from legend.get_texts()
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        yield from (ax.title, ax._left_title, ax._right_title, *ax.texts)
        if ax.get_legend():
            yield from ax.get_legend().get_texts()
        for axis in (ax.xaxis, ax.yaxis):
            yield axis.label
            low, high = sorted(axis.get_view_interval())
            for tick in (*axis.get_major_ticks(), *axis.get_minor_ticks()):
                if low <= tick.get_loc() <= high:
                    yield tick.label1


def texts_outside_the_canvas(fig) -> list[str]:
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    width, height = fig.bbox.width, fig.bbox.height
    outside = []
    if fig._suptitle:
        fig.texts.append(fig._suptitle)  # drawn like the others; read with them
    for text in drawn_texts(fig):
        if not text.get_visible() or not text.get_text().strip():
            continue
        box = text.get_window_extent(renderer)
        if box.x0 < -1 or box.y0 < -1 or box.x1 > width + 1 or box.y1 > height + 1:
            outside.append(f"{text.get_text()!r} at {box.bounds}")
    # Everything drawn, as matplotlib measures it: inside the canvas too.
    tight = fig.get_tightbbox(renderer)
    if tight.x0 < -0.01 or tight.y0 < -0.01 or tight.x1 > fig.get_figwidth() + 0.01:
        outside.append(f"the drawing's bounds {tight.bounds} (inches)")
    if tight.y1 > fig.get_figheight() + 0.01:
        outside.append(f"the drawing's bounds {tight.bounds} (inches)")
    return outside


def covered(fig) -> list[str]:
    """What a legend covers: a plot's area or the figure's title. A legend
    inside a plot covers its data, so every legend is the figure's own."""
    renderer = fig.canvas.get_renderer()
    found = [f"a legend inside {ax.get_title()!r}" for ax in fig.axes if ax.get_legend()]
    plots = [ax.get_window_extent(renderer) for ax in fig.axes if ax.get_visible()]
    title = [fig._suptitle.get_window_extent(renderer)] if fig._suptitle else []
    for legend in fig.legends:
        box = legend.get_window_extent(renderer)
        found += [f"a plot at {p.bounds}" for p in plots if box.overlaps(p)]
        found += [f"the title at {t.bounds}" for t in title if box.overlaps(t)]
    return found


def legend_order(fig) -> list[str]:
    """The frameworks of the figure's legend(s), in the order they are listed."""
    title = fig._suptitle.get_text() if fig._suptitle else ""
    order = []
    for legend in fig.legends:
        for text in legend.get_texts():
            framework = framework_of(text.get_text(), "", title)
            if framework and framework not in order:
                order.append(framework)
    return order


STUDIES = [("the demo", "local-cpu"), ("the published study", "published")]


@pytest.mark.parametrize(("what", "study"), STUDIES, ids=[s[0] for s in STUDIES])
def test_every_figure_reads_at_a_glance(what, study, tmp_path, monkeypatch, record_property):
    if study == "published":
        tidy, reference = collect("published", records_of("published")), None
    else:
        tidy, reference = demo_tidy(), "published"
    drawn = draw_study(tmp_path, tidy, reference, monkeypatch)
    assert len(drawn) >= 8
    colours: dict[str, set] = {}
    report = []
    for fig in drawn:
        name = fig._suptitle.get_text().replace("\n", " ") if fig._suptitle else "?"
        outside = texts_outside_the_canvas(fig)
        assert not outside, f"{what}, {name!r}: text outside the canvas: {outside}"
        under = covered(fig)
        assert not under, f"{what}, {name!r}: its legend covers {under}"
        for _label, colour, framework in legend_entries(fig):
            if framework and colour:
                colours.setdefault(framework, set()).add(colour)
        order = legend_order(fig)
        assert order == sorted(order, key=table_order), f"{what}, {name!r}: legend {order}"
        report.append(f"{name}: legend {order}")
    two = {f: sorted(c) for f, c in colours.items() if len(c) > 1}
    assert not two, f"{what}: a framework in more than one colour: {two}"
    assert set(colours) == set(tidy["framework"])
    # Each framework's colour is its own.
    assert len({next(iter(c)) for c in colours.values()}) == len(colours)
    palette = dict(sorted((f, next(iter(c))) for f, c in colours.items()))
    shown = [f"{what}: {len(drawn)} figures, colours {palette}"]
    record_property("figures", "\n".join(shown + report))
    print("\n".join(shown + report))


def test_the_demos_efficiency_has_a_line_for_every_framework_against_a_base_it_names():
    # The demo runs torch-ddp alone at 1 GPU: against their own 1-GPU runs the
    # other frameworks would have no efficiency; against their ecosystem's
    # single-device run (the seeds' base) each has, and its line says so.
    from trainscale.analysis.figures import against_a_base
    from trainscale.analysis.repeats import combine_repeats, ok_only
    from trainscale.catalogue.registry import base_of

    combined = ok_only(combine_repeats(demo_tidy()))
    frame = against_a_base(combined)
    assert set(frame["framework"]) == set(combined["framework"])
    for row in frame.itertuples():
        own = combined[(combined["framework"] == row.framework) & (combined["gpus"] == 1)]
        assert (row.base == "") == (len(own) > 0), row
        if row.base:  # this rate over the base's 1-GPU rate, per GPU
            assert row.base == base_of(row.framework)
            base = combined[(combined["framework"] == row.base) & (combined["gpus"] == 1)]
            rate = base["images_per_sec_mean"].iloc[0]
            assert row.efficiency == pytest.approx(row.images_per_sec_mean / rate / row.gpus)
    # The tables keep their definition: each framework's own 1-GPU run only.
    assert combined["efficiency"].isna().sum() > 0


def test_forty_frameworks_have_forty_colours_that_the_eye_tells_apart():
    # Any number of frameworks, not a hand-kept list of 17 that an 18th would
    # silently wrap around: 40 made-up ones (places 0-39 of a registry).
    import numpy as np

    from trainscale.analysis.plotting import (
        LINE_LIGHTNESS,
        _cielab,
        distinct_colours,
        framework_style,
        style_at,
    )

    styles = [style_at(index) for index in range(40)]
    lab = _cielab([style["color"] for style in styles])
    distance = np.linalg.norm(lab[:, None] - lab[None], axis=-1)
    np.fill_diagonal(distance, np.inf)
    # CIE76 delta E: about 2.3 is just noticeable; 20 is another colour.
    assert distance.min() >= 20, distance.min()
    assert all(LINE_LIGHTNESS[0] <= lightness <= LINE_LIGHTNESS[1] for lightness in lab[:, 0])
    assert len({(style["color"], style["marker"]) for style in styles}) == 40
    # The registry's frameworks are the first places: adding a 41st changes none.
    assert [framework_style(spec.name) for spec in REGISTRY] == styles[: len(REGISTRY)]
    assert distinct_colours(40)[:18] == distinct_colours(18)


def test_the_theme_is_seaborns_and_drawing_imports_no_seaborn():
    # The figures' look is seaborn's set_theme(whitegrid, paper, colorblind),
    # kept as data so that drawing never imports seaborn (about a second a
    # process with the scipy.stats it imports): held here to what seaborn sets.
    import subprocess
    import sys

    import seaborn as sns

    from trainscale.analysis.plotting import COLOR_CODES, COLORBLIND, THEME

    codes = matplotlib.colors.colorConverter.colors
    with matplotlib.rc_context():
        # From matplotlib's defaults: a figure drawn earlier in this process
        # may have left the theme in rcParams.
        plt.rcdefaults()
        plain, plain_codes = dict(plt.rcParams), {code: codes[code] for code in "bgrmyck"}
        sns.set_theme(style="whitegrid", context="paper", palette="colorblind")
        themed = {k: v for k, v in plt.rcParams.items() if plain[k] != v}
        themed_codes = {code: to_hex(codes[code]) for code in "bgrmyck"}
        codes.update(plain_codes)  # as matplotlib has them, for the other tests
    assert {code: to_hex(colour) for code, colour in COLOR_CODES.items()} == themed_codes
    del themed["image.cmap"]  # seaborn's own colormap; no figure draws an image
    assert set(THEME) == set(themed)
    for key, value in THEME.items():
        ours = plt.rcParams.validate[key](value)
        if key == "axes.prop_cycle":
            ours = [to_hex(c["color"]) for c in ours]
            themed[key] = [to_hex(c["color"]) for c in themed[key]]
        expected = pytest.approx(themed[key]) if isinstance(ours, float) else themed[key]
        assert ours == expected, key
    assert [to_hex(c) for c in sns.color_palette("colorblind", 10)] == list(COLORBLIND)
    imports = "import sys, trainscale.analysis.figures; print('seaborn' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", imports], capture_output=True, text=True,
                          check=True).stdout.split() == ["False"]  # fmt: skip


def test_the_refactoring_trade_off_draws_a_study_whose_every_run_failed(tmp_path):
    # No ok run: one empty panel, which says so (the workflow's figures rule
    # still writes every figure; a retry-then-fail study is such a study).
    from trainscale.analysis.figures import refactoring_tradeoff
    from trainscale.analysis.repeats import combine_repeats, ok_only

    failed = demo_tidy().assign(status="failed")
    refactoring = pd.DataFrame(
        {"framework": ["torch-single", "torch-ddp"], "lines_touched": [0, 26],
         "workload": ["VGG-16 on CIFAR-100"] * 2}
    )  # fmt: skip
    paths = [str(tmp_path / "refactoring_tradeoff.png")]
    refactoring_tradeoff(ok_only(combine_repeats(failed)), refactoring, paths)  # as write_figures
    assert (tmp_path / "refactoring_tradeoff.png").stat().st_size > 0


def test_the_containers_figure_reads_at_a_glance(tmp_path, monkeypatch):
    # Seed 002's Fig. 3: a bar per container in each group (framework, GPUs),
    # its height the table's images/sec; nothing off the canvas or under the legend.
    from test_containers import _record

    from trainscale.analysis.containers_report import containers_table, plot_bars

    records = [
        _record(container, rate * gpus, 4.0, gpus=gpus)
        for gpus in (1, 2)
        for container, rate in (("none", 100.0), ("charliecloud", 99.0), ("podman", 90.0))
    ]
    table = containers_table(records)
    drawn = []
    monkeypatch.setattr(plt, "close", lambda fig=None: drawn.append(fig))
    plot_bars(table, "container", [str(tmp_path / "containers.png")], "Throughput by container")
    (fig,) = drawn
    assert not texts_outside_the_canvas(fig) and not covered(fig)
    ax = fig.axes[0]
    handles, labels = ax.get_legend_handles_labels()
    assert labels == ["none", "charliecloud", "podman"]
    heights = {
        (label, round(bar.get_x())): bar.get_height()
        for handle, label in zip(handles, labels, strict=True)
        for bar in handle.patches
    }
    assert heights[("podman", 1)] == pytest.approx(180.0)  # 2 GPUs: the second group
    assert heights[("none", 0)] == pytest.approx(100.0)
