#!/usr/bin/env bash
# Builds Horovod (version $1, default 0.28.1) from source with its torch
# extension for the Python environment whose pip is $PIP (default: pip), for
# the torch frameworks: installs it, or with a folder as $2 writes its wheel
# there (tools/install-torch-env.sh caches it: tools/wheel-cache.sh). Used by
# tools/install-torch-env.sh (.venv-torch) and envs/torch.post-deploy.sh
# (conda). torch must be installed first: the extension compiles against its
# headers, so no build isolation.
set -euo pipefail
horovod_version=${1:-0.28.1}
wheel_dir=${2:-}
read -r -a pip <<< "${PIP:-pip}"
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
"${pip[@]}" download --no-deps --no-binary :all: -d "$build" "horovod==$horovod_version"
tar -xzf "$build/horovod-$horovod_version.tar.gz" -C "$build"
source_dir="$build/horovod-$horovod_version"
# Horovod 0.28.1 compiles its torch extension as C++14, but torch >= 2.1's
# headers need C++17 (horovod issues #3996, #4014; fixed upstream after the
# release). The fix: build as C++17, and not only that extension: it links
# Horovod's Gloo, whose store.cc defines Store::kDefaultTimeout out of line
# as C++14 needs, while a C++17 object holds the same constant inline, so
# the link fails ("multiple definition of
# gloo::rendezvous::Store::kDefaultTimeout"). Built all as C++17, both are
# the inline constant. This env builds no TensorFlow ops, so nothing else
# depends on the older standard. The checks make a changed source fail
# here, loudly, instead of mid-compile.
for cmake_file in CMakeLists.txt horovod/torch/CMakeLists.txt; do
  grep -q 'set(CMAKE_CXX_STANDARD 14)' "$source_dir/$cmake_file" ||
    { echo "torch env: horovod's $cmake_file no longer sets C++14; revisit this fix" >&2; exit 1; }
  sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$source_dir/$cmake_file"
done
export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
  HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=${MAKEFLAGS:--j2}
if [ -n "$wheel_dir" ]; then
  "${pip[@]}" wheel --no-build-isolation --no-deps --no-cache-dir -w "$wheel_dir" "$source_dir"
else
  "${pip[@]}" install --no-build-isolation --no-deps "$source_dir"
  "${pip[@]}" install cloudpickle psutil pyyaml packaging
fi
