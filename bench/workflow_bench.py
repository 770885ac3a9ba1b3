"""The workflow at the size real studies reach: the DAG, and the analysis.

Run by bench/run.py with the analysis environment (.venv); prints one JSON
object on stdout.

- `snakemake -n` over a grid of about 2,000 training jobs: wall time and the
  peak memory of the Snakemake process;
- collect + tables + figures (the functions the rules' scripts call, in a
  process of their own) over 10,000 records of one study: wall time of each
  stage and the peak memory. The records are made up for this benchmark and
  say so (`source: bench`); collect checks them like any others.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SNAKEMAKE = os.path.join(os.path.dirname(sys.executable), "snakemake")


def big_config(study: str, repeats: int) -> dict:
    """A study of 2,135 points x `repeats`: every framework and job shape up to 64 nodes."""
    return {
        "study": study,
        "reference": None,
        # The repository's own: the dry run runs in a copy of the workflow,
        # and warns of a train_env that has no bin/trainscale (missing_environment).
        "train_env": os.path.join(REPO, ".venv-train"),
        "grid": {
            "framework": ["horovod", "tf-multiworker", "tf-mirrored", "tf-single"],
            "nodes": [1, 2, 4, 8, 16, 32, 64],
            "gpus_per_node": [1, 2, 4, 8],
            "model": ["vgg16", "resnet50", "inception_v3", "mobilenet_v2", "small_cnn"],
            "batch_size": [8, 16, 32, 64, 128, 256, 512],
            "repeats": repeats,
        },
        "constraints": {
            "exclude": [
                {"framework": ["tf-mirrored", "tf-single"], "nodes": {"min": 2}},
                {"framework": "tf-single", "gpus_per_node": {"min": 2}},
            ]
        },
        "benchmark": {"dataset": "synthetic", "image_size": 224, "device": "gpu"},
    }


def run_measured(command: list[str], cwd: str) -> tuple[float, float, str]:
    """Wall seconds and peak RSS (MiB) of one child process, and its output."""
    start = time.perf_counter()
    child = subprocess.Popen(
        command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    output = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{output[-3000:]}")
    return wall, usage.ru_maxrss / 1024, output


def dry_run(work: str) -> dict:
    for name in ("Snakefile", "workflow", "profiles", "src", "envs", "examples"):
        source = os.path.join(REPO, name)
        target = os.path.join(work, name)
        if os.path.isdir(source):
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
    with open(os.path.join(work, "config.yaml"), "w") as handle:
        yaml.safe_dump(big_config("bench-dag", 1), handle)
    wall, peak, output = run_measured([SNAKEMAKE, "-n", "--cores", "1"], work)
    # The job-stats table that ends a dry run: "train   1965".
    counts = [line.split() for line in output.splitlines() if line.startswith("train ")]
    return {"train_jobs": int(counts[-1][1]), "wall_seconds": wall, "peak_mib": peak}


def make_records(study_root: str, config: dict) -> tuple[list[str], dict]:
    """Write one made-up record per point of `config`; return their paths and expected settings."""
    from trainscale.core.records import record_head
    from trainscale.study.study import expand_grid, record_path, run_settings

    rng = np.random.default_rng(0)
    paths, expected = [], {}
    for point in expand_grid(config):
        settings = run_settings(config, point)
        path = record_path(config["study"], point, root=study_root)
        rate = float(rng.uniform(100, 1000)) * point.gpus
        record = {
            **record_head(settings, "ok"),
            "images_per_sec": {"mean": rate, "std": rate * 0.02, "samples": [rate] * 4},
            "per_replica_images_per_sec": {"mean": rate / point.gpus, "std": 0.0},
            "source": "bench",  # made up for this benchmark, never measured
        }
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            json.dump(record, handle)
        paths.append(path)
        expected[path] = settings.to_dict()
    return paths, expected


def analysis(work: str) -> dict:
    """collect, tables and figures over 10,000 records, in this (fresh) process."""
    from trainscale.analysis.figures import write_figures
    from trainscale.analysis.tables import write_tables
    from trainscale.analysis.tidy import write_throughput

    config = big_config("bench-analysis", 5)
    paths, expected = make_records(os.path.join(work, "results"), config)
    folder = os.path.join(work, "results", config["study"])
    tidy = os.path.join(folder, "throughput.csv")
    seconds = {}
    start = time.perf_counter()
    write_throughput(config["study"], paths, tidy, expected)
    seconds["collect"] = time.perf_counter() - start
    start = time.perf_counter()
    write_tables(tidy, os.path.join(folder, "tables"), None, "horovod", [])
    seconds["tables"] = time.perf_counter() - start
    start = time.perf_counter()
    # As the figures rule runs it: `threads: 2` (workflow/rules/figures.smk).
    write_figures(tidy, os.path.join(folder, "figures"), None, "horovod", [], workers=2)
    seconds["figures"] = time.perf_counter() - start
    return {
        "records": len(paths),
        "seconds": seconds,
        "total_seconds": sum(seconds.values()),
        # The largest process: this one, or a figure-drawing child.
        "peak_mib": max(
            resource.getrusage(who).ru_maxrss / 1024
            for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
        ),
    }


def main() -> None:
    if sys.argv[1:2] == ["analysis"]:  # the child process of the analysis benchmark
        json.dump(analysis(sys.argv[2]), sys.stdout)
        return
    with tempfile.TemporaryDirectory(prefix="trainscale-bench-") as work:
        os.makedirs(os.path.join(work, "dag"))
        dag = dry_run(os.path.join(work, "dag"))
        command = [sys.executable, __file__, "analysis", os.path.join(work, "analysis")]
        wall, _, output = run_measured(command, REPO)
    result = json.loads(output.strip().splitlines()[-1])
    result["process_wall_seconds"] = wall  # with interpreter start-up and imports
    json.dump({"dry_run": dag, "analysis": result}, sys.stdout, indent=2)


if __name__ == "__main__":
    main()
