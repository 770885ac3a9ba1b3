#!/usr/bin/env bash
# One torch process beside a busy core, as a test beside the other xdist
# worker's: torch-single, small CNN at 16 px, batch 32, on the CPU, alone;
# then beside a core-bound loop pinned to CPU 0, with both cores' intra-op
# threads, with OMP_WAIT_POLICY=PASSIVE, and pinned to the free core (where
# trainscale.core.cpus reads the mask and takes one thread). bench/README.md.
#     bash bench/oversubscription.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
run() {
  local label=$1
  shift
  PYTHONPATH=src "$@" .venv-torch/bin/python -m trainscale run --framework torch-single \
    --model small_cnn --batch-size 32 --dataset synthetic --image-size 16 --device cpu \
    --warmup-steps 5 --blocks 5 --steps-per-block 20 --output "$out/o.json" > /dev/null 2>&1
  python3 -c "import json; r = json.load(open('$out/o.json'))['images_per_sec']
print('$label:', round(r['mean']), [round(x) for x in r['samples']])"
}
run "alone" env
taskset -c 0 python3 -c "
import time
start = time.time()
while time.time() - start < 300: pass" &
busy=$!
trap 'kill $busy 2>/dev/null; rm -rf "$out"' EXIT
for _ in 1 2; do
  run "beside a busy core, 2 intra-op threads" env
  run "beside it, OMP_WAIT_POLICY=PASSIVE" env OMP_WAIT_POLICY=PASSIVE
  run "beside it, pinned to the free core" taskset -c 1
done
