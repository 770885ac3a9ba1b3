#!/usr/bin/env bash
# The container runtimes the demo machine and the SLURM lab use (the
# `container` axis), from Debian's packages: Podman (Docker's model: a
# runtime that makes namespaces and cgroups) and Charliecloud's ch-run
# (Singularity's: unprivileged, no daemon, the host's network), and
# debootstrap, which makes the image's base. Apptainer itself is in neither
# Debian nor PyPI here. Needs root.
set -euo pipefail
# charliecloud-runtime alone: charliecloud-builders would bring Docker's daemon.
bash "$(dirname "$0")/apt-install.sh" "container runtimes" \
  podman runc uidmap slirp4netns fuse-overlayfs charliecloud-runtime debootstrap

# Podman 4.3's defaults fail on some hosts, this one among them; measured:
# - crun (its default OCI runtime): "cgroups in hybrid mode not supported,
#   drop all controllers from cgroupv2", even with --cgroups=disabled; runc
#   runs on cgroup v1 and hybrid hosts;
# - its default open-files limit (1048576) above the host's hard limit, which
#   root cannot raise without CAP_SYS_RESOURCE: "crun: setrlimit
#   RLIMIT_NOFILE: Operation not permitted". A container gets the host's;
# - the same for processes (runc: "error setting rlimit type 6: operation not
#   permitted") at the host's hard limit (96364 here) and at 65536; 32768,
#   the kernel's pid_max here, passes. So: the smaller of the two.
nproc=$(ulimit -Hu)
pid_max=$(cat /proc/sys/kernel/pid_max)
[ "$nproc" = unlimited ] || [ "$nproc" -gt "$pid_max" ] && nproc=$pid_max
conf=/etc/containers/containers.conf.d/50-trainscale.conf
mkdir -p "$(dirname "$conf")"
cat > "$conf.new" <<CONF
# Written by trainscale's tools/install-containers.sh (see it for why).
[containers]
default_ulimits = ["nofile=$(ulimit -Hn):$(ulimit -Hn)", "nproc=$nproc:$nproc"]

[engine]
runtime = "runc"
CONF
mv "$conf.new" "$conf"
echo "container runtimes: $(podman --version), $(USER=${USER:-root} ch-run --version 2>&1) (ch-run)"
