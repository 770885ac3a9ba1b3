#!/usr/bin/env bash
# Snakemake runs this inside the new conda env (envs/lightning1.yaml) once,
# after creating it, from the workflow's working directory (the trainscale
# checkout): Horovod built against its torch (tools/build-horovod-torch.sh),
# then the harness.
set -euo pipefail
[ -f Snakefile ] && [ -d src/trainscale ] || { echo "run from the trainscale checkout" >&2; exit 1; }
PIP="pip --no-cache-dir" bash tools/build-horovod-torch.sh 0.28.1
pip install --no-deps .
