"""A full local study on the CPU, for real: records, tables, figures, and what reruns."""

import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import (
    copy_repository,
    local_study,
    rebuilt_cache,
    snakemake,
    train_jobs,
)

from trainscale.catalogue.registry import framework_spec, label
from trainscale.core.faults import timeline_path
from trainscale.study.study import parse_knobs

STUDY = {
    "study": "tiny-cpu",
    "reference": "published",
    "train_env": ".venv-train",
    "grid": {
        "framework": ["tf-single", "horovod", "tf-mirrored"],
        "nodes": [1],
        "gpus_per_node": [1, 2],
        "model": ["small_cnn"],
        "batch_size": [16],
    },
    "constraints": {"exclude": [{"framework": "tf-single", "gpus_per_node": {"min": 2}}]},
    "benchmark": {
        "dataset": "cifar100",
        "data_dir": "results/tiny-cpu/data",
        "generate_cifar100_images": 256,
        "image_size": 32,
        "device": "cpu",
        "warmup_steps": 1,
        "blocks": 2,
        "steps_per_block": 2,
    },
}
RECORD = "results/tiny-cpu/runs/horovod/small_cnn/b16/n1g2r1.json"


def study_variant(name: str, grid=None, benchmark=None, **settings) -> dict:
    """STUDY under another name (its own data folder, no reference), some keys changed."""
    return {
        **STUDY,
        "study": name,
        "reference": None,
        **settings,
        "grid": {**STUDY["grid"], **(grid or {})},
        "benchmark": {
            **STUDY["benchmark"],
            "data_dir": f"results/{name}/data",
            **(benchmark or {}),
        },
    }


@pytest.fixture(scope="module")
def study(run_store):
    """STUDY run once for the pytest run, in a copy of its own (its tests on
    either pytest-xdist worker read it; one that changes it copies it first)."""

    def run(folder: str) -> dict:
        repo = copy_repository(os.path.join(folder, "repo"))
        args = local_study(repo, STUDY)
        result = snakemake(repo, *args, timeout=900)
        assert result.returncode == 0, result.stderr[-4000:]
        return {"repo": repo, "args": args}

    ran = run_store.once("local-study", run)
    return ran["repo"], ran["args"]


@pytest.mark.slow
def test_records_tables_and_figures(study):
    """Over a minute where it is the first to ask for the study (its fixture):
    Snakemake trains the study's 5 points, TensorFlow and Horovod processes of
    1 and 2 ranks, then runs every analysis rule (33 s on a Zen 5 VM, 106 s on
    an AVX2 one beside the other worker's tests)."""
    repo, _ = study
    folder = os.path.join(repo, "results", "tiny-cpu")
    tidy = pd.read_csv(os.path.join(folder, "throughput.csv"))
    assert len(tidy) == 5 and set(tidy["status"]) == {"ok"} and set(tidy["device"]) == {"cpu"}
    assert (tidy["images_per_sec_mean"] > 0).all()
    one_gpu = tidy[tidy["gpus"] == 1]
    assert (one_gpu["speedup"] == 1.0).all()
    for name in ("table1", "table2", "efficiency", "vs_reference"):
        for ext in ("csv", "md", "tex"):
            assert os.path.getsize(os.path.join(folder, "tables", f"{name}.{ext}")) > 0
    for name in (
        "weak_scaling_hosts",
        "weak_scaling_gpus",
        "efficiency",
        "frameworks",
        "mfu",
        "refactoring_tradeoff",
        "vs_reference",
    ):
        for ext in ("png", "pdf"):
            assert os.path.getsize(os.path.join(folder, "figures", f"{name}.{ext}")) > 1000
    # The refactoring table: every framework of the study, a diff for each
    # that changes its base (tf-single is the base).
    refactoring = pd.read_csv(os.path.join(folder, "tables", "refactoring.csv"))
    assert list(refactoring["framework"]) == STUDY["grid"]["framework"]
    assert refactoring.set_index("framework").loc["tf-single", "lines_touched"] == 0
    assert (
        refactoring.set_index("framework").loc[["horovod", "tf-mirrored"], "lines_touched"] > 0
    ).all()
    for framework in ("horovod", "tf-mirrored"):
        assert os.path.getsize(os.path.join(folder, "refactoring", f"{framework}.html")) > 1000
    assert not os.path.exists(os.path.join(folder, "refactoring", "tf-single.html"))
    # The step model's held-out check: one node of 1-2 CPU replicas leaves a
    # fit on 1 GPU only, which has no communication to fit; the table says so.
    holdout = pd.read_csv(os.path.join(folder, "tables", "predicted_holdout.csv"))
    print(Path(folder, "tables", "predicted_holdout.md").read_text())
    assert set(holdout["framework"]) == {"horovod", "tf-mirrored"}
    assert os.path.getsize(os.path.join(folder, "figures", "predicted.png")) > 1000
    # The study's exact config is saved beside its results, and regenerates them.
    saved = yaml.safe_load(Path(folder, "config.yaml").read_text())
    assert saved["grid"] == {**STUDY["grid"], "repeats": 1} and saved["study"] == "tiny-cpu"
    # The study replaced config.yaml rather than merging into it: no paper GPU cap.
    assert "max_total_gpus" not in saved["constraints"]
    # Each run's log holds the harness's per-block progress.
    log = Path(os.path.join(folder, "logs/train/horovod/small_cnn/b16/n1g2r1.log")).read_text()
    assert "block 2/2" in log


@pytest.mark.slow
def test_rerun_is_a_no_op_and_a_deleted_record_reruns_alone(study, tmp_path):
    """Over a minute where it is the first to ask for the study (its
    fixture trains it through Snakemake); then dry runs. The deleted point's
    retraining is the grid extension's run (below), which deletes one too."""
    _, args = study
    repo = _copy_of_study(study, tmp_path)
    again = snakemake(repo, "-n", *args)
    assert again.returncode == 0
    assert "Nothing to be done" in again.stdout + again.stderr

    # Editing the code does not rerun measurements (profiles/default's triggers).
    with open(os.path.join(repo, "workflow/rules/train.smk"), "a") as handle:
        handle.write("\n# an edit\n")
    edited = snakemake(repo, "-n", *args)
    assert train_jobs(edited.stdout + edited.stderr) == 0

    os.remove(os.path.join(repo, RECORD))
    dry = snakemake(repo, "-n", *args)
    output = dry.stdout + dry.stderr
    assert train_jobs(output) == 1 and "n1g2r1.json" in output


@pytest.mark.slow
def test_saved_config_regenerates_the_figures_without_training(study, tmp_path):
    repo, _ = study
    fresh = copy_repository(str(tmp_path / "fresh"))
    shutil.copytree(
        os.path.join(repo, "results", "tiny-cpu", "runs"),
        os.path.join(fresh, "results", "tiny-cpu", "runs"),
    )
    shutil.copy2(
        os.path.join(repo, "results", "tiny-cpu", "config.yaml"),
        os.path.join(fresh, "results", "tiny-cpu", "config.yaml"),
    )
    # Pretend the training environment is gone: regenerating must not need it.
    os.remove(os.path.join(fresh, ".venv-train"))
    args = ["--cores", "1", "--configfile", "results/tiny-cpu/config.yaml"]
    dry = snakemake(fresh, "-n", *args)
    assert train_jobs(dry.stdout + dry.stderr) == 0
    # The generated data archive is missing too: it is only an (ancient) input of
    # train, which does not run, so it must not be regenerated either.
    assert "rule generate_cifar100:" not in dry.stdout + dry.stderr
    run = snakemake(fresh, *args)
    assert run.returncode == 0, run.stderr[-3000:]
    assert os.path.exists(os.path.join(fresh, "results/tiny-cpu/figures/frameworks.png"))


def _copy_of_study(study, tmp_path) -> str:
    """The trained study's repository copy, records and Snakemake's state included."""
    repo, _ = study
    copy = str(tmp_path / "copy")
    shutil.copytree(repo, copy, symlinks=True)
    return copy


def _tree(folder: str) -> dict:
    """Every file below `folder` with its content and modification time."""
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in Path(folder).rglob("*")
        if p.is_file()
    }


@pytest.mark.slow
def test_changed_settings_are_refused_naming_the_keys_and_nothing_runs(study, tmp_path):
    # The defect: editing a measurement setting and running the same study
    # silently rewrote its saved config, so the records lost their explanation.
    repo = _copy_of_study(study, tmp_path)
    before = _tree(os.path.join(repo, "results", "tiny-cpu"))
    changed = {**STUDY, "benchmark": {**STUDY["benchmark"], "image_size": 64, "blocks": 3}}
    result = snakemake(repo, *local_study(repo, changed))
    assert result.returncode != 0
    assert (
        "Invalid study configuration: config keys benchmark.image_size, benchmark.blocks: "
        "study 'tiny-cpu' was measured with other settings (image_size 32 -> 64, "
        "blocks 2 -> 3; saved in ./results/tiny-cpu/config.yaml)"
    ) in result.stderr
    assert "name a new study, or move results/tiny-cpu away" in result.stderr
    assert train_jobs(result.stdout + result.stderr) == 0
    # Not a byte of the study changed: records, saved config, tables.
    assert _tree(os.path.join(repo, "results", "tiny-cpu")) == before


@pytest.mark.slow
def test_a_grid_extension_trains_only_the_new_points_and_saves_the_union(study, tmp_path):
    """Over a minute on a slow CPU (38 s on a Zen 5 VM, 94 s on an AVX2 one):
    two torch-ddp points trained through Snakemake from .venv-torch, and a
    deleted Horovod record retrained beside them, then three more Snakemake
    runs (a dry run, a subset, the saved union) that train nothing but
    rebuild the tables."""
    repo = _copy_of_study(study, tmp_path)
    folder = Path(repo, "results", "tiny-cpu")
    saved_before = (folder / "config.yaml").read_text()
    # A deleted record reruns alone (test_rerun_is_a_no_op_... plans it): here
    # it trains, with the new points, and appends to its point's timeline.
    os.remove(os.path.join(repo, RECORD))
    runs = folder / "runs"
    retrained = {os.path.relpath(Path(repo, p), runs) for p in (RECORD, timeline_path(RECORD))}
    records_before = {k: v for k, v in _tree(str(runs)).items() if k not in retrained}
    # The torch frameworks of ranks, one per launch kind, with the same
    # settings, each run from its own environment: an extension of both ecosystems.
    extended = {
        **STUDY,
        "torch_env": ".venv-torch",
        "grid": {**STUDY["grid"], "framework": [*STUDY["grid"]["framework"], *TORCH]},
    }
    args = local_study(repo, extended)
    dry = snakemake(repo, "-n", *args)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert train_jobs(dry.stdout + dry.stderr) == 2 * len(TORCH) + 1
    assert (folder / "config.yaml").read_text() == saved_before  # a dry run saves nothing
    run = snakemake(repo, *args, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    records_after = _tree(str(runs))
    assert {k: v for k, v in records_after.items() if k in records_before} == records_before
    assert json.loads(Path(repo, RECORD).read_text())["status"] == "ok"
    _check_each_ecosystem(folder)
    # The saved config is the union; the one it replaced is kept.
    saved = yaml.safe_load((folder / "config.yaml").read_text())
    assert saved["grid"]["framework"] == extended["grid"]["framework"]
    (kept,) = (folder / "config.history").iterdir()
    assert kept.read_text() == saved_before
    assert "tiny-cpu/config.yaml extended; the previous one is" in run.stderr
    # A run of only some of its points changes nothing saved and trains nothing.
    subset = {**STUDY, "grid": {**STUDY["grid"], "framework": ["horovod"]}}
    again = snakemake(repo, *local_study(repo, subset), "--forcerun", "tables")
    assert again.returncode == 0, again.stderr[-3000:]
    assert train_jobs(again.stdout + again.stderr) == 0
    assert yaml.safe_load((folder / "config.yaml").read_text()) == saved
    assert len(list((folder / "config.history").iterdir())) == 1
    # The saved union rebuilds every table, the new frameworks' included.
    rebuilt = snakemake(repo, "--cores", "1", "--configfile", "results/tiny-cpu/config.yaml")
    assert rebuilt.returncode == 0 and train_jobs(rebuilt.stdout + rebuilt.stderr) == 0
    assert "PyTorch DDP" in (folder / "tables/table1.md").read_text()


# A torch framework of ranks, run from .venv-torch: each launch kind of
# either ecosystem starts its ranks as tests/harness and tests/torch run
# them, and through SLURM as the lab study does (test_slurm.py); here is the
# local executor's routing of a point to its ecosystem's environment.
TORCH = ["torch-ddp"]


def _check_each_ecosystem(folder: Path) -> None:
    """Each train job ran from the environment its framework's registry entry
    names, and the tables put each torch framework beside its TensorFlow one."""
    tidy = pd.read_csv(folder / "throughput.csv")
    assert len(tidy) == 5 + 2 * len(TORCH) and set(tidy["status"]) == {"ok"}
    for path in tidy["record"]:
        record = json.loads(Path(folder.parent.parent, path).read_text())
        provenance = record["provenance"]
        if record["framework"] in TORCH:
            assert provenance["torch"].startswith("2.13.0") and "tensorflow" not in provenance
        else:
            assert provenance["tensorflow"] == "2.15.1" and "torch" not in provenance
        assert len(provenance["processes"]) == record["processes"]
    table1 = (folder / "tables" / "table1.md").read_text()
    for name in ("horovod", *TORCH):
        assert f"| {label(name)} (images/sec) |" in table1
    cross = pd.read_csv(folder / "tables" / "cross_ecosystem.csv")
    pairs = set(zip(cross["framework"], cross["versus"], cross["gpus"], strict=True))
    assert pairs == {
        (label(name), label(framework_spec(name).compared_with), gpus)
        for name in TORCH
        for gpus in (1, 2)
    }
    ratio = cross["framework_images_per_sec_mean"] / cross["versus_images_per_sec_mean"]
    assert cross["ratio"].to_numpy() == pytest.approx(ratio.to_numpy()) and (ratio > 0).all()
    efficiency = pd.read_csv(folder / "tables" / "efficiency.csv")
    one_gpu = efficiency[efficiency["gpus"] == 1]
    # Speed-up against each framework's own 1-GPU run, torch ones too.
    assert set(one_gpu["framework"]) == {"tf-single", "horovod", "tf-mirrored", *TORCH}
    assert (one_gpu["speedup"] == 1.0).all()
    # The refactoring table gains the torch frameworks and their base.
    refactoring = pd.read_csv(folder / "tables" / "refactoring.csv")
    assert {"torch-single", *TORCH} <= set(refactoring["framework"])


@pytest.mark.slow
@pytest.mark.parametrize("how", ["named", "linked"])
def test_a_train_job_into_a_cached_study_is_refused(repo_copy, run_store, how):
    # The published cache holds records trainscale did not measure: whether a
    # study is named after it or its folder leads there, nothing may train
    # into it.
    published = Path(repo_copy, "results", "published")
    before = _tree(str(published))
    name = "published"
    if how == "linked":
        name = "mine"
        os.symlink("published", os.path.join(repo_copy, "results", "mine"))
    study = {**STUDY, "study": name, "reference": None}
    study["benchmark"] = {**STUDY["benchmark"], "data_dir": "data"}
    result = snakemake(repo_copy, *local_study(repo_copy, study))
    assert result.returncode != 0
    assert (
        f"Invalid study configuration: config key study: results/{name} holds records "
        "trainscale did not measure"
    ) in result.stderr
    assert "is read-only, but 5 point(s) of this grid have no record there" in result.stderr
    assert train_jobs(result.stdout + result.stderr) == 0
    if how == "linked":
        assert _tree(str(published)) == before
        return
    # Rebuilding its tables from the cache is fine; retraining it is not.
    args = ["--cores", "1", "--configfile", "results/published/config.yaml"]
    forced = snakemake(repo_copy, *args, "--forcerun", "train")
    assert forced.returncode != 0 and "No rule to produce train" in forced.stderr
    # (The suite's one rebuild of the cache, in a copy of its own: conftest.rebuilt_cache.)
    rebuilt = Path(rebuilt_cache(run_store, "published")["repo"], "results", "published")
    after = _tree(str(rebuilt))
    assert {k: v for k, v in after.items() if k in before} == before
    assert not any(k.startswith(("config.history", "logs/train")) for k in after)


@pytest.mark.slow
def test_knob_axes_run_as_grid_points_of_their_own(tmp_path):
    """Over a minute on a slow CPU (28 s on a Zen 5 VM, 74 s on an AVX2 one):
    a study of its own, 4 points trained through Snakemake (XLA's two values
    for tf-single, Horovod's two compressions), and its analyses."""
    repo = copy_repository(str(tmp_path / "repo"))
    study = study_variant(
        "knobs",
        # XLA for every framework; fp16 compression for Horovod only. XLA's
        # second value for tf-single alone: a knob axis's points are
        # constrained as any axis's are.
        grid={
            "framework": ["tf-single", "horovod"],
            "gpus_per_node": [1],
            "xla": [False, True],
            "horovod_compression": ["none", "fp16"],
        },
        constraints={"exclude": [{"framework": "horovod", "xla": True}]},
    )
    args = [*local_study(repo, study), "--until", "tables", "figures"]  # what it reads
    result = snakemake(repo, *args, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    runs = Path(repo, "results", "knobs", "runs")
    records = {str(p.relative_to(runs)): json.loads(p.read_text()) for p in runs.rglob("*.json")}
    # TensorFlow's runs are not labelled with Horovod's compression: they do not read it.
    assert sorted(records) == sorted(
        [f"tf-single/small_cnn/b16/xla={x}/n1g1r1.json" for x in ("false", "true")]
        + [
            f"horovod/small_cnn/b16/xla=false+horovod_compression={c}/n1g1r1.json"
            for c in ("none", "fp16")
        ]  # fmt: skip
    )
    for path, record in records.items():
        assert record["status"] == "ok", path
        knobs = dict(parse_knobs(path.split("/")[3]))
        assert str(record["settings"]["xla"]).lower() == knobs["xla"]
        # A knob the framework does not read was not passed: its default.
        compression = knobs.get("horovod_compression", "none")
        assert record["settings"]["horovod_compression"] == compression
    table = Path(repo, "results/knobs/tables/table1.md").read_text()
    assert "| Model | Batch/GPU | Knobs | GPUs |" in table
    assert "Horovod (horovod_compression=fp16) (images/sec)" in table
    assert "| small_cnn | 16 | xla=true | 1 |" in table
    assert Path(repo, "results/knobs/figures/frameworks.png").stat().st_size > 0
    again = snakemake(repo, "-n", *args)
    assert train_jobs(again.stdout + again.stderr) == 0
