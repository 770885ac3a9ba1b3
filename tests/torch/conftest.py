"""The torch frameworks' tests, run by .venv-torch's Python (make test)."""

from __future__ import annotations

import os

import pytest
from runs import make_cifar_dir


@pytest.fixture(scope="session")
def cifar_dir(tmp_path_factory):
    return make_cifar_dir(tmp_path_factory.mktemp("cifar"))


@pytest.fixture(scope="session")
def tensorflow_python() -> str:
    """The TensorFlow environment's Python, to hold torch's models to Keras's."""
    python = os.environ.get("TRAINSCALE_TF_PYTHON", ".venv-train/bin/python")
    if not os.access(python, os.X_OK):
        pytest.fail(
            f"no TensorFlow environment at {python}: build it (make train-env) or "
            "set TRAINSCALE_TF_PYTHON"
        )
    return python


def pytest_terminal_summary(terminalreporter):
    from runs import print_shown

    print_shown(terminalreporter)
