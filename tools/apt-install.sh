#!/usr/bin/env bash
# tools/apt-install.sh LABEL PACKAGE...: install the Debian packages not yet
# installed. Idempotent: apt runs only when one is missing, so a prepared
# machine pays nothing.
set -euo pipefail
label=$1
shift
missing=()
for pkg in "$@"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "$label: all present"
  exit 0
fi
echo "$label: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
