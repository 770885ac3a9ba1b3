"""Combining repeats, speed-up, and the table layouts, on hand-made rows."""

import json
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import REPO

from trainscale.analysis.rendering import display_frame, to_latex, to_markdown
from trainscale.analysis.repeats import combine_repeats
from trainscale.analysis.tables import reference_table, table1, table2
from trainscale.analysis.tidy import CollectError, add_scaling, collect


def row(
    framework, nodes, gpn, mean, std, blocks=10, repeat=1, status="ok", model="vgg16", knobs=""
):
    return {
        "study": "s",
        "framework": framework,
        "model": model,
        "dataset": "cifar100",
        "image_size": 224,
        "batch_size": 64,
        "knobs": knobs,
        "nodes": nodes,
        "gpus_per_node": gpn,
        "gpus": nodes * gpn,
        "repeat": repeat,
        "device": "gpu",
        "status": status,
        "images_per_sec_mean": mean,
        "images_per_sec_std": std,
        "blocks": blocks,
    }


def test_pooled_std_is_the_std_of_all_blocks_together():
    rng = np.random.default_rng(0)
    a, b = rng.normal(100, 5, 10), rng.normal(110, 3, 20)
    tidy = pd.DataFrame(
        [
            row("horovod", 1, 1, a.mean(), a.std(ddof=1), 10, 1),
            row("horovod", 1, 1, b.mean(), b.std(ddof=1), 20, 2),
        ]
    )
    combined = combine_repeats(tidy)
    assert len(combined) == 1 and combined["repeats"].item() == 2
    assert combined["images_per_sec_mean"].item() == pytest.approx((a.mean() + b.mean()) / 2)
    assert combined["images_per_sec_std"].item() == pytest.approx(
        np.concatenate([a, b]).std(ddof=1)
    )


def test_failed_runs_are_not_averaged_in():
    tidy = pd.DataFrame(
        [
            row("horovod", 1, 1, 100.0, 1.0),
            row("horovod", 1, 1, math.nan, math.nan, repeat=2, status="oom"),
        ]
    )
    combined = combine_repeats(tidy)
    assert combined["images_per_sec_mean"].item() == 100.0 and combined["repeats"].item() == 1


def test_speedup_uses_the_same_frameworks_one_gpu_run():
    tidy = pd.DataFrame(
        [
            row("horovod", 1, 1, 100.0, 1.0),
            row("horovod", 2, 2, 360.0, 1.0),
            row("tf-mirrored", 1, 1, 80.0, 1.0),
            row("tf-mirrored", 1, 4, 240.0, 1),
        ]
    )
    scaled = add_scaling(tidy).set_index(["framework", "gpus"])
    assert scaled.loc[("horovod", 4), "speedup"] == pytest.approx(3.6)
    assert scaled.loc[("horovod", 4), "efficiency"] == pytest.approx(0.9)
    assert scaled.loc[("tf-mirrored", 4), "speedup"] == pytest.approx(3.0)


def test_a_reference_of_two_systems_is_compared_row_by_row_not_averaged():
    # Seed 004 has each cell on two nodes (a `system` axis, in its knobs):
    # Table I has no single reference value there, vs_reference has both.
    combined = combine_repeats(pd.DataFrame([row("ray-train", 1, 2, 300.0, 3.0)]))
    reference = combine_repeats(
        pd.DataFrame(
            [
                row("ray-train", 1, 2, 600.0, 0.0, knobs="system=a"),
                row("ray-train", 1, 2, 1200.0, 0.0, knobs="system=b"),
            ]
        )
    )
    t1 = table1(combined, reference)
    assert list(t1["ray-train_mean"]) == [300.0] and "ray-train_ratio" not in t1
    rows = reference_table(combined, reference)
    assert list(rows["reference_knobs"]) == ["system=a", "system=b"]
    assert list(rows["ratio"]) == pytest.approx([0.5, 0.25])


def test_table_layouts_and_rendering():
    tidy = pd.DataFrame(
        [
            row("horovod", 1, 1, 100.0, 1.0),
            row("horovod", 1, 2, 190.0, 2.0),
            row("horovod", 2, 1, 180.0, 3.0),
            row("tf-mirrored", 1, 1, 90.0, 4.0),
        ]
    )
    combined = combine_repeats(tidy)
    reference = combine_repeats(pd.DataFrame([row("horovod", 1, 2, 200.0, 5.0)]))
    t1 = table1(combined, reference)
    assert list(t1["gpus"]) == [1, 2]
    assert list(t1["horovod_mean"]) == [100.0, 190.0]
    assert math.isnan(t1["tf-mirrored_mean"][1])
    assert t1["horovod_ratio"][1] == pytest.approx(0.95)
    t2 = table2(combined, "horovod")
    assert list(t2.columns) == [
        "model",
        "batch_size",
        "gpus_per_node",
        "n1_mean",
        "n1_std",
        "n1_status",
        "n2_mean",
        "n2_std",
        "n2_status",
    ]
    assert math.isnan(t2["n2_mean"][1])  # 2 nodes x 2 GPUs was not in the grid
    shown = display_frame(t2, {"n1": "1 node"})
    assert list(shown["1 node"]) == ["100.0 ± 1.0", "190.0 ± 2.0"]
    assert "| vgg16 | 64 | 2 | 190.0 ± 2.0 |  |" in to_markdown(shown, "T")
    assert r"190.0 $\pm$ 2.0 &  \\" in to_latex(shown, "T")


@pytest.mark.parametrize(
    ("mean", "std", "shown"),
    [
        (1914.388, 267.047, "1914 ± 267"),  # the spread's two leading digits
        (0.95123, 0.0213, "0.951 ± 0.021"),
        (458.816, 2.550, "458.8 ± 2.5"),
        (1914.388, 0.0, "1914 ± 0"),  # no spread: three significant digits
        (0.012345, math.nan, "0.0123"),
    ],
)
def test_a_cell_shows_as_many_digits_as_its_spread_supports(mean, std, shown):
    table = pd.DataFrame({"x_mean": [mean], "x_std": [std]})
    assert display_frame(table)["x"].tolist() == [shown]


def test_a_point_that_ran_out_of_memory_says_so_in_its_cell():
    tidy = pd.DataFrame(
        [
            row("horovod", 1, 1, 100.0, 1.0),
            row("horovod", 1, 2, math.nan, math.nan, status="oom"),
            row("horovod", 2, 1, math.nan, math.nan, status="timeout"),
            row("horovod", 2, 1, math.nan, math.nan, repeat=2, status="oom"),
        ]
    )
    combined = combine_repeats(tidy)
    assert len(combined) == 3
    shown = display_frame(table2(combined, "horovod"))
    assert list(shown["n1"]) == ["100.0 ± 1.0", "OOM"]
    assert list(shown["n2"]) == ["OOM/TIMEOUT", ""]  # 2 nodes x 2 GPUs: not in the grid


def test_knob_axes_give_blocks_and_columns_of_their_own():
    # precision is read by every framework: a block each, frameworks side by side.
    # Horovod's compression only by Horovod: a column (Table I) or block (Table II).
    knobs = "precision={},horovod_compression={}"
    tidy = pd.DataFrame(
        [
            row("horovod", 1, 1, 100.0, 1.0, knobs=knobs.format("fp32", "none")),
            row("horovod", 1, 2, 150.0, 1.0, knobs=knobs.format("fp32", "none")),
            row("horovod", 1, 1, 101.0, 1.0, knobs=knobs.format("fp32", "fp16")),
            row("horovod", 1, 2, 190.0, 1.0, knobs=knobs.format("fp32", "fp16")),
            row("horovod", 1, 1, 300.0, 1.0, knobs=knobs.format("fp16", "none")),
            row("tf-mirrored", 1, 1, 90.0, 1.0, knobs=knobs.format("fp32", "none")),
            row("tf-mirrored", 1, 2, 170.0, 1.0, knobs=knobs.format("fp32", "none")),
            row("tf-mirrored", 1, 1, 280.0, 1.0, knobs=knobs.format("fp16", "none")),
        ]
    )
    combined = combine_repeats(tidy)
    # Speed-up against the 1-GPU run with the same knobs.
    fp16 = combined[combined["knobs"] == knobs.format("fp32", "fp16")].set_index("gpus")
    assert fp16.loc[2, "speedup"] == pytest.approx(190 / 101)
    t1 = table1(combined)
    assert list(t1.columns[:4]) == ["model", "batch_size", "knobs", "gpus"]
    assert list(t1["knobs"]) == ["precision=fp16", "precision=fp32", "precision=fp32"]
    fp32 = t1[t1["knobs"] == "precision=fp32"]
    assert list(fp32["horovod horovod_compression=none_mean"]) == [100.0, 150.0]
    assert list(fp32["horovod horovod_compression=fp16_mean"]) == [101.0, 190.0]
    assert list(fp32["tf-mirrored_mean"]) == [90.0, 170.0]
    half = t1[t1["knobs"] == "precision=fp16"]
    assert half["horovod horovod_compression=fp16_mean"].isna().all()  # not measured there
    assert list(half["horovod horovod_compression=none_mean"]) == [300.0]
    t2 = table2(combined, "horovod")
    blocks = t2.groupby(["knobs", "series"], sort=True)["n1_mean"].apply(list)
    assert blocks.to_dict() == {
        ("precision=fp16", "Horovod (horovod_compression=none)"): [300.0],
        ("precision=fp32", "Horovod (horovod_compression=none)"): [100.0, 150.0],
        ("precision=fp32", "Horovod (horovod_compression=fp16)"): [101.0, 190.0],
    }


def test_a_study_without_knob_axes_has_no_knobs_column():
    combined = combine_repeats(pd.DataFrame([row("horovod", 1, 1, 100.0, 1.0)]))
    assert "knobs" not in table1(combined) and "series" not in table2(combined)


# --- collect refuses what it cannot trust, naming the file -------------------

PUBLISHED = os.path.join(REPO, "results/published/runs/horovod/vgg16/b64/n1g2r1.json")


def stored(tmp_path, stem, **changes):
    record = json.loads(Path(PUBLISHED).read_text())
    record.update(changes)
    path = tmp_path / "runs" / f"{stem}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return str(path)


def test_collect_reads_a_good_record(tmp_path):
    path = stored(tmp_path, "horovod/vgg16/b64/n1g2r1")
    assert collect("s", [path])["images_per_sec_mean"].item() == 451.698
    # In a knobs folder its settings match (the published record predates the
    # knob and has its default); the folder becomes the row's knobs.
    path = stored(tmp_path, "horovod/vgg16/b64/horovod_fusion_threshold_mb=64,xla=false/n1g2r1")
    # An old folder's comma reads back; the table names it as folders now are.
    assert collect("s", [path])["knobs"].item() == "horovod_fusion_threshold_mb=64+xla=false"


@pytest.mark.parametrize(
    ("stem", "changes", "message"),
    [
        ("horovod/vgg16/b64/n1g2r1", {"schema": 7}, "unknown record schema 7"),
        ("horovod/vgg16/b64/n2g2r1", {}, "another grid point than its path ({'nodes': 1})"),
        ("tf-mirrored/vgg16/b64/n1g2r1", {}, "'framework': 'horovod'"),
        # Its folder says fp16 compression; its settings say none.
        (
            "horovod/vgg16/b64/horovod_compression=fp16/n1g2r1",
            {},
            "another grid point than its path ({'horovod_compression': 'none'})",
        ),
    ],
)
def test_collect_refuses_a_record_naming_the_file(tmp_path, stem, changes, message):
    path = stored(tmp_path, stem, **changes)
    with pytest.raises(CollectError) as info:
        collect("s", [path])
    assert path in str(info.value) and message in str(info.value)


def test_collect_refuses_a_truncated_record(tmp_path):
    path = stored(tmp_path, "horovod/vgg16/b64/n1g2r1")
    Path(path).write_text(Path(path).read_text()[:200])
    with pytest.raises(CollectError, match="truncated or not JSON"):
        collect("s", [path])


def test_collect_refuses_a_record_measured_with_other_settings(tmp_path):
    path = stored(tmp_path, "horovod/vgg16/b64/n1g2r1", source="measured")
    expected = {**json.loads(Path(path).read_text())["settings"], "blocks": 50}
    with pytest.raises(CollectError, match=r"blocks=10 \(config: 50\)"):
        collect("s", [path], {path: expected})


def test_a_record_written_with_the_former_block_names_reads_as_now(tmp_path):
    # Records of before the rename say iterations and steps_per_iteration.
    path = stored(tmp_path, "horovod/vgg16/b64/n1g2r1", source="measured")
    settings = json.loads(Path(path).read_text())["settings"]
    assert settings["iterations"] == 10 and "blocks" not in settings
    expected = {k: v for k, v in settings.items() if "iteration" not in k}
    expected.update(blocks=10, steps_per_block=settings["steps_per_iteration"])
    assert collect("s", [path], {path: expected})["images_per_sec_mean"].item() == 451.698
    with pytest.raises(CollectError, match=r"blocks=10 \(config: 11\)"):
        collect("s", [path], {path: {**expected, "blocks": 11}})


def test_collect_refuses_a_study_that_mixes_cpu_and_gpu(tmp_path):
    gpu = stored(tmp_path, "horovod/vgg16/b64/n1g2r1")
    cpu = stored(tmp_path, "horovod/vgg16/b64/n1g1r1", device="cpu", gpus_per_node=1)
    with pytest.raises(CollectError, match=r"mixes devices \['cpu', 'gpu'\]"):
        collect("s", [gpu, cpu])


def test_a_runs_knobs_are_read_from_its_settings_and_an_old_records_from_its_path():
    from trainscale.analysis.tidy import record_knobs
    from trainscale.study.study import GridPoint

    def at(path):
        return GridPoint.from_path(path)

    record = json.loads(Path(PUBLISHED).read_text())  # horovod, settings with xla false
    axes = ["horovod_fusion_threshold_mb", "xla"]
    record["settings"]["xla"] = True
    # The settings, not the folder, say what ran: each axis its framework reads.
    assert record_knobs(record, at("runs/horovod/vgg16/b64/n1g2r1.json"), axes) == (
        "horovod_fusion_threshold_mb=64+xla=true"
    )
    mirrored = {**record, "framework": "tf-mirrored"}  # reads xla, not Horovod's fusion
    assert record_knobs(mirrored, at("runs/tf-mirrored/vgg16/b64/n1g2r1.json"), axes) == "xla=true"
    # A record without settings (or no study's axes): its folder names its knobs.
    old = {k: v for k, v in record.items() if k != "settings"}
    assert (
        record_knobs(old, at("runs/horovod/vgg16/b64/xla=false/n1g2r1.json"), axes) == "xla=false"
    )
    assert record_knobs(record, at("runs/horovod/vgg16/b64/n1g2r1.json"), None) == ""
