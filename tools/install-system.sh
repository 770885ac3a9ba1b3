#!/usr/bin/env bash
# Installs the Debian packages trainscale needs. Idempotent: apt runs only when
# a package is missing, so `make test` on a prepared machine costs nothing here.
set -euo pipefail

packages=(
  # Horovod is built against Open MPI; mpirun launches local Horovod runs.
  libopenmpi-dev openmpi-bin
  # cmake and a C++ compiler build Horovod from source.
  cmake g++ make git
  # `dot` renders `snakemake --dag` / `--rulegraph`.
  graphviz
)

missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "system packages: all present"
  exit 0
fi

echo "system packages: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
