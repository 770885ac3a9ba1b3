"""What the workflow does when it starts and when it fails, behind one call
each (the Snakefile's onstart and onerror): package logic, tested like the
rest, not code in a rule file.

Snakemake calls onstart only for a real run (never for -n, --dag, --summary
or --report) and onerror once a run has failed; neither in the job steps it
spawns, which run with --no-hooks.
"""

from __future__ import annotations

import os

import yaml

from trainscale.core.records import atomic_write_json, lost_job_record
from trainscale.study.jobs import slurm_resources
from trainscale.study.study import GridPoint, run_settings
from trainscale.study.study_folder import StudyFolder, save_study_config


class RunRefused(Exception):
    """A real run refused before any job starts; the message is one line."""


def on_start(refusals: list[str], folder: StudyFolder, results: str, logger) -> None:
    """Refuse a real run for what a dry run only warned of (a missing training
    environment, records to relabel), then save the study's config:
    results/{study}/config.yaml becomes the union of the grids the study has
    run (checked at parse time), the version it replaces kept in
    config.history/. Never in a read-only (cached) study."""
    if refusals:
        raise RunRefused(refusals[0])
    if folder.config_to_save is None:
        return
    text = yaml.safe_dump(folder.config_to_save, sort_keys=False)
    kept = save_study_config(results, text)
    if kept:
        logger.info(f"trainscale: {results}/config.yaml extended; the previous one is {kept}")


def last_slurm_log(job) -> list[str]:
    """The SLURM log of a job's last attempt (a list of none or one), where the
    SLURM plugin keeps them: .snakemake/slurm_logs/rule_<rule>/<wildcard values
    joined by _>/<SLURM job id>.log, one per attempt."""
    folder = os.path.join(
        ".snakemake",
        "slurm_logs",
        f"rule_{job.rule.name}",
        "_".join(job.wildcards).replace(os.sep, "_"),
    )
    if not os.path.isdir(folder):
        return []
    logs = [os.path.join(folder, name) for name in os.listdir(folder) if name.endswith(".log")]
    return [max(logs, key=os.path.getmtime)] if logs else []


def on_error(workflow, config: dict, logger) -> list[str]:
    """A record (`failed`, or `timeout` at SLURM's time limit) for each train
    job that ended on its last attempt without writing one (SLURM ended it, or
    its launcher was killed). Returns the records written.

    The run records every failure it sees itself; these are the ones Snakemake
    saw instead, and it deletes a failed job's output. Only jobs whose retries
    are spent count: Snakemake's scheduler keeps exactly those in `failed`; jobs
    it cancelled on Ctrl-C are not there and stay unrecorded (rerun them with
    --rerun-incomplete). The next run builds the tables with FAILED there.
    """
    failed = getattr(getattr(workflow, "scheduler", None), "failed", None)
    if failed is None:
        logger.warning(
            "trainscale: this Snakemake does not say which jobs failed; "
            "train jobs that failed on their last attempt have no record"
        )
        return []
    written = []
    for job in failed:
        if job.rule.name != "train" or os.path.exists(job.output.record):
            continue
        point = GridPoint.from_path(job.output.record)
        logs = [*job.log, *last_slurm_log(job)]
        limit = slurm_resources(config, point, job.attempt)["runtime"] * 60
        record = lost_job_record(run_settings(config, point), logs, limit)
        atomic_write_json(job.output.record, record)
        written.append(job.output.record)
    if written:
        logger.error(
            f"trainscale: {len(written)} grid point(s) failed on their last attempt; "
            "recorded from their logs (the tables will show FAILED or TIMEOUT): "
            + ", ".join(written)
            + ". Run the same command again to build the tables; to retry those "
            "points instead, delete their records."
        )
    return written
