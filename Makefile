# trainscale: every target installs what it needs first (idempotent), so a
# fresh Debian machine needs nothing but `make test` or `make demo`.
SHELL := /bin/bash
PYTHON ?= python3.11
TRAIN_VENV ?= .venv-train
# The torch frameworks' training environment (trainscale.catalogue.registry: torch_env).
TORCH_VENV ?= .venv-torch
LIGHTNING1_VENV ?= .venv-lightning1
VENV ?= .venv
DEMO_DIR ?= results/demo-harness

LOCAL_STUDY ?= results/local-cpu

NODES ?= 2
# GPU=1: the training environments' GPU builds (envs/train-gpu.yaml and
# envs/torch-gpu.yaml: TensorFlow with CUDA, PyPI's CUDA build of torch,
# Horovod with NCCL operations), e.g. `make setup GPU=1` on a GPU cluster.
GPU ?= 0
export GPU

# The harness's modules: what runs on GPU nodes, on Python 3.8+ (pyproject.toml),
# found from the registry's backend modules and their imports (tools/harness-modules.py).
HARNESS_MODULES = $(shell python3 tools/harness-modules.py) $(wildcard examples/*.py)
# An older stack for the harness (make test-compat): Python 3.8 and TensorFlow
# 2.11.0, as NVIDIA's tensorflow:23.03-tf2-py3 image has. pyenv's 3.8 if none is given.
COMPAT_VENV ?= .venv-compat
COMPAT_PYTHON ?= $(lastword $(wildcard $(shell pyenv root 2>/dev/null || echo /root/.pyenv)/versions/3.8.*/bin/python))
COMPAT_TENSORFLOW ?= 2.11.0

.PHONY: help setup system containers image docker slurm-packages train-env torch-env lightning1-env analysis-env demo demo-accuracy demo-harness test test-fast \
	docs docs-browser test-slurm test-compat slurm-lab-up slurm-lab-down lint format clean bench

help:
	@echo "make demo       the scaled-down study on this machine's CPU (the main job)"
	@echo "make demo-harness  every framework once through \`trainscale run\`, no Snakemake"
	@echo "make demo-accuracy  time to 90% test accuracy on real digits, 1 and 2 CPU replicas"
	@echo "make test       the test suite (installs everything first)"
	@echo "make test-fast  the tests that train no model (the inner loop: about 2 minutes)"
	@echo "make test-slurm only the tests on the SLURM lab cluster (started and stopped by them)"
	@echo "make test-compat the harness on Python 3.8 + TensorFlow 2.11 (.venv-compat)"
	@echo "make slurm-lab-up NODES=n / make slurm-lab-down   a SLURM cluster on this machine (root)"
	@echo "make bench      the harness's overhead ratios and the workflow at scale (bench/results.json)"
	@echo "make lint       ruff, snakefmt, snakemake --lint"
	@echo "make docs       the documentation site into site/ (mkdocs build --strict)"
	@echo "make image      the container image (envs/Containerfile) for Podman and ch-run"
	@echo "make docker     Docker's daemon, with that image loaded (the containers' third runtime)"
	@echo "make setup      install system packages and the four environments (GPU=1: CUDA builds)"

setup: train-env torch-env lightning1-env analysis-env

system:
	bash tools/install-system.sh

slurm-packages:
	bash tools/install-slurm.sh

slurm-lab-up: slurm-packages
	bash tests/slurm-lab/lab.sh up $(NODES)

slurm-lab-down:
	bash tests/slurm-lab/lab.sh down

train-env: system
	PYTHON=$(PYTHON) bash tools/install-env.sh train $(TRAIN_VENV) \
		tools/wheel-cache.sh tools/environment-pins.py envs/train-gpu.yaml pyproject.toml

# torch==2.13.0 (CPU wheel here) and Horovod built with its torch extension.
torch-env: system
	PYTHON=$(PYTHON) bash tools/install-env.sh torch $(TORCH_VENV) tools/wheel-cache.sh \
		tools/build-horovod-torch.sh tools/environment-pins.py envs/torch-gpu.yaml pyproject.toml

# lightning-horovod's: PyTorch Lightning 1.9.5 over .venv-torch's packages.
lightning1-env: torch-env
	TORCH_VENV=$(TORCH_VENV) bash tools/install-env.sh lightning1 $(LIGHTNING1_VENV) \
		tools/environment-pins.py envs/lightning1.yaml pyproject.toml

analysis-env:
	PYTHON=$(PYTHON) bash tools/install-env.sh analysis $(VENV) pyproject.toml

# The documentation site (mkdocs.yml): its reference pages are generated from
# the declarations at build time; --strict fails on a broken link.
docs: analysis-env
	$(VENV)/bin/mkdocs build --strict

# Podman and Charliecloud's ch-run (the `container` axis), from Debian.
containers:
	bash tools/install-containers.sh

# The image they run (envs/Containerfile): Debian's minbase and the training
# environments, built by the same install scripts; once per machine, reused
# while its inputs stay the same (tools/build-image.sh). IMAGE_ENVIRONMENTS:
# which (torch: the torch frameworks and Horovod's torch ranks, as the
# container studies run; "torch train": TensorFlow's too, minutes more).
IMAGE_ENVIRONMENTS ?= torch
image: containers
	IMAGE_ENVIRONMENTS="$(IMAGE_ENVIRONMENTS)" bash tools/build-image.sh

# Docker beside them: Debian's docker.io, its daemon, the image loaded into it.
docker: image
	bash tools/install-docker.sh

# Headless Chromium, which the docs test opens the built site in.
docs-browser:
	bash tools/apt-install.sh "docs browser" chromium

# The main job: the paper's study scaled down to this machine's CPU
# (profiles/local/study.yaml), through Snakemake with the local executor.
demo: train-env torch-env analysis-env
	$(VENV)/bin/snakemake --profile profiles/local
	@cat $(LOCAL_STUDY)/tables/table1.md
	@echo "tables: $(LOCAL_STUDY)/tables/  figures: $(LOCAL_STUDY)/figures/"

# Time to a trained model on real data (profiles/local/accuracy.yaml).
demo-accuracy: train-env torch-env analysis-env
	$(VENV)/bin/snakemake --profile profiles/local --configfile profiles/local/accuracy.yaml
	@cat results/digits-accuracy/tables/accuracy.md results/digits-accuracy/tables/ranks.md
	@echo "figure: results/digits-accuracy/figures/accuracy.png"

# Every framework once through the harness alone: VGG-16 at 32x32 on a
# generated CIFAR-100-format archive, 2 CPU replicas.
demo-harness: train-env torch-env lightning1-env
	TRAIN_VENV=$(TRAIN_VENV) TORCH_VENV=$(TORCH_VENV) LIGHTNING1_VENV=$(LIGHTNING1_VENV) \
		DEMO_DIR=$(DEMO_DIR) bash tools/demo-harness.sh

# Ratios measured side by side in one run (bench/run.py); prints, never fails on a goal.
# On a GPU node: make bench BENCH_DEVICE=gpu (adds the device matrix).
BENCH_DEVICE ?= cpu
bench: train-env torch-env analysis-env
	$(VENV)/bin/python bench/run.py --device $(BENCH_DEVICE)

# Three environments, three pytest runs: the harness under TensorFlow, then
# under torch (its models are held to Keras's, so it is told where TensorFlow
# is), and the workflow (real Snakemake, which itself trains through both)
# under .venv. tests/examples runs in both training suites, each time the
# examples of that environment's ecosystem. The SLURM tests start the lab
# cluster themselves (and stop it after).
#
# Each suite runs on two pytest-xdist workers (one on a 1-core machine). A
# real run several tests read is made once for the whole pytest run, by
# whichever worker asks first (tests/run_store.py); the SLURM lab's tests
# share one worker, their studies running side by side on the lab
# (xdist_group slurm-lab, tests/workflow/lab_studies.py).
PYTEST_PARALLEL ?= -n auto --maxprocesses 2 --dist loadgroup
# The harness and workflow suites run one worker more (3; 2 on a 1-core
# machine): much of their tests' time is waiting (the SLURM lab's jobs seen
# ending, Snakemake on its jobs, a stalled rank's watchdog, a rendezvous),
# cores a third worker fills (bench/README.md, "A third worker"). Not the
# torch suite: its workers hold cores of their own
# (tests/run_processes.pin_this_xdist_worker), which a third would share.
PYTEST_PARALLEL_WAITING ?= -n $(shell n=$$(nproc); echo $$(( n < 2 ? 2 : 3 ))) --dist loadgroup
# The tests marked `alone` compare timings across runs: they run last, with
# no other test beside them (pyproject.toml's markers).
test: train-env torch-env lightning1-env analysis-env slurm-packages docs-browser image
	$(TRAIN_VENV)/bin/python -m pytest $(PYTEST_PARALLEL_WAITING) tests/harness tests/examples
	TRAINSCALE_TF_PYTHON=$(TRAIN_VENV)/bin/python $(TORCH_VENV)/bin/python -m pytest $(PYTEST_PARALLEL) tests/torch tests/examples
	$(LIGHTNING1_VENV)/bin/python -m pytest $(PYTEST_PARALLEL) tests/lightning1
	$(VENV)/bin/python -m pytest $(PYTEST_PARALLEL_WAITING) -m "not alone" tests/workflow
	$(VENV)/bin/python -m pytest -m alone tests/workflow

test-slurm: train-env torch-env analysis-env slurm-packages
	$(VENV)/bin/python -m pytest -m slurm tests/workflow

# The harness on the older stack, one tiny real run per framework (tests/compat).
test-compat: system
	@test -x "$(COMPAT_PYTHON)" || { echo "make test-compat: no Python 3.8 found; give COMPAT_PYTHON=/path/to/python3.8"; exit 2; }
	PYTHON=$(COMPAT_PYTHON) TENSORFLOW_VERSION=$(COMPAT_TENSORFLOW) NUMPY_REQUIREMENT="numpy<1.24" \
		bash tools/install-train-env.sh $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/python -m pytest -p no:cacheprovider tests/compat

# The inner loop: every test not marked `slow`, none of which trains a model
# (tests/conftest.py refuses a training run to such a test).
test-fast: train-env torch-env analysis-env
	$(TRAIN_VENV)/bin/python -m pytest $(PYTEST_PARALLEL) -m "not slow" tests/harness tests/examples
	TRAINSCALE_TF_PYTHON=$(TRAIN_VENV)/bin/python $(TORCH_VENV)/bin/python -m pytest $(PYTEST_PARALLEL) -m "not slow" tests/torch tests/examples
	$(VENV)/bin/python -m pytest $(PYTEST_PARALLEL) -m "not slow" tests/workflow

lint: train-env analysis-env
	$(TRAIN_VENV)/bin/ruff check src tests tools bench examples workflow/scripts
	$(TRAIN_VENV)/bin/ruff format --check src tests tools bench examples workflow/scripts
	$(TRAIN_VENV)/bin/vermin --no-tips --backport dataclasses --target=3.8- --violations $(HARNESS_MODULES)
	$(VENV)/bin/snakefmt --check Snakefile workflow
	$(VENV)/bin/snakemake --lint

format: train-env analysis-env
	$(TRAIN_VENV)/bin/ruff format src tests tools bench examples workflow/scripts
	$(TRAIN_VENV)/bin/ruff check --fix src tests tools bench workflow/scripts
	$(VENV)/bin/snakefmt Snakefile workflow

clean:
	rm -rf $(DEMO_DIR) .pytest_cache .ruff_cache
