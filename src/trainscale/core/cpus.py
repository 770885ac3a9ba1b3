"""How many threads a CPU rank runs: its share of the cores it may use."""

from __future__ import annotations

import os


def local_cpu_count() -> int:
    """CPUs this process may use (respects affinity masks set by SLURM or taskset)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def cpu_share(processes_on_node: int) -> int:
    """Threads for one of `processes_on_node` processes on a CPU run: its share of
    the CPUs it may use, and no more than SLURM granted each task
    (SLURM_CPUS_PER_TASK) where the cluster does not pin tasks to cores (the
    SLURM lab's nodes share this machine's): threads over the grant would
    measure contention with the node's other ranks, not the run."""
    share = max(1, local_cpu_count() // max(1, processes_on_node))
    granted = os.environ.get("SLURM_CPUS_PER_TASK", "")
    return min(share, int(granted)) if granted.isdigit() and int(granted) > 0 else share
