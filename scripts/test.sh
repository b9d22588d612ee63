#!/usr/bin/env bash
# scripts/test.sh - installs what is missing, builds with -Werror, runs every test through ctest.
# Exit status is the test result. Set XPYD_SANITIZE=1 to build and run everything under ASan+UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
export XPYD_BUILD_DIR=${XPYD_BUILD_DIR:-build}
SAN=OFF
if [ "${XPYD_SANITIZE:-0}" = 1 ]; then SAN=ON; XPYD_BUILD_DIR=build-asan; fi
./scripts/build.sh -DXPYD_WERROR=ON -DXPYD_SANITIZE=$SAN
cd "$XPYD_BUILD_DIR"
ctest --output-on-failure --timeout 300 -j"${XPYD_TEST_JOBS:-2}"
