"""The TensorFlow suite (.venv-train): its tests run the real `trainscale`
command in subprocesses (tests/runs.py); shared runs and data sets come from
tests/conftest.py."""
