#!/usr/bin/env bash
# Builds the PyTorch training environment (.venv-torch): torch (CPU wheel by
# default), Horovod 0.28.1 compiled against it with its torch extension, and
# the trainscale harness. The torch frameworks (trainscale.catalogue.registry) run from it.
#
# Kept apart from .venv-train because torch and TensorFlow 2.15 pin different
# things, and a Horovod build holds one framework's ABI.
#
# torch is pinned exactly: an unpinned `torch` pulls gigabytes of CUDA wheels.
# GPU=1 (make setup GPU=1): the GPU build, envs/torch-gpu.yaml's pins (the
# conda GPU environment's too): PyPI's CUDA build of the same torch, and
# Horovod with NCCL operations. Another CUDA's build of it:
# TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 (the cluster's CUDA).
#
# Idempotent, like install-train-env.sh: each step is skipped when done.
set -euo pipefail

venv=${1:-.venv-torch}
python=${PYTHON:-python3.11}
torch_requirement=${TORCH_REQUIREMENT:-torch==2.13.0}
numpy_requirement=${NUMPY_REQUIREMENT:-numpy<2}
horovod_version=0.28.1
deepspeed_version=0.19.8
ray_version=2.60.0
lightning_version=2.6.6

if [ ! -x "$venv/bin/python" ]; then
  echo "torch env: creating $venv with $python"
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip "setuptools<70" wheel

gpu=${GPU:-0}
torch_pins=("$torch_requirement" "$numpy_requirement")
if [ "$gpu" = 1 ]; then
  mapfile -t torch_pins < <(python3 "$(dirname "$0")/environment-pins.py" envs/torch-gpu.yaml)
  export HOROVOD_GPU_OPERATIONS=${HOROVOD_GPU_OPERATIONS:-NCCL}
fi
torch_version=${torch_requirement#*==}
if ! "$venv/bin/python" -c "import torch, sys; sys.exit(not (torch.__version__.startswith('$torch_version') and (torch.version.cuda is not None) == bool($gpu)))" 2>/dev/null; then
  echo "torch env: installing ${torch_pins[*]}"
  index=()
  [ -n "${TORCH_INDEX_URL:-}" ] && index=(--index-url "$TORCH_INDEX_URL" --extra-index-url https://pypi.org/simple)
  if [ "$gpu" = 1 ]; then
    # From the index alone: a folder of local wheels (pip's find-links) may
    # hold the CPU build of the same version, which pip would prefer; an
    # empty folder in its place (an empty PIP_FIND_LINKS does not override).
    PIP_FIND_LINKS=$(mktemp -d) "${pip[@]}" install "${index[@]}" "${torch_pins[@]}"
  else
    "${pip[@]}" install "${index[@]}" "${torch_pins[@]}"
  fi
fi

source "$(dirname "$0")/wheel-cache.sh"
torch_key="$(build_host_key)
python=$("$venv/bin/python" -c 'import sys; print(sys.version)')
torch=$("$venv/bin/python" -c 'import torch; print(torch.__version__, torch.version.cuda, torch._C._GLIBCXX_USE_CXX11_ABI)')"

if ! "$venv/bin/python" -c "
import sys, horovod, horovod.torch as hvd
sys.exit(not (horovod.__version__ == '$horovod_version' and hvd.mpi_built() and hvd.gloo_built()))
" 2>/dev/null; then
  echo "torch env: horovod==$horovod_version with its torch extension"
  key="horovod==$horovod_version
$torch_key
mpi=$( (mpirun --version || true) 2>&1 | head -1)
gpu_operations=${HOROVOD_GPU_OPERATIONS:-}
script=$(cat "$0" tools/build-horovod-torch.sh | sha256sum | cut -c1-16)"
  cached_install horovod-torch "$key" \
    env PIP="${pip[*]} --no-cache-dir" bash tools/build-horovod-torch.sh "$horovod_version"
  "${pip[@]}" install cloudpickle psutil pyyaml packaging cffi
fi

# DeepSpeed, from its sdist. No op is compiled at install (DS_BUILD_OPS=0)
# but the one its CPU accelerator would otherwise compile when a run starts:
# the shared-memory all-reduce (DS_BUILD_SHM_COMM=1; inference only, loaded at
# every deepspeed.init_distributed). Its ops for GPUs compile at run time, as
# DeepSpeed's default is; the deepspeed framework uses none of them (its
# optimizer is torch's). Its dependencies are pure Python; torch is not touched.
if ! "$venv/bin/python" -c "import deepspeed, sys; sys.exit(deepspeed.__version__ != '$deepspeed_version')" 2>/dev/null; then
  echo "torch env: deepspeed==$deepspeed_version"
  shm_comm=$("$venv/bin/python" -c 'import torch; print(int(not torch.cuda.is_available()))')
  key="deepspeed==$deepspeed_version
$torch_key
DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=$shm_comm
script=$(sha256sum "$0" | cut -c1-16)"
  DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=$shm_comm cached_install deepspeed "$key" \
    "${pip[@]}" wheel --no-build-isolation --no-deps --no-cache-dir "deepspeed==$deepspeed_version" -w
  "${pip[@]}" install "deepspeed==$deepspeed_version"  # its pure-Python dependencies
fi

# Ray Train (ray-train), in this environment: its workers run torch-ddp's
# training function, so they need this torch. Its dependencies do not touch
# torch; pyarrow is held at 22 because pyarrow 23+ needs NumPy 2 and this
# environment keeps numpy<2 ("pyarrow requires NumPy 2.0 or newer, found 1.26.4").
if ! "$venv/bin/python" -c "import ray, sys; sys.exit(ray.__version__ != '$ray_version')" 2>/dev/null; then
  echo "torch env: ray[train]==$ray_version"
  "${pip[@]}" install "ray[train]==$ray_version" "pyarrow==22.0.0" "$numpy_requirement"
fi

# PyTorch Lightning (lightning-ddp), with torch's pins: a constraint its
# resolver cannot meet with this torch sends it back to another torch (with
# "setuptools<70", which torch 2.13.0's setuptools>=77.0.3 rules out, pip
# installed torch 2.12.1 and its CUDA wheels in its place).
if ! "$venv/bin/python" -c "import pytorch_lightning as pl, sys; sys.exit(pl.__version__ != '$lightning_version')" 2>/dev/null; then
  echo "torch env: pytorch-lightning==$lightning_version"
  "${pip[@]}" install "pytorch-lightning==$lightning_version" "${torch_pins[@]}"
fi

# The harness itself, editable, and its test tools (as in .venv-train).
"${pip[@]}" install --no-deps -e .
"${pip[@]}" install "nvidia-ml-py==13.615.71"  # trainscale.core.gpu_monitor, as in the train env
# Pillow decodes ImageNet's JPEGs (trainscale.core.imagenet), as torchvision's
# ImageFolder does. Not torchvision: PyPI's 0.28.0 is built against the CUDA
# torch, and with the CPU one its import fails ("RuntimeError: operator
# torchvision::nms does not exist"); its +cpu build is on download.pytorch.org only.
"${pip[@]}" install "pillow==11.3.0"
"${pip[@]}" install "pytest>=8,<9" "pytest-timeout>=2.3" "pytest-xdist>=3.6,<4"
"$venv/bin/python" -c "import torch, horovod.torch, deepspeed, ray, pytorch_lightning as pl; print('torch env: torch', torch.__version__, '| horovod', horovod.__version__, '| deepspeed', deepspeed.__version__, '| ray', ray.__version__, '| lightning', pl.__version__)" 2>&1 | tail -1
