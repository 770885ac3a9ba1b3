"""A pytest plugin: the CPU time of each test, its own process's and its
waited-for children's, one line per test appended to $CPU_REPORT
(CPU-seconds, wall seconds, the test's id, tab-separated):

    CPU_REPORT=/tmp/cpu.tsv PYTHONPATH=src:bench .venv/bin/python -m pytest -p cpu_per_test ...

Per test where bench/cpu_by_process.py is per kind of process. It counts
only what getrusage(RUSAGE_CHILDREN) sees: a process the test's tree
waited for. Not counted: Ray's actors and workers (Ray's daemons start
them), SLURM jobs (slurmd's), and a process tree killed before it reaped
its own children (mpirun's ranks under a SIGKILLed mpirun). A fixture's
run is counted in the first test that asks for it.
"""

import os
import resource
import time

import pytest


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cpu, wall = _cpu_seconds(), time.monotonic()
    yield
    with open(os.environ["CPU_REPORT"], "a") as report:
        report.write(f"{_cpu_seconds() - cpu:.2f}\t{time.monotonic() - wall:.2f}\t{item.nodeid}\n")
