"""A study's folder under results/: the config that explains its records, and
whether trainscale may train into it at all.

`results/{study}/config.yaml` turns the records beside it back into tables
and figures on a laptop, so it must explain every record there, always:

- A config that changes what a record measures (`measurement_settings`) is
  refused while the study has a saved config: the old records would turn
  stale and the config that explained them would be replaced.
- A config that *extends* the study (more values on its grid axes, knob
  values included, more repeats) with the same settings is welcome. The saved
  config becomes the union of both grids, so it explains the old records and
  the new; a union that only a different grid could write (it would add
  points neither config has) is refused instead.
- A folder that holds records trainscale did not measure (`source` other than
  `measured`, e.g. the published cache) is read-only: no train job may write
  into it, whatever the config says. Rebuilding its tables is fine.

Every saved config that is replaced is kept in `config.history/` first.
Checks raise ConfigError with one line naming the key, like the others in
trainscale.study.study; nothing here imports TensorFlow.
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import json
import os
import shutil
from dataclasses import dataclass, fields

from trainscale.catalogue.settings import RunSettings
from trainscale.core.records import atomic_path, atomic_write_text, record_paths
from trainscale.study.study import (
    AXES,
    SAFE_NAME,
    ConfigError,
    GridPoint,
    expand_grid,
    knob_axes,
    record_path,
)

MEASURED = "measured"
HISTORY = "config.history"
# RunSettings fields that the grid, not `benchmark:`, decides.
_POINT_FIELDS = {f.name for f in fields(GridPoint)}


def measurement_settings(config: dict) -> dict:
    """What every record of the study measured, beyond its grid point.

    The `benchmark:` settings that enter RunSettings.settings_hash (all but
    where the data lives), with RunSettings' defaults for keys left out, and
    the size of a generated data set. A benchmark setting the grid varies as a
    knob axis is the grid's business (extending a knob axis is extending).
    """
    bench = config["benchmark"]
    defaults = RunSettings(framework="tf-single")
    varied = set(knob_axes(config))
    settings = {
        f.name: bench.get(f.name, getattr(defaults, f.name))
        for f in fields(RunSettings)
        if f.name not in _POINT_FIELDS and f.name != "data_dir" and f.name not in varied
    }
    for generated in ("generate_cifar100_images", "generate_imagenet_images_per_class"):
        settings[generated] = bench.get(generated)
    return settings


def foreign_record(runs: str) -> tuple[str, str] | None:
    """The first record below `runs` that trainscale did not measure, and its source."""
    for path in record_paths(runs):
        try:
            with open(path) as handle:
                source = json.load(handle).get("source", MEASURED)
        except (OSError, ValueError, AttributeError):
            continue  # collect names a broken record; it is no reason to refuse here
        if source != MEASURED:
            return path, str(source)
    return None


def is_cache(study, root: str = ".") -> bool:
    """Whether results/{study} holds records trainscale did not measure (a
    cache such as the published study's), so it is read-only."""
    if not isinstance(study, str) or not SAFE_NAME.match(study):
        return False  # the schema refuses the name, in one line
    return foreign_record(os.path.join(root, "results", study, "runs")) is not None


@dataclass(frozen=True)
class StudyFolder:
    """What the checks decided: may the study train, and which config to save."""

    read_only: bool
    # The config results/{study}/config.yaml must hold after this run (the
    # union with the saved one), or None when the saved one already says it.
    config_to_save: dict | None


def _differing_settings(saved: dict, config: dict, path: str) -> None:
    if knob_axes(saved) != knob_axes(config):
        raise ConfigError(
            f"config key grid: study {config['study']!r} files its records by the knob axes "
            f"{knob_axes(saved)} ({path}), this config's grid has {knob_axes(config)}; "
            f"name a new study, or move results/{config['study']} away to start it again"
        )
    old, new = measurement_settings(saved), measurement_settings(config)
    keys = [key for key in new if old.get(key) != new[key]]
    if keys:
        changes = ", ".join(f"{key} {old.get(key)!r} -> {new[key]!r}" for key in keys)
        names = ", ".join(f"benchmark.{key}" for key in keys)
        raise ConfigError(
            f"config key{'s' if len(keys) > 1 else ''} {names}: study {config['study']!r} was "
            f"measured with other settings ({changes}; saved in {path}), so its records would "
            f"no longer match its config; name a new study, or move "
            f"results/{config['study']} away to start it again"
        )


def _union(values: list, more: list) -> list:
    return [*values, *(value for value in more if value not in values)]


def union_config(saved: dict, config: dict, path: str) -> dict:
    """The config that explains both the saved study's records and this one's.

    This config's keys, with every grid axis the union of both and the larger
    repeats; the constraints of whichever config makes the union exact.
    """
    grid = {**config["grid"]}
    for axis in (*AXES, *knob_axes(config)):
        grid[axis] = _union(saved["grid"][axis], config["grid"][axis])
    grid["repeats"] = max(saved["grid"].get("repeats", 1), config["grid"].get("repeats", 1))
    wanted = set(expand_grid(saved)) | set(expand_grid(config))
    candidates = [config.get("constraints", {}), saved.get("constraints", {})]
    for constraints in candidates:
        merged = {**copy.deepcopy(config), "grid": grid, "constraints": copy.deepcopy(constraints)}
        got = set(expand_grid(merged))
        if got == wanted:
            return merged
    extra = sorted(got - wanted)
    example = f" (e.g. {extra[0].stem()})" if extra else ""
    raise ConfigError(
        f"config key grid: study {config['study']!r} ({path}) and this config together are "
        f"not one grid: their union would hold points neither measures{example}; extend "
        "the saved grid instead (add values to its axes, raise repeats), or name a new study"
    )


def check_study_folder(
    config: dict, points: list[GridPoint], saved: dict | None, root: str = "."
) -> StudyFolder:
    """Refuse a config that would rewrite a study's records or their config
    (ConfigError, one line); say what to save. `saved`: the study's saved
    config with the schema's defaults filled in, or None if it has none."""
    study = config["study"]
    folder = os.path.join(root, "results", study)
    path = os.path.join(folder, "config.yaml")
    foreign = foreign_record(os.path.join(folder, "runs"))
    if foreign:
        record, source = foreign
        results = os.path.join(root, "results")
        missing = [p for p in points if not os.path.exists(record_path(study, p, results))]
        if missing:
            raise ConfigError(
                f"config key study: results/{study} holds records trainscale did not measure "
                f"(e.g. {os.path.relpath(record, root)}: source {source!r}) and is read-only, "
                f"but {len(missing)} point(s) of this grid have no record there "
                f"(e.g. {missing[0].stem()}); name a new study to measure them"
            )
        return StudyFolder(read_only=True, config_to_save=None)
    if saved is None:
        return StudyFolder(read_only=False, config_to_save=copy.deepcopy(config))
    _differing_settings(saved, config, path)
    merged = union_config(saved, config, path)
    return StudyFolder(read_only=False, config_to_save=None if merged == saved else merged)


def save_study_config(folder: str, text: str) -> str | None:
    """Write `text` as folder/config.yaml, atomically, after keeping the config it
    replaces in folder/config.history/ (named by when it was saved and by its
    content). Returns the history copy's path, if one was made."""
    target = os.path.join(folder, "config.yaml")
    kept = None
    if os.path.exists(target):
        with open(target, "rb") as handle:
            old = handle.read()
        if old == text.encode():
            return None
        saved_at = datetime.datetime.fromtimestamp(os.path.getmtime(target), datetime.UTC)
        name = f"config.{saved_at:%Y-%m-%dT%H-%M-%SZ}.{hashlib.sha256(old).hexdigest()[:8]}.yaml"
        kept = os.path.join(folder, HISTORY, name)
        if not os.path.exists(kept):
            with atomic_path(kept) as tmp:
                shutil.copyfile(target, tmp)
    atomic_write_text(target, text)
    return kept


def mislabelled_records(folder: str) -> list[tuple[str, str]]:
    """(path, path it belongs at) for each record below folder/runs/ whose path
    names knobs its framework does not read: a study folder written before runs
    were labelled only by what they read (a TensorFlow run filed under a DeepSpeed
    knob's folder belongs without it)."""
    runs = os.path.join(folder, "runs")
    moves = []
    for path in record_paths(runs):
        point = GridPoint.from_path(path)
        if point is not None and os.path.relpath(path, runs) != f"{point.stem()}.json":
            moves.append((path, os.path.join(runs, f"{point.stem()}.json")))
    return moves


def relabel_records(folder: str, dry_run: bool = False) -> tuple[list, list]:
    """Move each mislabelled record, and its train log, to the path of what it
    measured. Returns (moved, refused): a record whose new path is taken (two
    old folders held the same run) is left where it is, for the user to choose."""
    moved, refused = [], []
    for old, new in mislabelled_records(folder):
        if os.path.exists(new) or new in (n for _, n in moved):
            refused.append((old, new))
            continue
        moved.append((old, new))
        if dry_run:
            continue
        runs, logs = os.path.join(folder, "runs"), os.path.join(folder, "logs", "train")
        for source, target in (
            (old, new),
            (_log_of(old, runs, logs), _log_of(new, runs, logs)),
        ):
            if os.path.exists(source):
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.replace(source, target)
    return moved, refused


def _log_of(record: str, runs: str, logs: str) -> str:
    return os.path.join(logs, os.path.relpath(record, runs)[: -len(".json")] + ".log")
