#!/usr/bin/env bash
# scripts/deps.sh - installs the Debian packages xpyd needs, only those missing. Idempotent.
# Usage: scripts/deps.sh [extra-package ...]
set -euo pipefail

PKGS=(gcc make cmake pkg-config ca-certificates curl python3 procps prometheus clang libclang-rt-14-dev
      libevent-dev libevhtp-dev libhttp-parser-dev libcjson-dev libibverbs-dev libjemalloc-dev libcmocka-dev
      help2man man-db dpkg-dev adduser gnuplot-nox
      "$@")

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# Only refresh the package lists when an install without it fails (keeps reruns fast).
if ! $SUDO apt-get install -y --no-install-recommends "${missing[@]}" >/tmp/xpyd-apt.log 2>&1; then
  $SUDO apt-get update >>/tmp/xpyd-apt.log 2>&1
  $SUDO apt-get install -y --no-install-recommends "${missing[@]}" >>/tmp/xpyd-apt.log 2>&1 || {
    tail -30 /tmp/xpyd-apt.log >&2; exit 1; }
fi
