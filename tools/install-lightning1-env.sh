#!/usr/bin/env bash
# Builds .venv-lightning1, the environment of lightning-horovod: PyTorch
# Lightning 1.9.5, whose strategy="horovod" (seed 003's Pytorch_lightning_*
# rows) Lightning 2.0 removed, on top of .venv-torch's torch and Horovod.
# Those are reached through a .pth file (site.addsitedir), not installed
# again; this environment's own site-packages come first on sys.path, so its
# Lightning 1.9.5, and the setuptools<70 that Lightning 1.9 imports
# pkg_resources from, are found before .venv-torch's Lightning 2.6.6.
#     bash tools/install-lightning1-env.sh [VENV]    (make lightning1-env)
# Lightning 1.9.5's own requirements (lightning-utilities, torchmetrics,
# fsspec, ...) are Lightning 2.6.6's, already in .venv-torch: --no-deps.
set -euo pipefail

venv=${1:-.venv-lightning1}
torch_venv=${TORCH_VENV:-.venv-torch}
# Lightning's pin and setuptools', as the conda environment has them.
mapfile -t pins < <(python3 "$(dirname "$0")/environment-pins.py" envs/lightning1.yaml \
  | grep -E '^(pytorch-lightning|setuptools)')

if [ ! -x "$torch_venv/bin/python" ]; then
  echo "lightning1 env: no $torch_venv to build on (make torch-env first)" >&2
  exit 1
fi
if [ ! -x "$venv/bin/python" ]; then
  # The torch environment's own interpreter: its compiled packages load in it.
  base=$("$torch_venv/bin/python" -c 'import sys; print(sys._base_executable)')
  echo "lightning1 env: creating $venv with $base"
  "$base" -m venv "$venv"
fi
purelib='import sysconfig; print(sysconfig.get_paths()["purelib"])'
torch_site=$("$torch_venv/bin/python" -c "$purelib")
site=$("$venv/bin/python" -c "$purelib")
echo "import site; site.addsitedir('$torch_site')" > "$site/trainscale-torch-env.pth"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --no-deps "${pins[@]}"
"${pip[@]}" install --no-deps -e .
"$venv/bin/python" -c "
import horovod.torch, pytorch_lightning as pl, torch
print(f'lightning1 env: pytorch_lightning {pl.__version__}, torch {torch.__version__}, Horovod with torch')
"
