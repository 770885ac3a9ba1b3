#!/usr/bin/env bash
# Source it: `cached_install NAME KEY BUILD...` installs NAME from a wheel built
# once per machine and reused while nothing that went into it changed.
#
# Compiling Horovod against TensorFlow or torch, or DeepSpeed's ops, takes
# minutes on two cores. A wheel built here is kept under $TRAINSCALE_WHEEL_CACHE
# (default ~/.cache/trainscale/wheels), in a folder named by a hash of KEY:
# the caller puts into KEY every version and flag that goes into the build (the
# package's version, Python's, the framework's it compiles against, the
# compiler's, the build's environment variables, the build script itself), so a
# changed input builds anew instead of reusing a wheel of another ABI. pip's own
# wheel cache knows none of that, so every build here runs with --no-cache-dir.
#
# BUILD is a command run with one more argument, the empty folder the wheel
# must be written to (e.g. pip wheel --no-deps -w).
wheel_cache=${TRAINSCALE_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/trainscale/wheels}

cached_install() {
  local name=$1 key=$2
  shift 2
  local digest folder built
  digest=$(printf '%s' "$key" | sha256sum | cut -c1-16)
  folder="$wheel_cache/$name-$digest"
  if ! compgen -G "$folder/*.whl" >/dev/null; then
    echo "$name: building a wheel (cached as $folder)"
    mkdir -p "$wheel_cache"
    built=$(mktemp -d "$wheel_cache/.building-$name.XXXXXX")
    "$@" "$built"
    compgen -G "$built/*.whl" >/dev/null || { echo "$name: the build wrote no wheel" >&2; exit 1; }
    printf '%s\n' "$key" > "$built/KEY"
    # One rename: another build running beside this one never sees half a folder.
    mv -T "$built" "$folder" 2>/dev/null || rm -rf "$built"
  else
    echo "$name: reusing the wheel built for the same inputs ($folder)"
  fi
  "${pip[@]}" install --no-deps --force-reinstall "$folder"/*.whl
}

# What every compiled build's key starts with: this machine's compiler and CPU.
build_host_key() {
  printf 'machine=%s\ncompiler=%s\n' "$(uname -m)" "$( (c++ --version || true) | head -1)"
}
