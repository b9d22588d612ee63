#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/sim_throughput.sh - how many streamed tokens/s one xpyd_sim process sustains on one core with zero
# delays (it must never be what limits a router benchmark). The sim is pinned to CPU 0 and xpyd_bench to
# CPU 1 with taskset, and the bench talks to the sim directly (no router).
#   bench/sim_throughput.sh [concurrency=64] [output_tokens=2000] [prompts=256]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
CONC=${1:-64} OUT=${2:-2000} N=${3:-256}
[ "${XPYD_SKIP_BUILD:-0}" = 1 ] || { ./scripts/deps.sh; ./scripts/build.sh >/dev/null; }
B=${XPYD_BUILD_DIR:-build}/bin
WORK=$(mktemp -d /tmp/xpyd-simbench.XXXXXX)
SIM=""
trap '[ -n "$SIM" ] && kill $SIM 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"' EXIT
taskset -c 0 $B/xpyd_sim --port 0 --port-file "$WORK/port" --prefill-us-per-token 0 --decode-us-per-token 0 \
  --max-batch 100000 --max-model-len 100000 --log-level warn &
SIM=$!
xpyd_wait_file "$WORK/port" 10
taskset -c 1 $B/xpyd_bench --port "$(cat "$WORK/port")" --num-prompts "$N" --max-concurrency "$CONC" \
  --random-input-len 16 --random-output-len "$OUT" --ignore-eos --disable-tqdm --save-result \
  --result-filename "$WORK/r.json" >"$WORK/out.txt"
python3 - "$WORK/r.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("sim_throughput: completed=%d failed=%d output_tokens=%d duration_s=%.2f streamed_tokens_per_s=%.0f"
      % (r["completed"], r["failed"], r["total_output_tokens"], r["duration"], r["output_throughput"]))
PY
