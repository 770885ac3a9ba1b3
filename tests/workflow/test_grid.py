"""Grid expansion and validity rules: exact job sets."""

import os

import pytest
from conftest import REPO, load_yaml

from trainscale.study.jobs import job_shape
from trainscale.study.study import (
    ConfigError,
    GridPoint,
    check_config,
    expand_grid,
    matches,
    parse_knobs,
    run_settings,
    train_arguments,
)


def points(config):
    return {
        (p.framework, p.model, p.batch_size, p.nodes, p.gpus_per_node, p.repeat)
        for p in expand_grid(config)
    }


def test_the_papers_grid():
    config = load_yaml(os.path.join(REPO, "config.yaml"))
    got = points(config)
    cells = {(n, g) for n in range(1, 5) for g in range(1, 8) if n * g <= 12}
    expected = (
        {("horovod", "vgg16", 64, n, g, 1) for n, g in cells}
        | {("tf-multiworker", "vgg16", 64, n, g, 1) for n, g in cells}
        | {("tf-mirrored", "vgg16", 64, 1, g, 1) for g in range(1, 8)}
        | {("tf-single", "vgg16", 64, 1, 1, 1)}
    )
    assert got == expected
    assert len(cells) == 20  # exactly Table II's filled cells
    assert len(got) == 48


def test_the_published_grid_is_the_papers_tables():
    config = load_yaml(os.path.join(REPO, "results", "published", "config.yaml"))
    got = points(config)
    assert len(got) == 24
    assert {p for p in got if p[0] == "tf-mirrored"} == {
        ("tf-mirrored", "vgg16", 64, 1, g, 1) for g in range(1, 5)
    }
    assert ("horovod", "vgg16", 64, 4, 4, 1) not in got  # 16 GPUs: over the cap
    assert ("horovod", "vgg16", 64, 4, 3, 1) in got


def seed_002_config():
    # ResNet-50 at batch 128 and 256 only, VGG-16 at every batch, up to 64 GPUs.
    return {
        "grid": {
            "framework": ["horovod"],
            "model": ["resnet50", "vgg16"],
            "batch_size": [64, 128, 256],
            "nodes": [1, 2, 4, 8, 16],
            "gpus_per_node": [4],
            "repeats": 2,
        },
        "constraints": {
            "max_total_gpus": 64,
            "only": [{"when": {"model": "resnet50"}, "then": {"batch_size": [128, 256]}}],
        },
    }


def test_seed_002_shape_only_rule_and_repeats():
    got = points(seed_002_config())
    expected = {
        ("horovod", "resnet50", b, n, 4, r)
        for b in (128, 256)
        for n in (1, 2, 4, 8, 16)
        for r in (1, 2)
    }
    expected |= {
        ("horovod", "vgg16", b, n, 4, r)
        for b in (64, 128, 256)
        for n in (1, 2, 4, 8, 16)
        for r in (1, 2)
    }
    assert got == expected and len(got) == 50


def test_total_gpu_axis_and_bounds():
    point = GridPoint("horovod", "vgg16", 64, 3, 4)
    assert matches(point, {"gpus": {"min": 12}})
    assert not matches(point, {"gpus": {"max": 11}})
    assert matches(point, {"framework": ["horovod", "tf-single"], "nodes": 3})
    assert not matches(point, {"framework": "horovod", "nodes": [1, 2]})


@pytest.mark.parametrize(
    ("framework", "device", "expected"),
    [
        ("horovod", "gpu", {"nodes": 2, "tasks": 6, "tasks_per_node": 3, "gres": "gpu:3"}),
        (
            "tf-multiworker",
            "gpu",
            {"nodes": 2, "tasks": 2, "tasks_per_node": 1, "gres": "gpu:3", "cpus_per_task": 12},
        ),
        ("tf-multiworker", "cpu", {"nodes": 2, "tasks": 6, "tasks_per_node": 3, "gres": None}),
    ],
)
def test_job_shapes(framework, device, expected):
    config = {
        "benchmark": {"dataset": "synthetic", "image_size": 32, "device": device},
        "cluster": {"cpus_per_gpu": 4, "runtime_minutes": 20},
    }
    shape = job_shape(config, GridPoint(framework, "vgg16", 64, 2, 3))
    assert {k: shape[k] for k in expected} == expected
    assert shape["runtime"] == 20
    assert job_shape(config, GridPoint(framework, "vgg16", 64, 2, 3), attempt=2)["runtime"] == 40


@pytest.mark.parametrize(
    ("framework", "nodes", "gpn", "expected"),
    [
        # several ranks per node: tasks_per_node, and the plugin's mpi path
        ("horovod", 2, 2, {"nodes": 2, "tasks": 0, "tasks_per_node": 2, "mpi": "srun"}),
        # one rank per node: tasks (the plugin refuses tasks_per_node=1 with mpi)
        ("horovod", 3, 1, {"nodes": 3, "tasks": 3, "tasks_per_node": 0, "mpi": "srun"}),
        ("tf-multiworker", 2, 4, {"nodes": 2, "tasks": 2, "tasks_per_node": 0, "mpi": "srun"}),
        # one process: no mpi (the plugin refuses one-task mpi jobs)
        ("tf-mirrored", 1, 4, {"nodes": 1, "tasks": 1, "tasks_per_node": 0, "mpi": ""}),
    ],
)
def test_slurm_resources_in_the_plugins_terms(framework, nodes, gpn, expected):
    from trainscale.study.jobs import slurm_resources

    config = {
        "benchmark": {"dataset": "synthetic", "image_size": 32, "device": "gpu"},
        "cluster": {"partition": "gpu", "gpu_model": "v100", "qos": "long"},
    }
    got = slurm_resources(config, GridPoint(framework, "vgg16", 64, nodes, gpn))
    assert {k: got[k] for k in expected} == expected
    assert got["tasks_per_gpu"] == 0 and got["gres"] == f"gpu:v100:{gpn}"
    assert got["slurm_partition"] == "gpu" and got["qos"] == "long" and not got["slurm_extra"]
    config["cluster"]["one_job_at_a_time"] = True
    got = slurm_resources(config, GridPoint(framework, "vgg16", 64, nodes, gpn))
    assert got["slurm_extra"] == "--dependency=singleton"


def knob_config(**knobs):
    return {
        "study": "knobs",
        "grid": {
            "framework": ["horovod", "tf-mirrored", "tf-multiworker"],
            "model": ["vgg16"],
            "batch_size": [64],
            "nodes": [1],
            "gpus_per_node": [2],
            **knobs,
        },
        "benchmark": {"dataset": "synthetic", "image_size": 224, "device": "gpu"},
    }


def test_knob_axes_vary_only_the_frameworks_that_read_them():
    config = knob_config(
        precision=["fp32", "fp16"],
        horovod_compression=["none", "fp16"],
        all_reduce_pack_mb=[0, 4],
    )
    got = {p.stem(): run_settings(config, p) for p in check_config(config)}
    # precision: every framework; compression: Horovod's; pack size: MultiWorker's.
    # A framework's runs are neither repeated nor labelled by knobs it does not read.
    assert sorted(got) == sorted(
        [
            f"horovod/vgg16/b64/precision={p}+horovod_compression={c}/n1g2r1"
            for p in ("fp32", "fp16")
            for c in ("none", "fp16")
        ]
        + [
            f"tf-multiworker/vgg16/b64/precision={p}+all_reduce_pack_mb={m}/n1g2r1"
            for p in ("fp32", "fp16")
            for m in (0, 4)
        ]
        + [f"tf-mirrored/vgg16/b64/precision={p}/n1g2r1" for p in ("fp32", "fp16")]
    )
    settings = got["tf-multiworker/vgg16/b64/precision=fp16+all_reduce_pack_mb=4/n1g2r1"]
    assert (settings.precision, settings.all_reduce_pack_mb) == ("fp16", 4.0)
    assert isinstance(settings.all_reduce_pack_mb, float)  # as `trainscale train` parses it


def test_knob_axes_in_constraints_and_checks():
    config = knob_config(xla=[False, True], horovod_fusion_threshold_mb=[64, 0])
    config["constraints"] = {"exclude": [{"framework": "horovod", "xla": True}]}
    stems = {p.stem() for p in check_config(config)}
    assert "horovod/vgg16/b64/xla=false+horovod_fusion_threshold_mb=0/n1g2r1" in stems
    assert not any(s.startswith("horovod/") and "xla=true" in s for s in stems)
    assert "tf-mirrored/vgg16/b64/xla=true/n1g2r1" in stems
    assert len(stems) == 2 + 2 + 2
    # A knob value a framework that reads it refuses is refused up front.
    cpu = knob_config(collective_implementation=["ring", "nccl"])
    cpu["benchmark"]["device"] = "cpu"
    with pytest.raises(ConfigError, match="--collective-implementation nccl needs --device gpu"):
        check_config(cpu)


def test_a_record_path_reads_back_as_its_grid_point():
    # GridPoint.from_path is the inverse of stem(): the one place a path is read.
    config = knob_config(
        xla=[False, True], horovod_fusion_threshold_mb=[64, 0.5], precision=["fp32", "bf16"]
    )
    config["grid"]["repeats"] = 2
    paper = load_yaml(os.path.join(REPO, "config.yaml"))
    for point in [*check_config(config), *check_config(paper)]:
        path = f"results/s/runs/{point.stem()}.json"
        assert GridPoint.from_path(path) == point, path
    back = GridPoint.from_path(
        "runs/horovod/vgg16/b64/xla=true+horovod_fusion_threshold_mb=0.5/n2g3r2.json"
    )
    assert back.knobs == (("xla", True), ("horovod_fusion_threshold_mb", 0.5))
    # A folder written with commas (before issue 31) reads as the same point,
    # and a value holding a '+' stays whole.
    old = "runs/horovod/vgg16/b64/xla=true,horovod_fusion_threshold_mb=0.5/n2g3r2.json"
    assert GridPoint.from_path(old) == back
    assert parse_knobs("horovod_fusion_threshold_mb=1e+06+xla=true") == [
        ("horovod_fusion_threshold_mb", "1e+06"),
        ("xla", "true"),
    ]
    assert (back.nodes, back.gpus_per_node, back.repeat) == (2, 3, 2)
    for not_a_record in ("runs/horovod/vgg16/n1g1r1.json", "config.yaml", "b64/n1g1r1.json"):
        assert GridPoint.from_path(not_a_record) is None


def test_a_run_is_labelled_and_told_only_what_its_framework_reads():
    # make demo's grid: zero_stage [0, 3] is DeepSpeed's alone.
    config = knob_config(zero_stage=[0, 3])
    config["grid"]["framework"] = ["tf-single", "torch-ddp", "deepspeed"]
    config["grid"]["gpus_per_node"] = [1]
    config["benchmark"].update(xla=True, compile=True)
    points = {p.framework + "/" + p.knobs_name: p for p in check_config(config)}
    assert sorted(points) == [
        "deepspeed/zero_stage=0",
        "deepspeed/zero_stage=3",
        "tf-single/",
        "torch-ddp/",
    ]
    single = points["tf-single/"]
    assert single.stem() == "tf-single/vgg16/b64/n1g1r1"
    arguments = train_arguments(config, single)
    assert "--zero-stage" not in arguments and "--compile" not in arguments
    assert "--ddp-bucket-cap-mb" not in arguments and "--xla" in arguments.split()
    # What it does not read stays at its default in what it records.
    settings = run_settings(config, single)
    assert (settings.zero_stage, settings.compile, settings.xla) == (0, False, True)
    ddp = train_arguments(config, points["torch-ddp/"]).split()
    assert "--compile" in ddp and "--no-xla" not in ddp and "--ddp-bucket-cap-mb" in ddp
    assert "--zero-stage" in train_arguments(config, points["deepspeed/zero_stage=3"])


def test_an_old_record_path_names_the_run_without_the_knobs_it_never_read():
    old = GridPoint.from_path("runs/tf-single/small_cnn/b32/zero_stage=3/n1g1r1.json")
    assert old == GridPoint.from_path("runs/tf-single/small_cnn/b32/n1g1r1.json")
    assert old.stem() == "tf-single/small_cnn/b32/n1g1r1"
    kept = GridPoint.from_path(
        "runs/deepspeed/small_cnn/b32/precision=bf16,zero_stage=3/n1g2r1.json"
    )
    assert kept.knobs == (("precision", "bf16"), ("zero_stage", 3))
    partly = GridPoint.from_path("runs/torch-ddp/x/b32/precision=bf16,zero_stage=3/n1g2r1.json")
    assert partly.stem() == "torch-ddp/x/b32/precision=bf16/n1g2r1"


def test_the_cross_ecosystem_study():
    config = load_yaml(os.path.join(REPO, "studies", "cross-ecosystem.yaml"))
    got = {(*point, dict(p.knobs).get("zero_stage")) for p in expand_grid(config) for point in [
        (p.framework, p.model, p.batch_size, p.nodes, p.gpus_per_node, p.repeat)
    ]}  # fmt: skip
    spanning = {"horovod", "tf-multiworker", "torch-ddp", "horovod-torch", "torch-fsdp"}
    cells = {(n, g) for n in range(1, 5) for g in (1, 2, 4)}
    expected = set()
    for model in ("resnet50", "vgg16"):
        for repeat in (1, 2, 3):
            point = (model, 64)
            expected |= {(f, *point, n, g, repeat, None) for f in spanning for n, g in cells}
            # ZeRO's stage is DeepSpeed's knob alone: both of its stages; the
            # others run once, unlabelled by it.
            expected |= {("deepspeed", *point, n, g, repeat, z) for n, g in cells for z in (0, 3)}
            expected |= {("tf-mirrored", *point, 1, g, repeat, None) for g in (1, 2, 4)}
            expected |= {(f, *point, 1, 1, repeat, None) for f in ("tf-single", "torch-single")}
    assert got == expected
    assert len(got) == 2 * 3 * (7 * 12 + 3 + 2)
    check_config(config)  # every point valid: every model exists in both ecosystems
