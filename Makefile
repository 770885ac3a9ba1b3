# trainscale: every target installs what it needs first (idempotent), so a
# fresh Debian machine needs nothing but `make test` or `make demo`.
SHELL := /bin/bash
PYTHON ?= python3.11
TRAIN_VENV ?= .venv-train
VENV ?= .venv
DEMO_DIR ?= results/demo-harness

.PHONY: help setup system train-env analysis-env demo test test-fast lint format clean

help:
	@echo "make demo       run every framework once on the CPU (the main job)"
	@echo "make test       the test suite (installs everything first)"
	@echo "make test-fast  the tests that start no multi-process training"
	@echo "make lint       ruff"
	@echo "make setup      install system packages and both environments"

setup: train-env analysis-env

system:
	bash tools/install-system.sh

train-env: system
	PYTHON=$(PYTHON) bash tools/install-train-env.sh $(TRAIN_VENV)

analysis-env:
	PYTHON=$(PYTHON) bash tools/install-analysis-env.sh $(VENV)

# Until the Snakemake study lands, the demo is every framework run by hand:
# VGG-16 at 32x32 on a generated CIFAR-100-format archive, 2 CPU replicas.
demo: train-env
	TRAIN_VENV=$(TRAIN_VENV) DEMO_DIR=$(DEMO_DIR) bash tools/demo-harness.sh

test: train-env
	$(TRAIN_VENV)/bin/python -m pytest

test-fast: train-env
	$(TRAIN_VENV)/bin/python -m pytest -m "not slow"

lint: train-env
	$(TRAIN_VENV)/bin/ruff check src tests
	$(TRAIN_VENV)/bin/ruff format --check src tests

format: train-env
	$(TRAIN_VENV)/bin/ruff format src tests
	$(TRAIN_VENV)/bin/ruff check --fix src tests

clean:
	rm -rf $(DEMO_DIR) .pytest_cache .ruff_cache
