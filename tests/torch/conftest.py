"""The torch frameworks' tests, run by .venv-torch's Python (make test)."""

from __future__ import annotations

import os

import pytest


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


def pytest_configure(config):
    """Each xdist worker on a core of its own: this suite ran in 944 s so,
    against 1133 s unpinned the same day (bench/README.md). Not the
    TensorFlow suite: its two-rank Horovod runs on one core were slower."""
    from run_processes import pin_this_xdist_worker

    pin_this_xdist_worker()
