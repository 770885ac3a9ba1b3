"""Shared helpers: the tests run the real `trainscale` command in subprocesses."""

from __future__ import annotations

import pytest
from runs import TINY, TRAINSCALE, load_json, make_cifar_dir, trainscale  # noqa: F401


@pytest.fixture(scope="session")
def cifar_dir(tmp_path_factory):
    """A small data set in the real cifar-100-python format (the folder form)."""
    return make_cifar_dir(tmp_path_factory.mktemp("cifar"))


def pytest_terminal_summary(terminalreporter):
    from runs import print_shown

    print_shown(terminalreporter)
