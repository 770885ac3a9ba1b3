#!/usr/bin/env bash
# Builds the training environment (.venv-train): TensorFlow 2.15.1 (CPU wheel),
# Horovod 0.28.1 compiled against that TensorFlow, and the trainscale harness.
# TENSORFLOW_VERSION and NUMPY_REQUIREMENT build another one instead (make
# test-compat: TensorFlow 2.11.0 on Python 3.8, as NVIDIA's 23.03 image has).
#
# Idempotent: each step is skipped when the venv already has what it installs,
# so rerunning costs seconds. The Horovod build (about 3 minutes on 2 cores)
# must come AFTER TensorFlow and without build isolation, because Horovod
# compiles its TensorFlow ops against the TensorFlow headers in this venv.
set -euo pipefail

venv=${1:-.venv-train}
python=${PYTHON:-python3.11}
tensorflow_version=${TENSORFLOW_VERSION:-2.15.1}
tensorflow_requirement=${TENSORFLOW_REQUIREMENT:-tensorflow-cpu==$tensorflow_version}
tensorflow_distribution=tensorflow-cpu
# GPU=1 (make setup GPU=1): the GPU build, envs/train-gpu.yaml's pins (the
# conda GPU environment's too): TensorFlow with CUDA, Horovod with NCCL.
gpu_pins=()
if [ "${GPU:-0}" = 1 ]; then
  mapfile -t gpu_pins < <(python3 "$(dirname "$0")/environment-pins.py" envs/train-gpu.yaml)
  tensorflow_distribution=tensorflow
  export HOROVOD_GPU_OPERATIONS=${HOROVOD_GPU_OPERATIONS:-NCCL}
fi
# Keras 2.x ships beside TensorFlow 2.x of the same minor version.
keras_requirement="keras==${tensorflow_version%.*}.*"
numpy_requirement=${NUMPY_REQUIREMENT:-numpy<2}
horovod_version=0.28.1

if [ ! -x "$venv/bin/python" ]; then
  echo "train env: creating $venv with $python"
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)

"${pip[@]}" install --upgrade pip "setuptools<70" wheel

if ! "$venv/bin/python" -c "
import importlib.metadata as installed, keras, sys
sys.exit(not (installed.version('$tensorflow_distribution') == '$tensorflow_version' and keras.__version__.startswith('${tensorflow_version%.*}')))" 2>/dev/null; then
  if [ ${#gpu_pins[@]} -gt 0 ]; then
    echo "train env: installing ${gpu_pins[*]}"
    "${pip[@]}" install "${gpu_pins[@]}"
  else
    echo "train env: installing $tensorflow_requirement"
    "${pip[@]}" install "$tensorflow_requirement" "$keras_requirement" "$numpy_requirement"
  fi
fi

if ! "$venv/bin/python" -c "
import sys, horovod, horovod.tensorflow as hvd
sys.exit(not (horovod.__version__ == '$horovod_version' and hvd.mpi_built() and hvd.gloo_built()))
" 2>/dev/null; then
  echo "train env: horovod==$horovod_version, compiled against this TensorFlow"
  source "$(dirname "$0")/wheel-cache.sh"
  export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
    HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
  key="horovod==$horovod_version
$(build_host_key)
python=$("$venv/bin/python" -c 'import sys; print(sys.version)')
tensorflow=$("$venv/bin/python" -c 'import os, tensorflow as tf; print(tf.__version__, [f.replace(os.path.dirname(tf.__file__), "TENSORFLOW") for f in tf.sysconfig.get_compile_flags()])' 2>/dev/null)
mpi=$( (mpirun --version || true) 2>&1 | head -1)
flags=$(env | grep '^HOROVOD_' | sort | tr '\n' ' ')
script=$(sha256sum "$0" | cut -c1-16)"
  # Horovod compiles its TensorFlow ops against the TensorFlow installed
  # above: no build isolation. TensorFlow's compile flags name its headers'
  # folder inside this venv: the key holds them relative to it, so a second
  # clone of the same commit reuses the wheel instead of building for minutes.
  MAKEFLAGS=${MAKEFLAGS:--j2} cached_install horovod-tensorflow "$key" \
    "${pip[@]}" wheel --no-build-isolation --no-deps --no-cache-dir "horovod==$horovod_version" -w
  "${pip[@]}" install cloudpickle psutil pyyaml packaging
fi

# The harness itself, editable, with its test tools. --no-deps keeps pip from
# touching the pinned TensorFlow stack above.
"${pip[@]}" install --no-deps -e .
# NVIDIA's NVML bindings (pure Python): GPU utilisation and memory while a
# GPU run trains (trainscale.core.gpu_monitor); a CPU run never loads them.
"${pip[@]}" install "nvidia-ml-py==13.615.71"
# Pillow: the real JPEG bytes of generated ImageNet files (trainscale.core.imagenet).
# 11 needs Python 3.9; the compat environment's 3.8 gets 10.4, its last.
"${pip[@]}" install "pillow==11.3.0; python_version >= '3.9'" "pillow==10.4.0; python_version < '3.9'"
"${pip[@]}" install "pytest>=8,<9" "pytest-timeout>=2.3" "pytest-xdist>=3.6,<4" "ruff==0.8.*" "vermin==1.9.*"
TF_CPP_MIN_LOG_LEVEL=2 "$venv/bin/python" -c "import tensorflow as tf, horovod; print('train env: tensorflow', tf.__version__, '| horovod', horovod.__version__)"
