"""`trainscale run`: one grid point on the resources it was given (a machine
of its own, or a SLURM job), its outcome recorded even where its processes
wrote nothing (a timeout, running out of memory, a failure on the last attempt)."""

from __future__ import annotations

import dataclasses
import os
import sys

from trainscale.catalogue.options import RunOptions
from trainscale.catalogue.settings import RunSettings, check_data_files


def own_log_tail(lines: int = 30) -> str:
    """The last lines of the file this process's stderr goes to (the job's log), if any."""
    from trainscale.core.records import log_tail

    try:
        path = os.readlink("/proc/self/fd/2")
    except OSError:
        path = ""
    sys.stderr.flush()
    if not os.path.isfile(path):
        return "(stderr is not a file: no log to quote)"
    return log_tail(path, lines)


def run_point(settings: RunSettings, options: RunOptions) -> int:
    """`trainscale run`: launch one grid point's processes, and record what
    became of them (a timeout, running out of memory, a failure on the last
    attempt) where they wrote no record of their own."""
    from trainscale.core.faults import clear_side_files
    from trainscale.core.records import atomic_write_json, outcome_record, read_record
    from trainscale.launching.containers import container_provenance
    from trainscale.launching.launch import launch

    output = options.output or (
        f"trainscale-{settings.framework}-{settings.model}-n{settings.nodes}"
        f"g{settings.gpus_per_node}-b{settings.batch_size}.json"
    )
    check_data_files(settings)
    if options.attempt == 1:  # the grid point's timeline starts with its first attempt
        clear_side_files(output)
    # Asked before the clock starts: the runtime's version, from outside the container.
    container = container_provenance(settings.container, options.container_command)
    result = launch(settings, dataclasses.replace(options, output=output))
    code = result.code
    outcome = _outcome(result, options)
    if outcome:
        status, error = outcome
        record = outcome_record(settings, status, error, result.seconds)
        atomic_write_json(output, {**record, **container})
        print(
            f"{settings.framework:<15} {settings.model} n{settings.nodes}g"
            f"{settings.gpus_per_node} b{settings.batch_size}: {status.upper()} after "
            f"{result.seconds:.1f} s ({error.splitlines()[0]}) -> {output}"
        )
        return 0
    if code != 0:
        print(f"trainscale run: error: {settings.framework} exited with {code}", file=sys.stderr)
        return code if code > 0 else 128 - code
    record = read_record(output)
    if container:
        atomic_write_json(output, {**record, **container})
    print(_summary(record, output))
    return 0


def _outcome(result, options: RunOptions) -> tuple[str, str] | None:
    """(status, error) of a launch that ended without a record of its own to
    keep: stopped at a time limit, out of memory, or failed on its last
    attempt (an earlier attempt's failure is left to the retry)."""
    from trainscale.core.slurm import in_slurm_job, slurm_job_reason

    code = result.code
    reason = slurm_job_reason() if result.terminated and in_slurm_job() else ""
    if result.timed_out:
        return (
            "timeout",
            f"stopped by the watchdog after {result.seconds:.0f} s "
            "(--timeout, or the SLURM time limit less a margin)",
        )
    if reason == "TimeLimit":
        return ("timeout", f"SLURM ended the job at its time limit after {result.seconds:.0f} s")
    if code != 0 and result.out_of_memory:
        return ("oom", result.out_of_memory)
    if code != 0 and options.attempts and options.attempt >= options.attempts:
        why = f"SIGTERM (SLURM reason: {reason or 'none given'})" if result.terminated else code
        return ("failed", f"exited with {why}; log tail:\n{own_log_tail()}")
    return None


def _summary(record: dict, output: str) -> str:
    """The run's one line: its throughput, and where its record is."""
    rate, per_replica = record["images_per_sec"], record["per_replica_images_per_sec"]
    tokens = record.get("tokens_per_sec")  # a text model's
    tokens = f", {tokens['mean']:.0f} tokens/sec" if tokens else ""
    return (
        f"{record['framework']:<15} {record['model']} n{record['nodes']}g{record['gpus_per_node']} "
        f"b{record['batch_size']} {record['device']}: "
        f"{rate['mean']:.1f} ± {rate['std']:.1f} images/sec total "
        f"({per_replica['mean']:.1f} per replica)" + tokens + f" -> {output}"
    )
