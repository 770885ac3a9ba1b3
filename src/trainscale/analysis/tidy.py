"""From run records to the tidy table: each record checked, one row per run,
speed-up and efficiency. pandas, no TensorFlow, no torch.

Definitions (also in the docs: explanation/definitions.md):
- speed-up of a run = its total images/sec / the images/sec of the SAME
  framework's 1-GPU run (1 node x 1 GPU) with the same model, batch, data,
  image size and device;
- weak-scaling efficiency = speed-up / GPUs (1.0 is perfect: the batch per GPU
  is fixed, so N GPUs should train N times as many images per second);
- repeats of a grid point combine into one row (trainscale.analysis.repeats).

The tables are trainscale.analysis.tables; their rendering trainscale.analysis.rendering.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np
import pandas as pd

from trainscale.catalogue.registry import label as framework_label
from trainscale.catalogue.registry import table_order
from trainscale.catalogue.settings import RunSettings, all_settings, panel_knobs, reads_setting
from trainscale.core.gpt import GPT_SHAPES, parameter_count
from trainscale.core.records import read_record
from trainscale.core.setting import renamed
from trainscale.study.study import KNOB_AXES, GridPoint, join_knobs, knob_text, parse_knobs

SETTING_DEFAULTS = {
    f.name: f.default
    for f in dataclasses.fields(RunSettings)
    if f.default is not dataclasses.MISSING
}

# `knobs`: the grid's knob axes at a point ('precision=fp16+xla=true'; '' when
# the grid varies none), read from the record's path (trainscale.study.study).
POINT = [
    "framework",
    "model",
    "dataset",
    "image_size",
    "batch_size",
    "knobs",
    "nodes",
    "gpus_per_node",
]
SETTING = ["framework", "model", "dataset", "image_size", "batch_size", "knobs", "device"]
COLUMNS = [
    "study",
    *POINT,
    "gpus",
    "repeat",
    "device",
    "status",
    "images_per_sec_mean",
    "images_per_sec_std",
    "tokens_per_sec_mean",
    "trainable_parameters",
    "memory_capacity_per_replica_mib",
    "blocks",
    "per_gpu_images_per_sec",
    "achieved_tflops",
    "mfu",
    "peak_memory_per_replica_mib",
    "gpu_utilisation_percent",
    "gpu_memory_peak_mib",
    "energy_per_image_joules",
    "energy_per_token_joules",
    "speedup",
    "efficiency",
    "source",
    "settings_hash",
    "record",
]


def add_series(frame: pd.DataFrame) -> pd.DataFrame:
    """Split each row's knobs into where the tables and figures show them.

    `panel_knobs`: the knobs every framework of these records reads
    (trainscale.catalogue.settings.panel_knobs: precision; xla too when all are
    TensorFlow's): a table block or figure panel each, like model and batch
    size, so frameworks are compared at equal settings. `series`: the
    framework plus the other knobs it reads ('<framework> <knob>=<value>',
    e.g. Horovod's compression): a column or line of its own.
    """
    frame = frame.copy()
    panel = panel_knobs(set(frame["framework"]))
    shared, series = [], []
    for framework, knobs in zip(frame["framework"], frame["knobs"], strict=True):
        pairs = parse_knobs(knobs)
        shared.append(join_knobs(p for p in pairs if p[0] in panel))
        own = join_knobs(
            p for p in pairs if p[0] not in panel and framework in (KNOB_AXES.get(p[0]) or ())
        )
        series.append(f"{framework} {own}" if own else framework)
    frame["panel_knobs"] = shared
    frame["series"] = series
    return frame


def series_label(series: str) -> str:
    """'<framework> <knob>=<value>' -> '<its label> (<knob>=<value>)'."""
    framework, _, own = series.partition(" ")
    return f"{framework_label(framework)} ({own})" if own else framework_label(framework)


def series_order(series: str) -> tuple:
    framework, _, own = series.partition(" ")
    rank = table_order(framework)
    return (rank, framework, own)


ENERGY = ("energy_per_image_joules", "energy_per_token_joules")


def _or_nan(value) -> float:
    return math.nan if value is None else value


def measured_settings(record: dict) -> dict:
    """What the record was measured with, every setting named: a setting newer
    than the record was at its default when it was measured, and one written
    under a former name (iterations) reads as now."""
    return {**SETTING_DEFAULTS, **renamed(record.get("settings") or {}, all_settings())}


def record_knobs(record: dict, point: GridPoint | None, knob_axes: list[str] | None) -> str:
    """The run's knobs, 'name=value+...': from the record's own settings, for
    each of the study's knob axes (`knob_axes`) its framework reads; from the
    grid point its path names (`point`) where the record has no settings (or
    the study's axes are not given), as an old record's folder names them.
    check_record holds the two equal for every record of a study."""
    if record.get("settings") and knob_axes is not None:
        measured = measured_settings(record)
        read = [n for n in knob_axes if reads_setting(record["framework"], n)]
        return join_knobs((name, knob_text(measured.get(name))) for name in read)
    return point.knobs_name if point else ""


def record_row(study: str, path: str, knob_axes: list[str] | None = None) -> dict:
    """The run's tidy row: its record's numbers and settings (its knobs:
    record_knobs); its repeat, the study's index, from its path."""
    record = read_record(path)
    rate = record.get("images_per_sec") or {}
    point = GridPoint.from_path(path)
    gpus = record["nodes"] * record["gpus_per_node"]
    mean = rate.get("mean")
    gpu = record.get("gpu_utilisation")
    return {
        "study": study,
        "framework": record["framework"],
        "model": record["model"],
        "dataset": record["dataset"],
        "image_size": record["image_size"],
        "batch_size": record["batch_size"],
        "knobs": record_knobs(record, point, knob_axes),
        "nodes": record["nodes"],
        "gpus_per_node": record["gpus_per_node"],
        "gpus": gpus,
        "repeat": point.repeat if point else 1,
        "device": record["device"],
        "status": record["status"],
        "images_per_sec_mean": mean,
        "images_per_sec_std": rate.get("std"),
        # A text model's examples are sequences: its rate in tokens too.
        "tokens_per_sec_mean": (record.get("tokens_per_sec") or {}).get("mean", math.nan),
        "trainable_parameters": trainable_parameters(record),
        # What one replica had to fit in (the GPU's memory, or the CPU's share).
        "memory_capacity_per_replica_mib": (
            record.get("memory_capacity_per_replica_bytes") or math.nan
        )
        / 2**20,  # fmt: skip
        "blocks": len(rate.get("samples") or []) or np.nan,
        "per_gpu_images_per_sec": mean / gpus if mean is not None else None,
        # Model FLOPs utilisation (trainscale.harness.flops); None where the device's
        # peak is unknown (CPUs) or the record predates it.
        "achieved_tflops": record.get("achieved_tflops"),
        "mfu": record.get("mfu"),
        # Per replica (trainscale.harness.training._record).
        "peak_memory_per_replica_mib": (record.get("peak_memory_bytes") or math.nan) / 2**20,
        # NVML's, on GPUs (trainscale.core.gpu_monitor); NaN on CPUs.
        "gpu_utilisation_percent": gpu["utilisation_percent"]["mean"] if gpu else math.nan,
        "gpu_memory_peak_mib": gpu["memory_used_bytes"]["peak"] / 2**20 if gpu else math.nan,
        # NVML's energy counter over the timed blocks (trainscale.core.timing).
        **{key: _or_nan(record.get(key)) for key in ENERGY},
        "source": record.get("source", "measured"),
        "settings_hash": record.get("settings_hash"),
        "record": path,
    }


def trainable_parameters(record: dict) -> float:
    """The model's parameters: the record's count, or for a text model that
    ran out of memory before counting them, the GPT formula's."""
    if record.get("trainable_parameters"):
        return record["trainable_parameters"]
    settings = record.get("settings") or {}
    if record.get("model") in GPT_SHAPES and settings.get("seq_len") and settings.get("vocab_size"):
        return parameter_count(record["model"], settings["seq_len"], settings["vocab_size"])
    return math.nan


def add_scaling(frame: pd.DataFrame) -> pd.DataFrame:
    """Add speedup and efficiency against the same framework's 1-GPU run."""
    frame = frame.copy()
    ok = frame[(frame["status"] == "ok") & (frame["gpus"] == 1)]
    baseline = ok.groupby(SETTING)["images_per_sec_mean"].mean().rename("baseline")
    frame = frame.join(baseline, on=SETTING)
    frame["speedup"] = frame["images_per_sec_mean"] / frame["baseline"]
    frame["efficiency"] = frame["speedup"] / frame["gpus"]
    return frame.drop(columns="baseline")


class CollectError(ValueError):
    """A record cannot be used; the message names the file."""


GRID_KEYS = ("framework", "model", "batch_size", "nodes", "gpus_per_node")


def check_record(path: str, expected: dict | None = None) -> dict:
    """Read a record and refuse it, naming the file, if it cannot be trusted.

    Refused: a truncated or non-JSON file, an unknown schema, a record whose
    grid point differs from the one its path names, and (given `expected`, the
    settings the study's config asks for at that point) one measured with
    other settings. Never skipped, never guessed.
    """
    import json

    try:
        record = read_record(path)
    except json.JSONDecodeError as err:
        raise CollectError(
            f"{path}: truncated or not JSON ({err.msg}); delete it to rerun"
        ) from None
    except ValueError as err:
        raise CollectError(str(err)) from None
    measured = measured_settings(record)
    point = GridPoint.from_path(path)
    if point:
        named = {key: getattr(point, key) for key in GRID_KEYS}
        found = {key: record.get(key) for key in GRID_KEYS}
        # The knobs its folder names, as the record's settings have them.
        for name, value in point.knobs:
            named[name] = knob_text(value)
            found[name] = knob_text(measured.get(name)) if name in measured else None
        if found != named:
            wrong = {k: found[k] for k in named if found[k] != named[k]}
            raise CollectError(
                f"{path}: the record is of another grid point than its path ({wrong})"
            )
    if expected is not None and record.get("source", "measured") == "measured":
        # A setting its framework does not read was passed to it by older
        # studies (DeepSpeed's ZeRO stage to TensorFlow): it changed nothing measured.
        read = [k for k in expected if k != "data_dir" and reads_setting(record["framework"], k)]
        differ = sorted(k for k in read if measured.get(k) != expected[k])
        if differ:
            shown = ", ".join(f"{k}={measured.get(k)!r} (config: {expected[k]!r})" for k in differ)
            raise CollectError(
                f"{path}: measured with other settings than the study's config: {shown}; "
                "delete the record to measure it again, or restore the config"
            )
    return record


def collect(
    study: str, paths: list[str], expected: dict | None = None, knob_axes: list | None = None
) -> pd.DataFrame:
    """One tidy row per run record, with speed-up and efficiency.

    `expected` maps record paths to the settings the config asks for there;
    `knob_axes` are the study's (record_knobs).
    Records of different devices are never averaged together (the device is
    part of every grouping key); a study that mixes devices is refused.
    """
    expected = expected or {}
    for path in sorted(paths):
        check_record(path, expected.get(path))
    rows = [record_row(study, p, knob_axes) for p in sorted(paths)]
    devices = sorted({row["device"] for row in rows})
    if len(devices) > 1:
        by_device = {d: [r["record"] for r in rows if r["device"] == d][:3] for d in devices}
        raise CollectError(f"study {study} mixes devices {devices}: e.g. {by_device}")
    frame = pd.DataFrame(rows, columns=[c for c in COLUMNS if c not in ("speedup", "efficiency")])
    frame = add_scaling(frame)
    return frame[COLUMNS].sort_values(POINT + ["repeat"], kind="stable").reset_index(drop=True)


def load_tidy(path: str) -> pd.DataFrame:
    return pd.read_csv(path)


# --------------------------------------------------------------------------
# What the workflow's rules write (each script calls one of these)
# --------------------------------------------------------------------------


def write_throughput(
    study: str,
    records: list[str],
    output: str,
    expected: dict | None = None,
    knob_axes: list | None = None,
) -> pd.DataFrame:
    from trainscale.core.records import atomic_write_text

    tidy = collect(study, records, expected, knob_axes)
    atomic_write_text(output, tidy.to_csv(index=False))
    print(f"collect: {len(tidy)} records of study {study} -> {output}")
    return tidy


def write_plan(study: str, rows: list[dict], output: str) -> str:
    """Write plan.csv (one row per run with its job shape); return a short summary."""
    from trainscale.core.records import atomic_write_text

    plan = pd.DataFrame(rows)
    plan["cached"] = [os.path.exists(path) for path in plan["record"]]
    atomic_write_text(output, plan.to_csv(index=False))
    summary = plan.groupby("framework").agg(
        runs=("record", "size"),
        cached=("cached", "sum"),
        max_gpus=("gpus_per_node", "max"),
        gpu_hours=("gpu_hours", "sum"),
    )
    lines = [
        f"plan of study {study}: {len(plan)} runs, {int(plan['cached'].sum())} cached, "
        f"{plan['gpu_hours'].sum():.1f} GPU-hours at the runtime limits",
        summary.to_string(),
    ]
    return "\n".join(lines)
