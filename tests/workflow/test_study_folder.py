"""A study's folder: the saved config keeps explaining every record, cached studies are
read-only, and no saved config is ever lost (trainscale.study.study_folder)."""

import copy
import json
import os
from pathlib import Path

import pytest
from conftest import REPO, load_yaml

from trainscale.catalogue.settings import RunSettings
from trainscale.study.study import ConfigError, expand_grid, record_path
from trainscale.study.study_folder import (
    HISTORY,
    StudyFolder,
    check_study_folder,
    measurement_settings,
    save_study_config,
    union_config,
)

STUDY = {
    "study": "mine",
    "grid": {
        "framework": ["tf-single", "horovod"],
        "nodes": [1],
        "gpus_per_node": [1, 2],
        "model": ["small_cnn"],
        "batch_size": [16],
        "repeats": 1,
    },
    "constraints": {"exclude": [{"framework": "tf-single", "gpus_per_node": {"min": 2}}]},
    "benchmark": {"dataset": "synthetic", "image_size": 32, "device": "cpu", "blocks": 4},
}


def variant(grid=None, benchmark=None, **keys):
    config = copy.deepcopy(STUDY)
    config["grid"].update(grid or {})
    config["benchmark"].update(benchmark or {})
    config.update(keys)
    return config


def check(config, saved, root):
    return check_study_folder(config, expand_grid(config), saved, root=str(root))


def test_measurement_settings_are_what_a_record_measured():
    settings = measurement_settings(STUDY)
    assert settings["blocks"] == 4 and settings["image_size"] == 32
    assert settings["warmup_steps"] == RunSettings(framework="tf-single").warmup_steps
    assert settings["generate_cifar100_images"] is None
    # Where the data lives, and the grid's own axes, are not settings of a record.
    for key in ("data_dir", "framework", "nodes", "batch_size", "model"):
        assert key not in settings
    # A benchmark setting the grid varies is the grid's.
    assert "precision" not in measurement_settings(variant(grid={"precision": ["fp32"]}))


def test_a_new_study_saves_its_config(tmp_path):
    folder = check(STUDY, None, tmp_path)
    assert not folder.read_only and folder.config_to_save == STUDY


@pytest.mark.parametrize(
    ("changed", "named"),
    [
        ({"image_size": 64}, "config key benchmark.image_size: "),
        ({"blocks": 8, "seed": 1}, "config keys benchmark.blocks, benchmark.seed: "),
        # Not given before: the default (10) was measured, and 20 is a change.
        ({"warmup_steps": 20}, "config key benchmark.warmup_steps: "),
        ({"time_budget_seconds": 3}, "config key benchmark.time_budget_seconds: "),
    ],
)
def test_changed_measurement_settings_are_refused_naming_the_keys(tmp_path, changed, named):
    with pytest.raises(ConfigError) as refused:
        check(variant(benchmark=changed), STUDY, tmp_path)
    message = str(refused.value)
    assert message.startswith(named) and "\n" not in message
    assert "name a new study, or move results/mine away" in message
    key, value = next(iter(changed.items()))
    assert f"{key} {measurement_settings(STUDY)[key]!r} -> {value!r}" in message


def test_settings_that_measure_nothing_may_change(tmp_path):
    # Where the data lives, the cluster, the reference and the retries do not
    # change what a record measured.
    config = variant(benchmark={"data_dir": "elsewhere", "timeout_seconds": 60}, train_retries=0)
    config["cluster"] = {"partition": "other"}
    assert check(config, STUDY, tmp_path).config_to_save["cluster"] == {"partition": "other"}


def test_adding_or_removing_a_knob_axis_is_refused(tmp_path):
    # Records are filed by their knob axes: another set of axes is another layout.
    with pytest.raises(ConfigError, match=r"^config key grid: .* knob axes \[\] .*\['xla'\]"):
        check(variant(grid={"xla": [False, True]}), STUDY, tmp_path)


def test_an_extended_grid_is_saved_as_the_union(tmp_path):
    # More frameworks, GPUs and repeats: the new config holds the old grid.
    bigger = variant(grid={"framework": ["tf-single", "horovod", "tf-mirrored"], "repeats": 2})
    folder = check(bigger, STUDY, tmp_path)
    assert folder.config_to_save == bigger
    # A config that names only new points: the union of both is saved.
    only_new = variant(grid={"framework": ["tf-mirrored"]}, constraints={})
    merged = check(only_new, STUDY, tmp_path).config_to_save
    assert merged["grid"]["framework"] == ["tf-single", "horovod", "tf-mirrored"]
    assert set(expand_grid(merged)) == set(expand_grid(STUDY)) | set(expand_grid(only_new))
    # Fewer points than saved: the saved config already says it all.
    assert check(variant(grid={"framework": ["horovod"]}), STUDY, tmp_path).config_to_save is None
    assert check(STUDY, STUDY, tmp_path).config_to_save is None


def test_a_union_that_is_not_one_grid_is_refused(tmp_path):
    # Saved: tf-single and horovod on 1-2 GPUs. New: tf-mirrored at batch 32.
    # Their union as one grid would add e.g. horovod at batch 32: measured by neither.
    other = variant(grid={"framework": ["tf-mirrored"], "batch_size": [32]})
    with pytest.raises(ConfigError, match=r"^config key grid: .*not one grid.*\(e\.g\. "):
        union_config(STUDY, other, "results/mine/config.yaml")


def _write_record(root, study, point, source):
    path = record_path(study, point, os.path.join(root, "results"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        json.dump({"schema": 1, "status": "ok", "source": source}, handle)
    return path


def test_a_folder_with_records_trainscale_did_not_measure_is_read_only(tmp_path):
    points = expand_grid(STUDY)
    for point in points[:-1]:
        _write_record(tmp_path, "mine", point, "published: seed 000, Table I")
    with pytest.raises(ConfigError) as refused:
        check(STUDY, None, tmp_path)
    message = str(refused.value)
    assert message.startswith("config key study: results/mine holds records trainscale did not")
    assert "source 'published: seed 000, Table I'" in message and "read-only" in message
    assert f"1 point(s) of this grid have no record there (e.g. {points[-1].stem()})" in message
    # With every record there, tables may be rebuilt; nothing is saved or trained.
    _write_record(tmp_path, "mine", points[-1], "published: seed 000, Table I")
    assert check(STUDY, None, tmp_path) == StudyFolder(read_only=True, config_to_save=None)


def test_measured_records_leave_a_folder_writable(tmp_path):
    _write_record(tmp_path, "mine", expand_grid(STUDY)[0], "measured")
    assert not check(STUDY, None, tmp_path).read_only


def test_the_published_cache_is_read_only():
    published = load_yaml(os.path.join(REPO, "results/published/config.yaml"))
    published.setdefault("constraints", {})
    folder = check_study_folder(published, expand_grid(published), None, root=REPO)
    assert folder.read_only and folder.config_to_save is None


def test_a_replaced_saved_config_is_kept_in_the_history(tmp_path):
    folder = str(tmp_path)
    assert save_study_config(folder, "a: 1\n") is None  # the first: nothing to keep
    assert save_study_config(folder, "a: 1\n") is None  # the same again: no copy
    kept = save_study_config(folder, "a: 2\n")
    assert os.path.dirname(kept) == os.path.join(folder, HISTORY)
    assert Path(kept).read_text() == "a: 1\n"
    kept_again = save_study_config(folder, "a: 3\n")
    assert kept_again != kept and Path(kept_again).read_text() == "a: 2\n"
    assert Path(folder, "config.yaml").read_text() == "a: 3\n"
    # Nothing else, no temp file left behind.
    assert sorted(os.listdir(folder)) == [HISTORY, "config.yaml"]
    assert len(os.listdir(os.path.join(folder, HISTORY))) == 2


OLD_LAYOUT = {
    # Written when every run carried every knob axis of the grid.
    "runs/tf-single/small_cnn/b32/zero_stage=3/n1g1r1.json": (
        "runs/tf-single/small_cnn/b32/n1g1r1.json"
    ),
    "runs/torch-ddp/small_cnn/b32/precision=bf16,zero_stage=3/n1g2r1.json": (
        "runs/torch-ddp/small_cnn/b32/precision=bf16/n1g2r1.json"
    ),
    # DeepSpeed reads its ZeRO stage: only the separator of its folder moves
    # (a comma named no SLURM job: trainscale.study.study.KNOB_SEPARATOR).
    "runs/deepspeed/small_cnn/b32/precision=bf16,zero_stage=3/n1g2r1.json": (
        "runs/deepspeed/small_cnn/b32/precision=bf16+zero_stage=3/n1g2r1.json"
    ),
    # Already where it belongs.
    "runs/deepspeed/small_cnn/b32/precision=fp32+zero_stage=3/n1g2r1.json": None,
}


def old_layout_folder(root: Path) -> Path:
    folder = root / "results" / "old"
    for path in OLD_LAYOUT:
        for name, text in (
            (path, "{}"),
            (path.replace("runs/", "logs/train/", 1)[:-5] + ".log", "log"),
        ):
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(text)
    return folder


def test_relabel_moves_records_and_logs_to_the_paths_of_what_they_measured(tmp_path):
    import subprocess
    import sys

    folder = old_layout_folder(tmp_path)
    trainscale = [sys.executable, "-m", "trainscale", "relabel", str(folder)]
    dry = subprocess.run([*trainscale, "--dry-run"], capture_output=True, text=True)
    assert dry.returncode == 0 and "3 would move, 0 kept" in dry.stdout
    assert (folder / "runs/tf-single/small_cnn/b32/zero_stage=3/n1g1r1.json").exists()
    done = subprocess.run(trainscale, capture_output=True, text=True)
    assert done.returncode == 0 and "3 moved, 0 kept" in done.stdout, done.stderr
    for old, new in OLD_LAYOUT.items():
        assert (folder / (new or old)).exists() and (new is None or not (folder / old).exists())
        log = (new or old).replace("runs/", "logs/train/", 1)[:-5] + ".log"
        assert (folder / log).read_text() == "log"
    from trainscale.study.study_folder import mislabelled_records

    assert mislabelled_records(str(folder)) == []


def test_relabel_keeps_a_record_whose_new_path_is_taken(tmp_path):
    from trainscale.study.study_folder import relabel_records

    folder = old_layout_folder(tmp_path)
    # zero_stage: [0, 3] once moved TensorFlow's runs to zero_stage=0/: two of one run.
    twin = folder / "runs/tf-single/small_cnn/b32/zero_stage=0/n1g1r1.json"
    twin.parent.mkdir(parents=True)
    twin.write_text("{}")
    moved, kept = relabel_records(str(folder))
    assert len(moved) == 3 and len(kept) == 1
    assert kept[0][1].endswith("runs/tf-single/small_cnn/b32/n1g1r1.json")


def test_a_study_with_mislabelled_records_is_inspected_but_not_run(repo_copy):
    from conftest import snakemake

    folder = old_layout_folder(Path(repo_copy))
    config = load_yaml(os.path.join(REPO, "profiles", "local", "study.yaml"))
    config["study"] = "old"
    config["cluster"] = {"environment_check": "none"}  # this test is not about them
    Path(repo_copy, "old.yaml").write_text(json.dumps(config))
    warning = "results/old holds 3 record(s) filed in an old layout"
    dry = snakemake(repo_copy, "-n", "--configfile", "old.yaml")
    assert dry.returncode == 0 and warning in dry.stdout + dry.stderr, dry.stdout[-2000:]
    real = snakemake(repo_copy, "--cores", "1", "--configfile", "old.yaml")
    said = real.stdout + real.stderr
    assert real.returncode != 0 and f"Invalid study configuration: {warning}" in said
    assert "trainscale relabel results/old" in said
    assert not (folder / "logs" / "collect.log").exists()
