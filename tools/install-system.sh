#!/usr/bin/env bash
# The Debian packages trainscale needs to build and run (see apt-install.sh).
set -euo pipefail
exec bash "$(dirname "$0")/apt-install.sh" "system packages" \
  libopenmpi-dev openmpi-bin `# Horovod is built against Open MPI; mpirun launches local runs` \
  cmake g++ make git `# build Horovod from source` \
  graphviz `# dot renders snakemake --dag / --rulegraph`
