"""The memory model against what the runs held: `memory_model_check`, one
row per run measured with `--tensor-memory` (a record's peak_tensor_bytes:
torch's memory timeline over one step after the timed ones, the live tensor
bytes at its peak), beside the bytes a rank `trainscale plan` counts for the
same configuration (trainscale.analysis.parallel_plan_memory.memory, with no
runtime reserve: the timeline counts tensors only). Where the model's peak
holds some bytes or not by the ranks' timing (its `timing` kind), the
prediction is a range, `predicted_bytes` its top, and a measure inside it
is no error; outside, the error is against the nearer end (range_error).

On a CPU a record's peak memory is the process's resident set (libraries,
the C library's freed pages), which the model does not count; the live
tensor bytes are what it does. Written with the memory study's tables
(trainscale.analysis.sharding_report.write_sharding); a study run without
`tensor_memory: true` gets the table's one line saying so.
"""

from __future__ import annotations

import pandas as pd

COLUMNS = [
    "framework",
    "model",
    "ranks",
    "configuration",
    "measured_bytes",
    "predicted_bytes",
    "error_percent",
    "predicted_states_bytes",
    "predicted_activations_bytes",
    "predicted_transients_bytes",
    "predicted_gathered_bytes",
    "predicted_buffers_bytes",
    "predicted_timing_bytes",
]
# The plan's memory kinds that are model states (memory_model.model_state_bytes).
STATES = ("parameters", "gradients", "optimizer")
OTHER_KINDS = ("activations", "transients", "gathered", "buffers", "timing")


def memory_check_rows(tidy: pd.DataFrame) -> pd.DataFrame:
    """A row per ok run of the tidy table (its `record` column a path this
    process can open) whose record counted its live tensor bytes."""
    from trainscale.analysis.parallel_plan import MemoryBudget
    from trainscale.analysis.parallel_plan_fit import configuration_of, workload_of
    from trainscale.analysis.parallel_plan_memory import memory
    from trainscale.analysis.tidy import series_label
    from trainscale.core.records import read_record

    found = []
    for _, row in tidy[(tidy["status"] == "ok") & tidy["record"].notna()].iterrows():
        record = read_record(row["record"])
        settings = record["settings"]
        measured, ranks = record.get("peak_tensor_bytes"), int(row["gpus"])
        config = configuration_of(row["framework"], ranks, settings)
        if not measured or config is None:
            continue
        workload = workload_of(settings, ranks)
        # A CPU run's collectives are gloo's (a GPU run's NCCL's).
        collectives = "gloo" if settings.get("device") == "cpu" else "nccl"
        held = memory(config, workload, MemoryBudget(0.0), row["framework"], settings, collectives)
        predicted = sum(held.values())
        found.append(
            {
                "framework": series_label(row["series"]),
                "model": row["model"],
                "ranks": ranks,
                "configuration": config.name,
                "measured_bytes": measured,
                "predicted_bytes": int(predicted),
                "error_percent": range_error(measured, predicted - held["timing"], predicted),
                "predicted_states_bytes": int(sum(held[kind] for kind in STATES)),
                **{f"predicted_{kind}_bytes": int(held[kind]) for kind in OTHER_KINDS},
            }
        )
    return pd.DataFrame(found, columns=COLUMNS)


def range_error(measured: float, low: float, high: float) -> float:
    """Percent by which [low, high] misses `measured`: 0 inside it, else
    against its nearer end (negative: the model predicts too little)."""
    nearer = min(max(measured, low), high)
    return round(100 * (nearer / measured - 1), 1)
