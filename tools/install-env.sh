#!/usr/bin/env bash
# make's environment targets: bash tools/install-NAME-env.sh VENV, unless VENV
# was last built by it from the same inputs (its stamp, VENV/.trainscale-stamp:
# the digest of the script, the FILEs it reads and the variables that change
# what it installs, then the line it last printed). make test-fast asks on
# every run; the scripts' own checks (pip's, and the imports that prove the
# environment) took half a minute of it. rm VENV/.trainscale-stamp makes the
# next run check everything again.
#     bash tools/install-env.sh NAME VENV [FILE...]
set -euo pipefail

name=$1 venv=$2
shift 2
script=$(dirname "$0")/install-$name-env.sh
stamp=$venv/.trainscale-stamp
digest=$(
  {
    cat "$script" "$@"
    env | grep -E '^(GPU|PYTHON|TENSORFLOW_|TORCH_|NUMPY_|HOROVOD_|DS_BUILD_|PIP_)' | sort
  } | sha256sum | cut -c1-32
)
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(head -1 "$stamp")" = "$digest" ]; then
  tail -n +2 "$stamp"
  exit 0
fi
rm -f "$stamp"
output=$(mktemp)
trap 'rm -f "$output"' EXIT
bash "$script" "$venv" | tee "$output"
printf '%s\n%s\n' "$digest" "$(tail -1 "$output")" > "$stamp"
