"""`trainscale plan --measured`'s figure: every configuration the study
measured, its measured tokens/sec against the plan's prediction of it with
the 95 % band, on the line where the two are equal. A point off the line by
more than its band is a term the plan has wrong (how-to: Plan a run on
your cluster)."""

from __future__ import annotations

from dataclasses import dataclass

from trainscale.analysis.parallel_plan import MemoryBudget, Prediction, plan_one
from trainscale.analysis.parallel_plan_fit import Measured


@dataclass(frozen=True)
class Checked:
    """A measured configuration beside the plan's prediction of it."""

    measured: Measured
    predicted: Prediction

    @property
    def error_percent(self) -> float:
        return 100 * (self.predicted.tokens_per_sec / self.measured.tokens_per_sec - 1)

    @property
    def inside_band(self) -> bool | None:
        """Whether the measured rate is inside the band; None without a band."""
        band = self.predicted.band
        return None if band is None else band[0] <= self.measured.tokens_per_sec <= band[1]


def checked(measured: list[Measured], terms, draws) -> list[Checked]:
    """Each measured configuration predicted on its own cluster shape with
    the plan's terms (and their refits, for the band)."""
    return [
        Checked(m, plan_one(m.configuration, m.cluster, m.workload, MemoryBudget(), terms, draws))
        for m in measured
    ]


def draw_predicted_against_measured(pairs: list[Checked], path: str) -> None:
    """The figure, to `path` (PNG): measured on x, predicted on y, both in
    tokens/sec on log axes; a colour and a marker for each framework as it
    ran (its knobs too), each point labelled with its configuration and error."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9.6, 5.2))
    figure.subplots_adjust(left=0.09, right=0.58, top=0.92, bottom=0.1)  # the legend at the right
    ran = sorted({pair.measured.framework for pair in pairs})
    rates = []
    for pair in pairs:
        x, y = pair.measured.tokens_per_sec, pair.predicted.tokens_per_sec
        band = pair.predicted.band
        index = ran.index(pair.measured.framework)
        colour, marker = plt.get_cmap("tab10")(index % 10), "osD^v<>ph*"[index % 10]
        first = pair is next(p for p in pairs if p.measured.framework == pair.measured.framework)
        axes.errorbar(
            x,
            y,
            # No band (every term assumed): the point alone, hollow.
            yerr=None if band is None else [[y - band[0]], [band[1] - y]],
            fmt=marker,
            color=colour,
            mfc="none" if band is None else colour,
            label=(pair.measured.framework or "measured") if first else None,
        )
        label = f"{pair.measured.configuration.name} ({pair.error_percent:+.0f} %)"
        axes.annotate(label, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=6.5)
        rates += [x, y, *(band or ())]
    # A band whose low end is 0 (Prediction.band, once the model's error is
    # over 51 %) runs off the bottom of the log axes: limits from the rest.
    shown = [rate for rate in rates if rate > 0]
    low, high = min(shown) / 1.5, max(shown) * 1.5
    axes.plot([low, high], [low, high], color="grey", linewidth=0.8, label="predicted = measured")
    axes.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high))
    axes.set_xlabel("measured tokens/sec")
    axes.set_ylabel("predicted tokens/sec (95 % band)")
    axes.set_title("The plan against what the study measured")
    axes.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7, frameon=False)
    figure.savefig(path, dpi=120)
    plt.close(figure)
