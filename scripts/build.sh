#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/build.sh - configure and build into ./build (or $XPYD_BUILD_DIR). Extra args go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${XPYD_BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=${XPYD_BUILD_TYPE:-RelWithDebInfo} \
  -DXPYD_ASSERTS=${XPYD_ASSERTS:-OFF} "$@" >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"
