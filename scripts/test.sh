#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/test.sh - installs what is missing, builds with -Werror twice (plain, and ASan+UBSan with leak checks
# in build-asan/), and runs every test through one ctest invocation: the unit and black-box tests against both
# builds, the fuzz harnesses (corpus replay + a short budget each), the mutation suite (in shards) and the
# Debian package. Black-box tests wait on the binaries most of the time, so XPYD_TEST_JOBS (default 6) run at
# once on two cores; the long ones start first. Exit status is the result.
#   scripts/test.sh --quick      the inner loop: plain build, unit + black-box tests without the slow ones
#   scripts/test.sh -L fuzz      any ctest arguments select lanes (labels: unit blackbox fuzz mutation package
#                                slow asan; see docs/TESTING.md)
# XPYD_SANITIZE=0 skips the sanitized build (and its tests); XPYD_SANITIZE=only runs just its tests.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
quick=0
if [ "${1:-}" = --quick ]; then
  quick=1
  shift
fi
SAN=${XPYD_SANITIZE:-1}
[ $quick = 1 ] && SAN=0
XPYD_TEST_DEPS=1 ./scripts/deps.sh
BUILD=${XPYD_BUILD_DIR:-build}
ASAN_DIR=
if [ "$SAN" != 0 ]; then
  echo "== building the sanitized tree (build-asan)"
  XPYD_BUILD_DIR=build-asan XPYD_ASSERTS=ON ./scripts/build.sh -DXPYD_TESTS=ON -DXPYD_WERROR=ON \
    -DXPYD_SANITIZE=ON
  ASAN_DIR=$PWD/build-asan
fi
echo "== building $BUILD"
XPYD_BUILD_DIR=$BUILD XPYD_ASSERTS=ON ./scripts/build.sh -DXPYD_TESTS=ON -DXPYD_WERROR=ON -DXPYD_SANITIZE=OFF \
  -DXPYD_ASAN_DIR="$ASAN_DIR"
sel=()
[ $quick = 1 ] && sel=(-L 'unit|blackbox' -LE 'slow|asan')
[ "$SAN" = only ] && sel=(-L asan)
echo "== ctest in $BUILD${sel[*]:+ (${sel[*]})} after $(($(date +%s) - t0)) s"
rc=0
(cd "$BUILD" && ctest --output-on-failure --timeout 300 -j"${XPYD_TEST_JOBS:-6}" ${sel[@]+"${sel[@]}"} "$@") || rc=$?
echo "== scripts/test.sh: $([ $rc = 0 ] && echo passed || echo FAILED) in $(($(date +%s) - t0)) s"
exit $rc
