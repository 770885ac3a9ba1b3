#!/usr/bin/env bash
# The wheels the GPU check (bench/gpu/README.md) carries to a GPU machine that
# has torch but nothing outside it: DeepSpeed 0.19.8, built here with no op
# compiled (pure Python; its GPU ops would compile at run time, and the
# deepspeed framework uses none), PyTorch Lightning, and the packages they
# need that the machine may lack, at the versions .venv-torch runs them with. Into .whl/
# (git-ignored), a few MiB: the device tool carries up to 64 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.whl
python=${TORCH_VENV:-.venv-torch}/bin/python
rm -rf "$out" && mkdir -p "$out"
DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=0 "$python" -m pip wheel -q --no-build-isolation --no-deps \
  --no-cache-dir deepspeed==0.19.8 -w "$out"
version() { "$python" -c "import importlib.metadata as m; print(m.version('$1'))"; }
pins=()
# And PyTorch Lightning (the lightning cell) with what it imports beside torch.
for name in hjson pydantic pydantic-core annotated-types typing-inspection \
  pytorch-lightning lightning-utilities torchmetrics tqdm pyyaml; do
  pins+=("$name==$(version "$name")")
done
# The GPU machine's Python: 3.12 on x86-64 (pydantic-core is compiled).
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$out" "${pins[@]}"
ls -l "$out"
du -sh "$out"
