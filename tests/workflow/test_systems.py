"""Node types as a grid axis (cluster.systems): each system's points go to its
own partition, GRES type and constraint; an undefined system, or one asked
for more GPUs than its nodes have, is refused in one line; the systems table
puts the same points side by side. No training here: the SLURM lab's
two-partition study is tests/workflow/test_slurm.py's."""

import copy
import os

import pytest
from conftest import REPO, load_yaml

from trainscale.analysis.systems_report import systems_table
from trainscale.study.jobs import slurm_resources
from trainscale.study.schema import ConfigError, config_schema, validate_config
from trainscale.study.study import check_config, expand_grid, run_settings

SYSTEMS = {
    "titan": {"partition": "titan", "gpu_model": "titan_rtx", "gpus_per_node": 2,
              "peak_tflops": {"fp32": 16.3}},
    "v100": {"constraint": "v100&nvlink", "gpu_model": "v100", "gpus_per_node": 4},
}  # fmt: skip
SCHEMA = config_schema(os.path.join(REPO, "workflow", "schemas", "config.schema.yaml"))


def _config(**grid) -> dict:
    config = copy.deepcopy(load_yaml(os.path.join(REPO, "config.yaml")))
    axes = {
        "framework": ["horovod"],
        "nodes": [1],
        "gpus_per_node": [1, 2],
        "system": ["titan", "v100"],
    }
    config["grid"].update({**axes, **grid})
    config["reference"] = None
    config["cluster"].update(partition="gpu", gpu_model="a100", systems=copy.deepcopy(SYSTEMS))
    return validate_config(config, SCHEMA)


def test_each_system_sends_its_points_to_its_own_partition_gres_and_constraint():
    config = _config()
    points = check_config(config, root=REPO)
    assert len(points) == 4
    got = {}
    for point in points:
        resources = slurm_resources(config, point)
        got[(run_settings(config, point).system, point.gpus_per_node)] = (
            resources["slurm_partition"], resources["gres"], resources["constraint"]
        )  # fmt: skip
    assert got == {
        ("titan", 1): ("titan", "gpu:titan_rtx:1", None),
        ("titan", 2): ("titan", "gpu:titan_rtx:2", None),
        # No partition of its own: the study's; its constraint reaches sbatch -C.
        ("v100", 1): ("gpu", "gpu:v100:1", "v100&nvlink"),
        ("v100", 2): ("gpu", "gpu:v100:2", "v100&nvlink"),
    }
    # A point with no system keeps the study-wide partition and GRES type.
    del config["grid"]["system"]
    point = expand_grid(config)[0]
    plain = slurm_resources(config, point)
    assert (plain["slurm_partition"], plain["gres"], plain["constraint"]) == (
        "gpu",
        "gpu:a100:1",
        None,
    )


def test_an_undefined_system_is_refused_naming_those_defined():
    config = _config(system=["titan", "h100"])
    with pytest.raises(ConfigError) as err:
        check_config(config, root=REPO)
    assert str(err.value) == (
        "config key grid.system: system 'h100' is not one cluster.systems defines "
        "(it defines: titan, v100); add its definition there"
    )


def test_a_point_asking_a_system_for_more_gpus_than_its_nodes_have_is_refused():
    config = _config(gpus_per_node=[1, 2, 4])
    with pytest.raises(ConfigError, match=r"4 GPUs per node on system 'titan', whose nodes have 2"):
        check_config(config, root=REPO)


def _record(system: str, gpus: int, rate: float, mfu=None, achieved=None) -> dict:
    return {
        "status": "ok", "framework": "horovod", "model": "resnet50", "batch_size": 32,
        "dataset": "mnist", "nodes": 1, "gpus_per_node": gpus, "mode": "throughput",
        "settings": {"system": system}, "images_per_sec": {"mean": rate},
        "mfu": mfu, "achieved_tflops": achieved, "peak_precision": "fp32",
        "provenance": {"hosts": [f"{system}-node"] * gpus},
    }  # fmt: skip


def test_the_systems_table_puts_each_point_side_by_side_with_its_ratio_and_mfu():
    records = [
        _record("v100", 1, 300.0, mfu=0.25),
        _record("titan", 1, 200.0, achieved=1.63),
        _record("titan", 2, 380.0, achieved=3.26),
        _record("titan", 2, 420.0, achieved=3.26),  # a repeat: averaged
        _record("v100", 2, 500.0),
    ]
    table = systems_table(records, SYSTEMS, order=["titan", "v100"])
    rows = [tuple(r) for r in table[["gpus_per_node", "system", "images_per_sec"]].to_numpy()]
    assert rows == [
        (1, "titan", 200.0),
        (1, "v100", 300.0),
        (2, "titan", 400.0),
        (2, "v100", 500.0),
    ]
    assert list(table["of_first_system"]) == pytest.approx([1.0, 1.5, 1.0, 1.25])
    # The run's own MFU where its device had a peak; else the system's declared one.
    assert list(table["mfu"])[:3] == pytest.approx([0.1, 0.25, 0.1])
    assert list(table["mfu_basis"]) == ["system's peak", "run's device", "system's peak", ""]
    assert list(table["partition"]) == ["titan", "", "titan", ""]
    assert list(table["hosts"])[:2] == ["titan-node", "v100-node"]


def test_every_shipped_study_names_only_systems_it_defines():
    for name in ("studies/seed004.yaml", "studies/seed004-sdss.yaml"):
        config = validate_config(load_yaml(os.path.join(REPO, name)), SCHEMA)
        points = check_config(config, root=REPO)
        systems = {run_settings(config, p).system for p in points}
        assert systems == {"node5-titan-rtx", "node9-v100"}, name
        v100 = next(p for p in points if run_settings(config, p).system == "node9-v100")
        assert slurm_resources(config, v100)["gres"].startswith("gpu:v100:")
