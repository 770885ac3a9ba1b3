#!/usr/bin/env bash
# The GPU check (bench/gpu/README.md): every cell of bench/gpu_check.py on
# this machine's GPU, torch only, from the checkout (PYTHONPATH=src), with
# the pure-Python wheels that travel in .whl/ (tools/gpu-check-wheels.sh:
# DeepSpeed and what it needs that the GPU machine lacks).
#
#   bash bench/gpu_check.sh [OUT]     results in OUT (default $OUT, else bench/gpu/)
#
# A run skips the cells that bench/gpu/gpu_check-<device>.json (one file per
# device: h100, h200) already holds for the same device: copy a run's file
# there, and the next run goes on from it.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-bench/gpu}}
python=${PYTHON:-python3}
if compgen -G ".whl/*.whl" > /dev/null; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/trainscale-gpu-site .whl/*.whl
  export PYTHONPATH=/tmp/trainscale-gpu-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
resume=()
if [ "$out" != bench/gpu ] && compgen -G "bench/gpu/gpu_check-*.json" > /dev/null; then
  resume=(--resume bench/gpu/gpu_check-*.json)
fi
exec "$python" bench/gpu_check.py --out "$out" "${resume[@]}" "${@:2}"
