#!/usr/bin/env bash
# Builds the workflow and analysis environment (.venv): Snakemake 9 with the
# SLURM executor plugin, pandas, matplotlib, seaborn, MkDocs (the docs site),
# and trainscale's TensorFlow-free modules. Kept apart from .venv-train on purpose: TensorFlow
# 2.15.1 pins wrapt<1.15 and Snakemake 9 needs wrapt>=1.15.
# Idempotent: pip only changes what is missing.
set -euo pipefail

venv=${1:-.venv}
python=${PYTHON:-python3.11}

if [ ! -x "$venv/bin/python" ]; then
  echo "analysis env: creating $venv with $python"
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip
"${pip[@]}" install -e ".[analysis,test,docs]"
"$venv/bin/snakemake" --version | sed 's/^/analysis env: snakemake /'
