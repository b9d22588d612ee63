#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/metrics_cost.sh - what the router's metrics cost, by instruction count: the router runs under
# valgrind's callgrind (counts instructions, repeatable, unlike wall-clock on a shared machine) for the
# same fixed workload twice, --metrics on and off, and the script prints both totals and their ratio.
#   bench/metrics_cost.sh [requests=300]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
N=${1:-300}
if [ "${XPYD_SKIP_BUILD:-0}" != 1 ]; then ./scripts/deps.sh valgrind; ./scripts/build.sh >/dev/null; fi
B=${XPYD_BUILD_DIR:-build}/bin
WORK=$(mktemp -d /tmp/xpyd-mcost.XXXXXX)
trap 'xpyd_cluster_down; rm -rf "$WORK"' EXIT INT TERM
for f in p d; do
  role=prefill; [ $f = d ] && role=decode
  $B/xpyd_sim --role $role --port 0 --port-file "$WORK/$f.port" --prefill-us-per-token 0 --decode-us-per-token 0 \
    --log-level warn >"$WORK/$f.log" 2>&1 &
  PIDS+=($!)
  xpyd_wait_file "$WORK/$f.port" 10
done
declare -A IR
for m in on off; do
  rm -f "$WORK/r.port"
  valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.$m" $B/xpyd_router --port 0 --port-file "$WORK/r.port" \
    --threads 1 --log-level error --health-interval-ms 0 --metrics $m -p 127.0.0.1:$(cat "$WORK/p.port") \
    -d 127.0.0.1:$(cat "$WORK/d.port") >"$WORK/r.$m.log" 2>&1 &
  RPID=$!
  xpyd_wait_file "$WORK/r.port" 120
  xpyd_wait_http "http://127.0.0.1:$(cat "$WORK/r.port")/health" 120
  $B/xpyd_bench --port "$(cat "$WORK/r.port")" --num-prompts "$N" --max-concurrency 8 --random-input-len 32 \
    --random-output-len 16 --ignore-eos --disable-tqdm --seed 3 >/dev/null
  kill -TERM $RPID; wait $RPID 2>/dev/null || true
  IR[$m]=$(awk '/^summary:/ {print $2}' "$WORK/cg.$m")
done
python3 -c "import sys; on,off,n=map(int,sys.argv[1:4]); print('metrics_cost: %d requests x 16 tokens; router instructions: metrics on %d, off %d; on/off = %.4f (%+.2f%%); %.0f instructions per request for metrics' % (n, on, off, on/off, (on/off-1)*100, (on-off)/n))" "${IR[on]}" "${IR[off]}" "$N"
