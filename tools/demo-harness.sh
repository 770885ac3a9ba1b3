#!/usr/bin/env bash
# The harness demo: every framework of the registry trains tiny VGG-16 (32x32)
# on 2 CPU replicas (the single-device baselines on 1) from a generated archive
# in the real cifar-100-python format, each from the environment its registry
# entry names, and prints its record's total images/sec.
set -euo pipefail
train_venv=${TRAIN_VENV:-.venv-train}
torch_venv=${TORCH_VENV:-.venv-torch}
lightning1_venv=${LIGHTNING1_VENV:-.venv-lightning1}
demo_dir=${DEMO_DIR:-results/demo-harness}
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}

mkdir -p "$demo_dir"
if [ ! -d "$demo_dir/data/cifar-100-python" ]; then
  "$train_venv/bin/python" -c "
from trainscale.core.datasets import generate_cifar100
print('demo data:', generate_cifar100('$demo_dir/data', num_images=2048, seed=0))"
fi

common=(--model vgg16 --image-size 32 --batch-size 32 --dataset cifar100
        --data-dir "$demo_dir/data" --device cpu
        --warmup-steps 2 --blocks 5 --steps-per-block 5)
# One line per framework: its name, replicas, and its environment's config key.
frameworks=$("$train_venv/bin/python" -c "
from trainscale.catalogue.registry import REGISTRY
for spec in REGISTRY:
    print(spec.name, 1 if spec.one_device else 2, spec.environment)")
while read -r framework replicas environment; do
  case "$environment" in
    train_env) venv=$train_venv ;;
    torch_env) venv=$torch_venv ;;
    lightning1_env) venv=$lightning1_venv ;;
    *) echo "demo: no environment for $environment (tools/demo-harness.sh)" >&2; exit 2 ;;
  esac
  "$venv/bin/trainscale" run --framework "$framework" --gpus-per-node "$replicas" \
    "${common[@]}" --output "$demo_dir/$framework.json" 2>"$demo_dir/$framework.log" </dev/null \
    || { echo "demo: $framework failed, see $demo_dir/$framework.log" >&2; exit 1; }
done <<< "$frameworks"
