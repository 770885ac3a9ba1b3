"""A full local study on the CPU, for real: records, tables, figures, and what reruns."""

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import (
    copy_repository,
    local_study,
    rebuilt_cache,
    snakemake,
    start_snakemake,
    train_jobs,
)

from trainscale.core.records import is_record_name
from trainscale.study.registry import framework_spec, label
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
    run = snakemake(repo, *args, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(Path(repo, RECORD).read_text())["status"] == "ok"


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
    repo = _copy_of_study(study, tmp_path)
    folder = Path(repo, "results", "tiny-cpu")
    saved_before = (folder / "config.yaml").read_text()
    records_before = _tree(str(folder / "runs"))
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
    assert train_jobs(dry.stdout + dry.stderr) == 2 * len(TORCH)
    assert (folder / "config.yaml").read_text() == saved_before  # a dry run saves nothing
    run = snakemake(repo, *args, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    records_after = _tree(str(folder / "runs"))
    assert {k: v for k, v in records_after.items() if k in records_before} == records_before
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
    args = local_study(repo, study)
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


@pytest.mark.slow
def test_a_point_that_keeps_failing_is_retried_then_recorded_as_failed(tmp_path):
    # Asking for a GPU on this GPU-less machine fails every time, for real.
    repo = copy_repository(str(tmp_path / "repo"))
    study = study_variant(
        "fails",
        grid={"framework": ["tf-single"], "gpus_per_node": [1]},
        benchmark={"device": "gpu", "dataset": "synthetic"},
        train_retries=1,
        constraints={},
    )
    del study["benchmark"]["data_dir"], study["benchmark"]["generate_cifar100_images"]
    args = local_study(repo, study)
    result = snakemake(repo, *args)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "Trying to restart job" in output  # the first attempt failed and was retried
    record = json.loads(
        Path(repo, "results/fails/runs/tf-single/small_cnn/b16/n1g1r1.json").read_text()
    )
    assert record["status"] == "failed" and record["images_per_sec"] is None
    assert "GPU(s) per the job request but sees 0" in record["error"]  # the log's tail
    table = Path(repo, "results/fails/tables/table1.md").read_text()
    assert "| small_cnn | 16 | 1 | FAILED |" in table
    # Not rerun by a later run: retrying failed points is the user's call.
    again = snakemake(repo, "-n", *args)
    assert train_jobs(again.stdout + again.stderr) == 0


def _processes_of(repo: str, command: bytes) -> list[int]:
    """The `trainscale <command>` processes of this repository copy running now."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            cwd = os.readlink(f"/proc/{pid}/cwd")  # the rule's paths are relative
        except OSError:
            continue
        if b"trainscale\0" + command + b"\0" in cmdline and cwd == repo:
            found.append(int(pid))
    return found


def _descendants(pid: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            children += map(int, (task / "children").read_text().split())
    return [pid for child in children for pid in (child, *_descendants(child))]


def _training_of(repo: str) -> bool:
    """Whether a `trainscale train` process of this repository copy runs now."""
    return bool(_processes_of(repo, b"train"))


def _new_points_in_their_timed_blocks(repo: str) -> list[str]:
    """The records that `trainscale train` processes of this copy are writing,
    not written yet, whose run has logged its first timed block.

    A training that has written its record still runs for a second or two (it
    exits), and Snakemake has not yet seen its job end: interrupted then, that
    record is whole but marked incomplete.
    """
    found = []
    for pid in _processes_of(repo, b"train"):
        with contextlib.suppress(OSError, ValueError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            record = argv[argv.index("--output") + 1]
            if os.path.exists(os.path.join(repo, record)):
                continue
            # Its rule's log: runs/<point>.json logs to logs/train/<point>.log.
            log = Path(repo, record.replace("/runs/", "/logs/train/", 1)).with_suffix(".log")
            if log.exists() and re.search(r"block 1/\d+ ", log.read_text()):
                found.append(record)
    return found


def _wait_for_a_point_in_its_timed_blocks(repo: str, snakemake_run, after_a_record_in=None):
    """Until a training of this copy logs its first timed block (once a record
    is in the folder `after_a_record_in`, if given): polled, within 300 s."""
    deadline = time.monotonic() + 300
    while not (
        (after_a_record_in is None or list(after_a_record_in.rglob("n*.json")))
        and _new_points_in_their_timed_blocks(repo)
    ):
        assert snakemake_run.poll() is None, "snakemake ended before it was interrupted"
        assert time.monotonic() < deadline, "no training reached its timed blocks in 300 s"
        time.sleep(0.2)


@pytest.mark.slow
def test_a_job_killed_on_its_last_attempt_is_recorded_as_failed(tmp_path):
    # The launcher and its training killed at once (as the OOM killer of a
    # whole job, or an admin, would): the run writes nothing, Snakemake sees
    # the job fail and deletes its output; the workflow records the point.
    repo = copy_repository(str(tmp_path / "repo"))
    study = study_variant(
        "killed",
        grid={"framework": ["tf-single"], "gpus_per_node": [1], "batch_size": [16, 32]},
        benchmark={"blocks": 100, "steps_per_block": 10, "time_budget_seconds": 5},
        train_retries=0,
        constraints={},
    )
    args = local_study(repo, study)
    snakemake_run = start_snakemake(repo, *args)
    try:
        _wait_for_a_point_in_its_timed_blocks(repo, snakemake_run)
        # The launcher first (it would record a failing training itself), then
        # the training it started.
        (launcher,) = _processes_of(repo, b"run")
        training = _descendants(launcher)
        for pid in (launcher, *training):
            os.kill(pid, signal.SIGKILL)
        output, _ = snakemake_run.communicate(timeout=600)
    finally:
        if snakemake_run.poll() is None:
            snakemake_run.kill()
    assert snakemake_run.returncode != 0, output[-4000:]  # the job failed, as Snakemake saw
    assert "1 grid point(s) failed on their last attempt" in output, output[-4000:]
    runs = Path(repo, "results", "killed", "runs", "tf-single", "small_cnn")
    records = {p.parent.name: json.loads(p.read_text()) for p in runs.rglob("n1g1r1.json")}
    assert sorted(r["status"] for r in records.values()) == ["failed", "ok"], records
    killed = next(r for r in records.values() if r["status"] == "failed")
    assert killed["error"].startswith("the job ended without writing a record")
    assert "--- tail of results/killed/logs/train/tf-single/small_cnn/" in killed["error"]
    assert killed["provenance"]["recorded_by"].startswith("the workflow on ")
    # The next run trains nothing and builds the tables from everything else.
    again = snakemake(repo, *args)
    assert again.returncode == 0, again.stderr[-4000:]
    assert train_jobs(again.stdout + again.stderr) == 0
    table = Path(repo, "results/killed/tables/table1.md").read_text()
    batch = killed["batch_size"]
    assert f"| small_cnn | {batch} | 1 | FAILED |" in table, table


def _interrupt(repo: str, args: list[str], signal_number: int, runs: Path) -> set[str]:
    """Snakemake with `args` in a session of its own (Ctrl-C reaches every
    process of the terminal's group; kill -9 of the group is the machine going
    away under it), given `signal_number` once a training of a point not yet
    recorded (and after a first record) is in its timed blocks. Then, once no
    training of the copy is left, every record is whole: the records there."""
    snakemake_run = start_snakemake(
        repo, *args, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        _wait_for_a_point_in_its_timed_blocks(repo, snakemake_run, after_a_record_in=runs)
        os.killpg(snakemake_run.pid, signal_number)
        snakemake_run.wait(timeout=120)
    finally:
        if snakemake_run.poll() is None:
            os.killpg(snakemake_run.pid, signal.SIGKILL)
    # Ctrl-C stops the job too. kill -9 of Snakemake's group need not reach a
    # Horovod rank (mpirun starts each rank in a process group of its own): it
    # may train on, an orphan, and write its record whole; wait for it as a
    # user would before rerunning.
    deadline = time.monotonic() + 120
    while _training_of(repo):
        assert signal_number == signal.SIGKILL, "Ctrl-C left a training running"
        assert time.monotonic() < deadline, "an orphaned training never ended"
        time.sleep(0.2)
    # Whatever is there is whole: every record parses; leftovers are only
    # hidden temp files, which nothing reads.
    for path in runs.parent.rglob("*.json"):
        if is_record_name(path.name):
            json.loads(path.read_text())
    return {p.name for p in runs.rglob("n*.json")}


def _missing_trainings(repo: str, args: list[str], written: set[str]) -> None:
    """A rerun would train only the missing points (and, after kill -9, the
    orphan's point: its record is whole, but Snakemake never saw the job end)."""
    dry = snakemake(repo, "-n", *args, "--rerun-incomplete")
    assert dry.returncode == 0, dry.stderr[-4000:]
    assert train_jobs(dry.stdout + dry.stderr) in (3 - len(written), 4 - len(written))


@pytest.mark.slow
def test_an_interrupted_study_leaves_no_half_result_and_resumes(tmp_path):
    """Ctrl-C inside the study's second training, then kill -9 of its rerun
    inside another: each time what is written is whole, and the next run
    trains only what is missing. One study, interrupted twice: over a
    minute for its 3 points' trainings (two of them cut short), 3 runs of
    Snakemake and the analysis once."""
    repo = copy_repository(str(tmp_path / "repo"))
    study = study_variant(
        "interrupted",
        grid={"framework": ["tf-single", "horovod"], "gpus_per_node": [1, 2]},
        # Long enough to be interrupted inside a training's timed blocks
        # (5 s of them, after its start-up), short enough that resuming
        # costs little.
        benchmark={"blocks": 200, "steps_per_block": 10, "time_budget_seconds": 5},
        # No retries: a job cancelled by Ctrl-C is not a failure to record.
        train_retries=0,
    )
    args = local_study(repo, study)
    runs = Path(repo, "results", "interrupted", "runs")

    written = _interrupt(repo, args, signal.SIGINT, runs)
    assert 1 <= len(written) < 3
    _missing_trainings(repo, args, written)

    written = _interrupt(repo, [*args, "--rerun-incomplete"], signal.SIGKILL, runs)
    # A killed Snakemake leaves its lock: the next run says so and --unlock frees it.
    locked = snakemake(repo, *args)
    assert locked.returncode != 0 and "cannot be locked" in locked.stderr
    assert snakemake(repo, *args, "--unlock").returncode == 0
    _missing_trainings(repo, args, written)

    resumed = snakemake(repo, *args, "--rerun-incomplete")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    records = [json.loads(p.read_text()) for p in runs.rglob("n*.json")]
    assert len(records) == 3 and {r["status"] for r in records} == {"ok"}
    assert (runs.parent / "throughput.csv").exists()
