#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/build.sh - configure and build into ./build (or $XPYD_BUILD_DIR). Extra args go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${XPYD_BUILD_DIR:-build}
# a tree configured afresh uses Ninja where it is (scripts/deps.sh installs it for the tests: a full build a quarter
# less CPU than make's); one configured before keeps its generator
G=()
[ -f "$BUILD_DIR/CMakeCache.txt" ] || ! command -v ninja >/dev/null || G=(-GNinja)
cmake -S . -B "$BUILD_DIR" ${G[@]+"${G[@]}"} -DCMAKE_BUILD_TYPE=${XPYD_BUILD_TYPE:-RelWithDebInfo} \
  -DXPYD_ASSERTS=${XPYD_ASSERTS:-OFF} "$@" >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"
