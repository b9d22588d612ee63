#!/usr/bin/env bash
# scripts/deps.sh - installs the Debian packages xpyd needs, only those missing, and the npm packages the
# tests use (gpt-tokenizer: the real BPE vocabularies xpyd_bench's prompts are checked against; openai: the Node SDK
# the TLS test streams with). Idempotent.
# Usage: scripts/deps.sh [extra-package ...]
set -euo pipefail
NPM_DIR=${XPYD_NPM_DIR:-$HOME/.cache/xpyd-npm}
npm_deps() {
  [ -f "$NPM_DIR/node_modules/gpt-tokenizer/package.json" ] && [ -f "$NPM_DIR/node_modules/openai/package.json" ] && return 0
  if ! command -v npm >/dev/null; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get install -y --no-install-recommends nodejs npm >>/tmp/xpyd-apt.log 2>&1 || {
      $SUDO apt-get update >>/tmp/xpyd-apt.log 2>&1
      $SUDO apt-get install -y --no-install-recommends nodejs npm >>/tmp/xpyd-apt.log 2>&1; } || {
      tail -30 /tmp/xpyd-apt.log >&2; exit 1; }
  fi
  echo "deps: installing gpt-tokenizer and openai into $NPM_DIR" >&2
  mkdir -p "$NPM_DIR"
  for try in 1 2 3; do
    npm install --silent --no-audit --no-fund --prefix "$NPM_DIR" gpt-tokenizer@2.9.0 openai@4.95.0 >/tmp/xpyd-npm.log 2>&1 && return 0
    sleep $((try * 5))
  done
  tail -20 /tmp/xpyd-npm.log >&2; exit 1
}
[ "${XPYD_TEST_DEPS:-0}" = 1 ] && trap npm_deps EXIT # only the tests need it (scripts/test.sh)

PKGS=(gcc make cmake pkg-config ca-certificates curl python3 procps prometheus clang libclang-rt-14-dev
      libevent-dev libevhtp-dev libhttp-parser-dev libcjson-dev libibverbs-dev libjemalloc-dev libcmocka-dev
      libxxhash-dev libssl-dev openssl etcd-server
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
