#!/usr/bin/env bash
# Seed 003's Pytorch_lightning_* rows ran Lightning's strategy="horovod",
# which Lightning 2.0 removed. Does pytorch-lightning 1.9.5 (its last release
# with it) run with .venv-torch's torch and Horovod? A throwaway environment:
# Lightning 1.9.5 and the setuptools it imports pkg_resources from, in a
# folder put first on PYTHONPATH of .venv-torch's Python (nothing of
# .venv-torch changes), then 3 steps of a tiny model under horovodrun -np 2.
#
#   bash bench/lightning1/try.sh     # from the checkout, after make torch-env
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${TORCH_VENV:-.venv-torch}
overlay=$(mktemp -d)
trap 'rm -rf "$overlay"' EXIT
"$venv/bin/python" -m pip install -q --no-deps --target "$overlay" \
  "pytorch-lightning==1.9.5" "setuptools<70"
"$venv/bin/horovodrun" -np 2 --gloo env PYTHONPATH="$overlay" \
  "$venv/bin/python" bench/lightning1/pl_horovod.py
