#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/chaos.sh - a larger chaos round than CI's (tests/blackbox/chaos.py explains the faults and how each
# request is classified): decodes killed and restarted under load, injected 500s, streams cut mid-way, raw
# engines answering garbage / resetting / dripping / stalling, clients hanging up at random. Prints one
# JSON report: sent, completed, failed (with a clear error), hung_up (by the client), lost (must be 0), and
# the router's state afterwards (gauges at zero, no KV lease held, exit 0 on SIGTERM).
#   bench/chaos.sh [requests=4000] [max_seconds=600] [xpyd_router flags ...]   (e.g. --migration-limit 0)
#   bench/chaos.sh N SECS --compare R [flags ...]: R rounds of migration and prefill fallback on (the flags as
#   given) vs off, alternated, with the decode killed at the same four request counts in every round (one
#   JSON line per round). --profile deaths keeps only the faults migration and fallback answer (see chaos.py).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-4000} SECS=${2:-600}
[ "${XPYD_SKIP_BUILD:-0}" = 1 ] || { ./scripts/deps.sh; ./scripts/build.sh >/dev/null; }
export XPYD_BIN=$(pwd)/${XPYD_BUILD_DIR:-build}/bin
cd tests/blackbox
python3 chaos.py "$N" "$SECS" "${@:3}"
