#!/usr/bin/env bash
# Docker as a third container runtime (the `container` axis): Debian's
# docker.io (20.10), its daemon started if none answers, and `make image`'s
# image loaded into it from Podman's store (podman save | docker load: the
# same image ID). Not part of `make test`: loading the 2.7 GB image takes
# minutes, so tests/torch/test_containers.py runs its Docker case where this
# has been run. Needs root.
set -euo pipefail
bash "$(dirname "$0")/apt-install.sh" "docker" docker.io
docker=/usr/bin/docker  # Debian's client, whatever else is first on PATH
if ! "$docker" info > /dev/null 2>&1; then
  echo "docker: starting dockerd (log: /var/log/trainscale-dockerd.log)"
  nohup dockerd > /var/log/trainscale-dockerd.log 2>&1 &
  for _ in $(seq 60); do "$docker" info > /dev/null 2>&1 && break; sleep 1; done
  "$docker" info > /dev/null
fi
image=localhost/trainscale:latest
wanted=$(podman image inspect --format '{{.Id}}' "$image")
have=$("$docker" image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
if [ "$have" != "sha256:$wanted" ]; then
  echo "docker: loading $image from Podman's store"
  podman save "$image" | "$docker" load
fi
echo "docker: $("$docker" --version), image $image"
