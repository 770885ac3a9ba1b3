"""What every suite shares: the store of real runs (tests/run_store.py) and
the data sets made once for a whole pytest run, whichever suite runs it.

A suite's own conftest.py (tests/harness, tests/torch, tests/workflow) adds
its helpers. Test modules import helpers from `runs`, not from `conftest`:
several conftest.py files load, and `conftest` names whichever loaded last.
"""

from __future__ import annotations

import os

import pytest

# Set for each test: whether it may train (it is marked `slow`). `make
# test-fast` runs the others, which must train nothing: runs.trainscale and
# the store refuse a training run for them (runs.check_may_train).
MAY_TRAIN = "TRAINSCALE_TEST_MAY_TRAIN"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    os.environ[MAY_TRAIN] = "1" if item.get_closest_marker("slow") else "0"


@pytest.fixture(scope="session")
def run_store(tmp_path_factory):
    from run_store import RunStore, store_root

    return RunStore(store_root(tmp_path_factory))


@pytest.fixture(scope="session")
def cifar_dir(run_store):
    """A small data set in the real cifar-100-python format (the folder
    form), the same folder for every test of the pytest run."""
    from runs import make_cifar_dir

    return run_store.folder("cifar", make_cifar_dir)


def pytest_terminal_summary(terminalreporter):
    from runs import print_shown

    print_shown(terminalreporter)
