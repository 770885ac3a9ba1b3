#!/usr/bin/env bash
# Snakemake runs this inside the new conda env (envs/train.yaml) once, after
# creating it, from the workflow's working directory (the trainscale checkout).
# Horovod is built here because it must be compiled against the TensorFlow the
# env already holds; pip cannot do that from the env file in one resolve.
set -euo pipefail
HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
  pip install --no-build-isolation --no-cache-dir horovod==0.28.1
[ -f Snakefile ] && [ -d src/trainscale ] || { echo "run from the trainscale checkout" >&2; exit 1; }
pip install --no-deps .
