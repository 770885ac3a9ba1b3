#!/usr/bin/env bash
# Snakemake runs this inside the new conda env (envs/torch.yaml) once, after
# creating it, from the workflow's working directory (the trainscale checkout).
set -euo pipefail
[ -f Snakefile ] && [ -d src/trainscale ] || { echo "run from the trainscale checkout" >&2; exit 1; }
PIP="pip --no-cache-dir" bash tools/build-horovod-torch.sh 0.28.1
# DeepSpeed from its sdist, no op compiled (its GPU ops compile at run time
# when used; the deepspeed framework uses torch's optimizers, none of them).
DS_BUILD_OPS=0 pip install --no-cache-dir --no-build-isolation deepspeed==0.19.8
pip install --no-deps .
