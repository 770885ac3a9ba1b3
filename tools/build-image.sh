#!/usr/bin/env bash
# make image: the trainscale image (envs/Containerfile), for Podman and, as a
# directory, for Charliecloud's ch-run. Run from the checkout, as root.
#
# Built once per machine and reused while nothing that went into it changed,
# like the Horovod wheels (tools/wheel-cache.sh): its key hashes the recipe,
# every install script it runs, the package metadata, the base's suite and
# mirror and the environments it holds. Compiling Horovod inside it takes
# minutes; the wheels it builds are cached on the host, under the same cache.
#
# Names it leaves (studies and tests name the stable ones):
#   localhost/trainscale:KEY and localhost/trainscale:latest   (Podman)
#   $TRAINSCALE_IMAGE_DIR/trainscale-KEY, and .../trainscale linking to it (ch-run)
set -euo pipefail
cd "$(dirname "$0")/.."

environments=${IMAGE_ENVIRONMENTS:-torch}
suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
image_dir=${TRAINSCALE_IMAGE_DIR:-/var/tmp/trainscale-images}
wheel_cache=${TRAINSCALE_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/trainscale/wheels}

base_key=$(printf 'debootstrap --variant=minbase %s %s\n' "$suite" "$mirror" | sha256sum | cut -c1-12)
base=localhost/trainscale-base:$suite-$base_key
key=$( (printf '%s\n' "$environments" "$base"
  cat envs/Containerfile .containerignore tools/build-image.sh tools/apt-install.sh \
    tools/install-torch-env.sh tools/install-train-env.sh tools/build-horovod-torch.sh \
    tools/wheel-cache.sh tools/pip-sources.py pyproject.toml) | sha256sum | cut -c1-16)
tag=localhost/trainscale:$key
directory=$image_dir/trainscale-$key

if ! podman image exists "$base"; then
  echo "image: the base, Debian $suite minbase from $mirror (debootstrap)"
  root=$(mktemp -d /var/tmp/trainscale-base.XXXXXX)
  trap 'rm -rf "$root"' EXIT
  debootstrap --variant=minbase "$suite" "$root" "$mirror" > "$root.log" 2>&1 ||
    { tail -20 "$root.log" >&2; exit 1; }
  tar -C "$root" -c . | podman import - "$base"
  rm -rf "$root" "$root.log"
fi

if podman image exists "$tag"; then
  echo "image: reusing $tag (built from the same inputs)"
else
  echo "image: building $tag ($environments; minutes: Horovod compiles inside)"
  mkdir -p "$wheel_cache"
  # The build's network is the host's, and so is pip's set-up (its
  # configuration files, the CA bundle of a TLS proxy, a site's wheels and
  # index mirrors: tools/pip-sources.py): its RUN steps install what a bare
  # install here would, from where it would.
  read -r -a pip_mounts <<< "$(python3 tools/pip-sources.py | tr '\n' ' ')"
  podman build --network=host -f envs/Containerfile \
    --build-arg BASE="$base" --build-arg ENVIRONMENTS="$environments" \
    --build-arg RECIPE_DIGEST="$key" "${pip_mounts[@]}" \
    -v "$wheel_cache:/root/.cache/trainscale/wheels" -t "$tag" .
fi
podman tag "$tag" localhost/trainscale:latest

if [ ! -f "$directory/etc/trainscale-image.json" ]; then
  echo "image: unpacking $tag into $directory (ch-run's image)"
  mkdir -p "$image_dir"
  unpacked=$(mktemp -d "$image_dir/.unpacking.XXXXXX")
  container=$(podman create "$tag" /bin/true)
  podman export "$container" | tar -x -C "$unpacked"
  podman rm "$container" > /dev/null
  # One rename: a run never sees half an image.
  mv -T "$unpacked" "$directory"
fi
ln -sfn "trainscale-$key" "$image_dir/trainscale"
# Images of earlier recipes go (2-3 GB each): only the newest is named by a study.
for old in "$image_dir"/trainscale-*; do
  [ "$old" = "$directory" ] || rm -rf "$old"
done
podman images --format '{{.Repository}}:{{.Tag}}' | grep '^localhost/trainscale:' |
  grep -v -e ":$key\$" -e ':latest$' | xargs -r podman rmi > /dev/null || true
# ch-run binds a host folder only where the image has a folder to bind it on:
# this checkout's path, the runs' working directory (it shares the host's /tmp
# unless told --private-tmp); and SLURM's default spool, where srun
# --mpi=pmix's PMIx server has its directory (tests/slurm-lab/containers.yaml).
mkdir -p "$directory$PWD" "$directory/var/spool/slurmd"
echo "image: $tag and $directory ($(podman image inspect --format '{{.Id}}' "$tag" | cut -c1-19))"
