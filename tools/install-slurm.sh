#!/usr/bin/env bash
# SLURM, munge, MariaDB (for slurmdbd's accounting), Open MPI with PMIx and the
# namespace tools: what the SLURM lab (tests/slurm-lab/lab.sh) needs. apt does
# not start the services here (no systemd); the lab starts what it needs.
set -euo pipefail
exec bash "$(dirname "$0")/apt-install.sh" "slurm packages" \
  slurmctld slurmd slurm-client slurmdbd munge mariadb-server \
  openmpi-bin libopenmpi-dev iproute2 util-linux
