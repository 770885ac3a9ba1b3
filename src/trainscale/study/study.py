"""A study: its configuration, checked, and the grid of runs it expands to.

Pure Python (plus jsonschema and PyYAML): the Snakemake layer and the tests
use it without TensorFlow. The JSON schema (workflow/schemas/config.schema.yaml)
checks types and names; `check_config` adds what a schema cannot say well
(duplicates, a constraint that leaves no run, a reference study that does not
exist, a model/image-size pair the harness would refuse) and always reports
ONE line naming the key.

Validity rules are data, not code. A *clause* maps axes to conditions:
    {framework: [tf-mirrored, tf-single], nodes: {min: 2}}
matches a run when every axis condition holds (a list: one of; a mapping:
min/max bounds; a scalar: equal). Axes: framework, model, batch_size, nodes,
gpus_per_node, gpus (total). `constraints` then has
    max_total_gpus: N           runs with more GPUs are left out
    exclude: [clause, ...]      runs matching any clause are left out
    only: [{when: clause, then: clause}, ...]
                                runs matching `when` must also match `then`
e.g. "only batch 128 and 256 for resnet50":
    only: [{when: {model: resnet50}, then: {batch_size: [128, 256]}}]
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
from dataclasses import dataclass, fields

from trainscale.catalogue.registry import FRAMEWORKS
from trainscale.catalogue.settings import (
    KNOB_AXES,
    SETTING,
    RunSettings,
    SettingsError,
    reads_setting,
    validate,
)

AXES = ("framework", "model", "batch_size", "nodes", "gpus_per_node")
SAFE_NAME = re.compile(r"^(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# A record's path below results/{study}/runs/, without .json; `knobs_folder`
# is '' or, where the point's framework reads knob axes of the grid, a folder
# naming their values: .../b64/precision=fp16+xla=true/n1g2r1.
RECORD_PATTERN = "{framework}/{model}/b{batch_size}/{knobs_folder}n{nodes}g{gpus_per_node}r{repeat}"
# Read back by GridPoint.from_path, at the end of any longer path.
_RECORD_PATH = re.compile(r"([^/]+)/([^/]+)/b(\d+)/(?:([^/]+)/)?n(\d+)g(\d+)r(\d+)\.json$")


class ConfigError(ValueError):
    """A study configuration is invalid; the message names the key, on one line."""


def knob_text(value) -> str:
    """A knob's value as it appears in a record's path: true, fp16, 64, 0.5."""
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


# Between a folder's knobs: not a comma, which Snakemake 9's --target-jobs
# parser splits a SLURM job's wildcards on, quoted or not (its
# target_jobs.py), so a folder of two knobs named no job on the node.
KNOB_SEPARATOR = "+"
# Where a folder's knobs part: a separator before a knob's name (a value
# may hold a '+': 1e+06); a comma too, in folders written before issue 31.
_KNOB_BOUNDARY = re.compile(r"[+,](?=[A-Za-z_][A-Za-z0-9_]*=)")


def join_knobs(pairs) -> str:
    """[('precision', 'fp16'), ('xla', 'true')] -> 'precision=fp16+xla=true' (a path folder)."""
    return KNOB_SEPARATOR.join(f"{name}={text}" for name, text in pairs)


def parse_knobs(knobs: str) -> list[tuple[str, str]]:
    """'precision=fp16+xla=true' (or an old folder's 'precision=fp16,xla=true')
    -> [('precision', 'fp16'), ('xla', 'true')]."""
    return [tuple(pair.split("=", 1)) for pair in _KNOB_BOUNDARY.split(knobs) if pair]


def _knob_value(name: str, text: str):
    """A knob's path text as the setting's own type: 'true' -> True, '64' -> 64.0
    (a knob no longer declared stays text)."""
    return SETTING[name].from_text(text) if name in SETTING else text


@dataclass(frozen=True, order=True)
class GridPoint:
    framework: str
    model: str
    batch_size: int
    nodes: int
    gpus_per_node: int
    repeat: int = 1
    # The grid's knob axes at this point: (("precision", "fp16"), ("xla", True)).
    knobs: tuple = ()

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def knobs_name(self) -> str:
        """'precision=fp16+xla=true': the knobs' folder in the record path ('' if none)."""
        return join_knobs((name, knob_text(value)) for name, value in self.knobs)

    @property
    def knobs_folder(self) -> str:
        """'precision=fp16+xla=true/': the record path's knob folder ('' if none)."""
        return f"{self.knobs_name}/" if self.knobs else ""

    def stem(self) -> str:
        """The record's path below results/{study}/runs/, without `.json`."""
        return RECORD_PATTERN.format(**self.as_dict(), knobs_folder=self.knobs_folder)

    @classmethod
    def from_path(cls, path: str) -> GridPoint | None:
        """The grid point a record's path names (the inverse of stem(), with
        `.json`, below any folder), or None for a path that names none."""
        match = _RECORD_PATH.search(path)
        if not match:
            return None
        framework, model, batch, knobs, nodes, gpus_per_node, repeat = match.groups()
        # A folder written before runs were labelled only by what they read
        # (a TensorFlow run under a DeepSpeed knob's folder) names the same
        # point without them.
        read = [(n, t) for n, t in parse_knobs(knobs or "") if reads_setting(framework, n)]
        return cls(
            framework,
            model,
            int(batch),
            int(nodes),
            int(gpus_per_node),
            int(repeat),
            knobs=tuple((name, _knob_value(name, text)) for name, text in read),
        )

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def record_path(study: str, point: GridPoint, root: str = "results") -> str:
    return f"{root}/{study}/runs/{point.stem()}.json"


def _condition_holds(value, condition) -> bool:
    if isinstance(condition, dict):
        return condition.get("min", value) <= value <= condition.get("max", value)
    if isinstance(condition, list):
        return value in condition
    return value == condition


def matches(point: GridPoint, clause: dict, unread: bool = False) -> bool:
    """Whether every condition of `clause` holds at `point`; a condition on a
    knob the point's framework does not read holds if `unread` (a `then` asks
    nothing of such a run), else not (an `exclude` or a `when` is not about it)."""
    values = {**point.as_dict(), "gpus": point.gpus, **dict(point.knobs)}
    return all(
        _condition_holds(values[axis], cond) if axis in values else unread
        for axis, cond in clause.items()
    )


def allowed(point: GridPoint, constraints: dict) -> bool:
    cap = constraints.get("max_total_gpus")
    if cap is not None and point.gpus > cap:
        return False
    if any(matches(point, clause) for clause in constraints.get("exclude", [])):
        return False
    return all(
        matches(point, rule["then"], unread=True)
        for rule in constraints.get("only", [])
        if matches(point, rule["when"])
    )


def knob_axes(config: dict) -> list[str]:
    """The knob axes the study's grid varies, in KNOB_AXES order."""
    return [name for name in KNOB_AXES if name in config["grid"]]


def _knob_combinations(grid: dict, names: list[str], framework: str):
    """Every combination of the knob axes this framework reads; the others
    neither multiply its runs nor label them."""
    read = [name for name in names if reads_setting(framework, name)]
    for values in itertools.product(*(grid[name] for name in read)):
        yield tuple(zip(read, values, strict=True))


def expand_grid(config: dict) -> list[GridPoint]:
    """Every run of the study, in a stable order (framework, model, batch, nodes, GPUs, repeat)."""
    grid = config["grid"]
    constraints = config.get("constraints", {})
    names = knob_axes(config)
    points = []
    for values in itertools.product(*(grid[axis] for axis in AXES)):
        for knobs in _knob_combinations(grid, names, values[0]):
            point = GridPoint(*values, knobs=knobs)
            if allowed(point, constraints):
                points += [
                    GridPoint(*values, repeat=r, knobs=knobs)
                    for r in range(1, grid.get("repeats", 1) + 1)
                ]
    return sorted(points)


def run_settings(config: dict, point: GridPoint) -> RunSettings:
    """The harness settings of one grid point of this study: benchmark, then its knobs."""
    bench = config["benchmark"]
    chosen = {**{k: v for k, v in bench.items() if k in SETTING}, **dict(point.knobs)}
    # A setting the framework does not read stays at its default: the record
    # then says nothing false of the run (a TensorFlow run has no ZeRO stage).
    extra = {
        k: SETTING[k].coerce(v) for k, v in chosen.items() if reads_setting(point.framework, k)
    }
    return RunSettings(
        framework=point.framework,
        nodes=point.nodes,
        gpus_per_node=point.gpus_per_node,
        model=point.model,
        batch_size=point.batch_size,
        **extra,
    )


def train_arguments(config: dict, point: GridPoint) -> str:
    """`trainscale` options for a grid point, each shell-quoted."""
    return " ".join(shlex.quote(arg) for arg in run_settings(config, point).to_cli_args())


# --------------------------------------------------------------------------
# Checking a configuration
# --------------------------------------------------------------------------


def check_config(config: dict, root: str = ".", cached: bool = False) -> list[GridPoint]:
    """Checks a schema cannot express; returns the grid. Raises ConfigError.
    `cached`: a study of cached records, whose frameworks trainscale may not
    run (schema.config_schema); their points are read, never run or checked."""
    grid = config["grid"]
    for axis in (*AXES, *knob_axes(config)):
        values = grid[axis]
        duplicates = sorted({v for v in values if values.count(v) > 1}, key=str)
        if duplicates:
            raise ConfigError(f"config key grid.{axis}: duplicate values {duplicates}")
    for name in ("study", "reference"):
        value = config.get(name)
        if value is not None and not SAFE_NAME.match(str(value)):
            raise ConfigError(
                f"config key {name}: {value!r} has characters that are not safe in a path"
            )
    cluster = config.get("cluster") or {}
    for name in ("partition", "account", "gpu_model", "qos"):
        value = cluster.get(name)
        if value not in (None, "") and not SAFE_NAME.match(str(value)):
            raise ConfigError(
                f"config key cluster.{name}: {value!r} has characters that are not safe "
                "in a path or a shell"
            )
    points = expand_grid(config)
    if not points:
        raise ConfigError(
            "config key constraints: the constraints leave no run of the grid "
            "(check max_total_gpus, exclude and only)"
        )
    reference = config.get("reference")
    if reference:
        if reference == config["study"]:
            raise ConfigError("config key reference: a study cannot be its own reference")
        runs = os.path.join(root, "results", reference, "runs")
        if not os.path.isdir(runs):
            raise ConfigError(
                f"config key reference: study {reference!r} has no cached records " f"(no {runs}/)"
            )
    for point in points:
        if cached and point.framework not in FRAMEWORKS:
            continue
        try:
            validate(run_settings(config, point), check_data=False)
        except SettingsError as err:
            raise ConfigError(f"config key benchmark/grid ({point.stem()}): {err}") from None
    _check_defined(config, points, "network", "networks")
    _check_defined(config, points, "container", "containers")
    _check_defined(config, points, "system", "systems")
    _check_system_sizes(config, points)
    if (config.get("predict") or {}).get("link") == "probe" and not (
        (config.get("probe") or {}).get("enabled")
    ):
        raise ConfigError("predict.link: probe needs probe.enabled: true (no probe, no link)")
    return points


def _check_defined(config: dict, points: list[GridPoint], setting: str, key: str) -> None:
    """Every network (container, system) a point runs over (in, on) is one
    cluster.networks (containers, systems) defines ('' and none: the defaults):
    a name alone selects no interface, starts no container, reaches no partition."""
    defined = (config.get("cluster") or {}).get(key) or {}
    bare = {"", "none"}  # the default route; the bare host
    for name in sorted({getattr(run_settings(config, p), setting) for p in points} - bare):
        if name not in defined:
            where = f"grid.{setting}" if setting in config["grid"] else f"benchmark.{setting}"
            names = ", ".join(sorted(defined)) or "none"
            raise ConfigError(
                f"config key {where}: {setting} {name!r} is not one cluster.{key} "
                f"defines (it defines: {names}); add its definition there"
            )


def _check_system_sizes(config: dict, points: list[GridPoint]) -> None:
    """No point asks a system for more GPUs per node than its nodes have:
    SLURM would queue such a job for ever."""
    systems = (config.get("cluster") or {}).get("systems") or {}
    for point in points:
        name = run_settings(config, point).system
        if name in systems and point.gpus_per_node > systems[name]["gpus_per_node"]:
            raise ConfigError(
                f"config key grid.gpus_per_node: {point.gpus_per_node} GPUs per node on system "
                f"{name!r}, whose nodes have {systems[name]['gpus_per_node']} "
                f"(cluster.systems.{name}.gpus_per_node); exclude those points"
            )
