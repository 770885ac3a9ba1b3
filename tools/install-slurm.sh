#!/usr/bin/env bash
# Debian's SLURM, munge, MariaDB (for slurmdbd's accounting) and Open MPI with
# PMIx: what the SLURM lab (tests/slurm-lab/lab.sh) needs. Idempotent. apt does
# not start the services here (no systemd); the lab starts what it needs.
set -euo pipefail
packages=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server openmpi-bin libopenmpi-dev
          iproute2 util-linux)
missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "slurm packages: all present"
  exit 0
fi
echo "slurm packages: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
