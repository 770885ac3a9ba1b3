"""What a fault cost, framework by framework (trainscale.core.faults): a study
whose grid has a fault writes these from its records.

- tables/recovery.*: a row per run: detection, restart and recovery seconds,
  steps redone, the world before and after, goodput, and goodput as a share
  of the same framework's run without the fault (where the study has one).
- tables/goodput.*: the expected goodput at one failure every M minutes, from
  each run's measured recovery cost R (fault to the first step after) and
  checkpoint cost C. With checkpoints
  every tau seconds, Young's first-order model loses C/tau to saving and
  (tau/2 + R)/M to each failure's redone work and restart; Young's interval
  tau* = sqrt(2 C M) loses least. A framework that starts over loses all its
  work: a job of J seconds of work takes (M + R)(e^(J/M) - 1) on average
  (exponential failures, restarting from scratch), J = JOB_HOURS.
- figures/recovery_timeline.*: images/sec of each block against wall time, a
  line per framework, a panel per fault; the fault and the first step after
  it marked.
"""

from __future__ import annotations

import math

import pandas as pd

from trainscale.analysis.outputs import GOODPUT, RECOVERY
from trainscale.catalogue.registry import label, table_order
from trainscale.core.records import read_record

# Failure rates the goodput table is worked out for (minutes between failures):
# Llama 3's 405B pre-training saw one every three hours or so.
MTBF_MINUTES = (10, 60, 180)
JOB_HOURS = 1.0  # the work a framework that starts over must finish in one go

LABELS = {
    "framework": "Framework",
    "fault": "Fault",
    "gpus": "GPUs",
    "detection_seconds": "Detection (s)",
    "restart_seconds": "Restart (s)",
    "recovery_seconds": "Recovery (s)",
    "steps_redone": "Steps redone",
    "world": "World",
    "goodput_images_per_sec": "Goodput (img/s)",
    "goodput_of_no_fault": "Of no-fault goodput",
    "mtbf_minutes": "Failure every (min)",
    "recovery_cost_seconds": "R (s)",
    "checkpoint_seconds": "C (s)",
    "interval_seconds": "Interval (s)",
    "goodput_fraction": "Goodput share",
    "young_interval_seconds": "Young interval (s)",
    "goodput_fraction_at_young": "Share at Young",
}


def recovery_rows(paths: list[str]) -> pd.DataFrame:
    """A row per ok record of the study, with its fault and what it cost."""
    rows = []
    for path in paths:
        record = read_record(path)
        if record.get("status") != "ok" or "recovery" not in record:
            continue
        recovery, settings = record["recovery"], record["settings"]
        worlds = [w["world_size"] for w in recovery["world_sizes"]]
        rows.append(
            {
                "framework": record["framework"],
                "fault": settings.get("fault", "none"),
                "gpus": record["nodes"] * record["gpus_per_node"],
                "detection_seconds": recovery.get("detection_seconds"),
                "restart_seconds": recovery.get("restart_seconds"),
                "recovery_seconds": recovery.get("recovery_seconds"),
                "steps_redone": recovery.get("steps_redone"),
                "world": " → ".join(str(w) for w in worlds),
                "goodput_images_per_sec": recovery["goodput_images_per_sec"],
                "images_per_sec": record["images_per_sec"]["mean"],
                "checkpoint_seconds": recovery.get("checkpoint_seconds"),
                "interval_seconds": recovery.get("checkpoint_interval_seconds"),
                "record": path,
            }
        )
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    clean = frame[frame["fault"] == "none"].groupby(["framework", "gpus"])
    baseline = clean["goodput_images_per_sec"].mean()
    frame["goodput_of_no_fault"] = [
        row.goodput_images_per_sec / baseline.get((row.framework, row.gpus), math.nan)
        for row in frame.itertuples()
    ]
    order = frame["framework"].map(table_order)
    return frame.assign(order=order).sort_values(["order", "fault", "gpus"]).drop(columns="order")


def expected_goodput(recovery: float, checkpoint, interval, mtbf: float):
    """(share of the no-failure rate, Young's interval, share at it), seconds."""
    if pd.isna(checkpoint) or pd.isna(interval):  # starts over: the whole job is lost
        work = JOB_HOURS * 3600
        return work / ((mtbf + recovery) * math.expm1(work / mtbf)), None, None
    share = 1 - checkpoint / interval - (interval / 2 + recovery) / mtbf
    young = math.sqrt(2 * checkpoint * mtbf)
    at_young = 1 - checkpoint / young - (young / 2 + recovery) / mtbf
    return max(share, 0.0), young, max(at_young, 0.0)


def goodput_table(rows: pd.DataFrame) -> pd.DataFrame:
    """A row per faulted run and failure rate (see the module's model)."""
    table = []
    for row in rows[rows["fault"] != "none"].itertuples():
        if pd.isna(row.recovery_seconds):
            continue  # a stop: nothing restarted, no recovery to price
        for minutes in MTBF_MINUTES:
            share, young, at_young = expected_goodput(
                row.recovery_seconds, row.checkpoint_seconds, row.interval_seconds, minutes * 60
            )
            table.append(
                {
                    "framework": row.framework,
                    "fault": row.fault,
                    "gpus": row.gpus,
                    "mtbf_minutes": minutes,
                    "recovery_cost_seconds": row.recovery_seconds,
                    "checkpoint_seconds": row.checkpoint_seconds,
                    "interval_seconds": row.interval_seconds,
                    "goodput_fraction": share,
                    "young_interval_seconds": young,
                    "goodput_fraction_at_young": at_young,
                }
            )
    return pd.DataFrame(table)


def _with_outage(points: list[dict], recovery: dict) -> tuple[list, list]:
    """Each block's (end, images/sec), and nothing trained (0) from the fault
    to the first step after it: a line across the outage would say otherwise."""
    at, back = recovery.get("fault_at_seconds"), recovery.get("resumed_at_seconds")
    seconds, rates = [], []
    for point in points:
        if at is not None and point["seconds"] > at and (not seconds or seconds[-1] <= at):
            seconds += [at, back if back is not None else at]
            rates += [0.0, 0.0]
        seconds.append(point["seconds"])
        rates.append(point["images_per_sec"])
    return seconds, rates


def plot_timeline(paths: list[str], figures: list[str]) -> None:
    """Images/sec per block against wall time, a panel per fault."""
    import matplotlib.pyplot as plt

    from trainscale.analysis.plotting import framework_style, legend
    from trainscale.core.records import atomic_path

    records = [read_record(p) for p in paths]
    records = [r for r in records if r.get("status") == "ok" and r.get("timeline")]
    faults = sorted({r["settings"].get("fault", "none") for r in records} - {"none"}) or ["none"]
    fig, axes = plt.subplots(
        1, len(faults), figsize=(5.5 * len(faults), 4.2), squeeze=False, layout="constrained"
    )
    for ax, fault in zip(axes[0], faults, strict=True):
        for record in sorted(records, key=lambda r: table_order(r["framework"])):
            if record["settings"].get("fault", "none") != fault:
                continue
            points = record["timeline"]
            style = framework_style(record["framework"])
            name = f"{label(record['framework'])}, {record['nodes'] * record['gpus_per_node']} GPUs"
            recovery = record["recovery"]
            seconds, rates = _with_outage(points, recovery)
            ax.plot(seconds, rates, label=name, **style)
            if recovery.get("fault_at_seconds") is not None:
                ax.axvline(recovery["fault_at_seconds"], color=style["color"], linestyle=":")
            if recovery.get("resumed_at_seconds") is not None:
                ax.axvline(recovery["resumed_at_seconds"], color=style["color"], linestyle="--")
        ax.set(title=f"fault: {fault}", xlabel="wall time from the first timed step (s)")
        ax.set_ylabel("images/sec (each block)")
    legend(fig, axes[0])
    fig.suptitle("Throughput over wall time: the fault (dotted) and the first step after (dashed)")
    for path in figures:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=150)
    plt.close(fig)


def write_recovery(paths: list[str], folder: str, figures: list[str]) -> None:
    """tables/recovery.* and goodput.* into `folder`, the timeline to `figures`."""
    from trainscale.analysis.rendering import write_table

    def labelled(frame):
        return frame.assign(framework=frame["framework"].map(label)) if len(frame) else frame

    rows = recovery_rows(paths)
    shown = rows.drop(columns=["record", "images_per_sec", "checkpoint_seconds",
                               "interval_seconds"], errors="ignore")  # fmt: skip
    caption = "Recovery: what one fault cost each framework (trainscale.core.faults)"
    write_table(labelled(shown), folder, RECOVERY, caption, LABELS, data=rows)
    caption = (
        f"Expected goodput share at one failure every M minutes (Young's model; "
        f"a framework that starts over: a {JOB_HOURS:g} h job)"
    )
    goodput = goodput_table(rows)
    write_table(labelled(goodput), folder, GOODPUT, caption, LABELS, data=goodput)
    plot_timeline(paths, figures)
