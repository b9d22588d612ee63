#!/usr/bin/env bash
# scripts/test.sh - installs what is missing, builds with -Werror, runs every test through ctest; then builds
# again with AddressSanitizer+UndefinedBehaviorSanitizer (leak checks on) and runs every test under it.
# Exit status is the result. XPYD_SANITIZE=0 skips the sanitizer pass; XPYD_SANITIZE=only runs just it.
set -euo pipefail
cd "$(dirname "$0")/.."
XPYD_TEST_DEPS=1 ./scripts/deps.sh
run_suite() { # build-dir sanitize(ON|OFF)
  XPYD_BUILD_DIR=$1 XPYD_ASSERTS=ON ./scripts/build.sh -DXPYD_WERROR=ON -DXPYD_SANITIZE=$2
  echo "== ctest in $1 (sanitizers $2)"
  (cd "$1" && ctest --output-on-failure --timeout 300 -j"${XPYD_TEST_JOBS:-2}")
}
SAN=${XPYD_SANITIZE:-1}
[ "$SAN" = only ] || run_suite "${XPYD_BUILD_DIR:-build}" OFF
if [ "$SAN" != 0 ]; then
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
  run_suite build-asan ON
fi
