#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/soak.sh - RSS over a long soak: N requests (default 1,000,000) through the router in front of a 1P1D
# pair of zero-delay sims, streamed, 4 output tokens each, 64 at once, 1 in 10 client connections... (all
# keep-alive via xpyd_bench). The router's VmRSS is sampled every 2 s; the report gives it after the first
# 10 % of the requests (warm), at the end, and its maximum, plus the router's gauges at the end (must be
# zero) and the failures (must be zero).
#   bench/soak.sh [requests=1000000] [concurrency=64]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
N=${1:-1000000} CONC=${2:-64}
[ "${XPYD_SKIP_BUILD:-0}" = 1 ] || { ./scripts/deps.sh; ./scripts/build.sh >/dev/null; }
B=${XPYD_BUILD_DIR:-build}/bin
WORK=$(mktemp -d /tmp/xpyd-soak.XXXXXX)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill $p 2>/dev/null; done; wait 2>/dev/null; rm -rf "$WORK"' EXIT
SIMFLAGS=(--port 0 --prefill-us-per-token 0 --decode-us-per-token 0 --max-batch 100000 --log-level warn)
$B/xpyd_sim --role prefill "${SIMFLAGS[@]}" --port-file "$WORK/p" 2>"$WORK/p.log" & PIDS+=($!)
$B/xpyd_sim --role decode "${SIMFLAGS[@]}" --port-file "$WORK/d" 2>"$WORK/d.log" & PIDS+=($!)
xpyd_wait_file "$WORK/p" 10; xpyd_wait_file "$WORK/d" 10
$B/xpyd_router --port 0 --port-file "$WORK/r" --log-level warn -p "127.0.0.1:$(cat "$WORK/p")" \
  -d "127.0.0.1:$(cat "$WORK/d")" 2>"$WORK/router.log" & RPID=$!; PIDS+=($RPID)
xpyd_wait_file "$WORK/r" 10
RPORT=$(cat "$WORK/r")
( while kill -0 $RPID 2>/dev/null; do
    echo "$(date +%s) $(awk '/VmRSS/{print $2}' /proc/$RPID/status 2>/dev/null)"; sleep 2
  done ) >"$WORK/rss.txt" & PIDS+=($!)
START=$(date +%s)
$B/xpyd_bench --port "$RPORT" --num-prompts "$N" --max-concurrency "$CONC" --random-input-len 16 \
  --random-output-len 4 --ignore-eos --disable-tqdm --save-result --result-filename "$WORK/b.json" >"$WORK/out.txt"
END=$(date +%s)
curl -s --max-time 5 "http://127.0.0.1:$RPORT/metrics" >"$WORK/metrics.txt"
echo "evhtp error lines: router=$(grep -c "no request associated" "$WORK/router.log" || true) prefill=$(grep -c "no request associated" "$WORK/p.log" || true) decode=$(grep -c "no request associated" "$WORK/d.log" || true)"
python3 - "$WORK/b.json" "$WORK/rss.txt" "$WORK/metrics.txt" "$START" "$END" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
samples = [tuple(map(int, l.split())) for l in open(sys.argv[2]) if len(l.split()) == 2]
start, end = int(sys.argv[4]), int(sys.argv[5])
warm_t = start + (end - start) // 10
warm = next((kb for ts, kb in samples if ts >= warm_t), samples[0][1])
last = [kb for ts, kb in samples if ts <= end][-1]
m = {}
for line in open(sys.argv[3]):
    if line and not line.startswith("#") and " " in line:
        k, v = line.rsplit(" ", 1)
        m[k] = float(v)
print("soak: requests=%d completed=%d failed=%d duration_s=%d req_per_s=%.0f" %
      (r["completed"] + r["failed"], r["completed"], r["failed"], end - start, r["request_throughput"]))
print("soak: router_rss_kib warm(10%%)=%d end=%d max=%d growth_after_warm_kib=%d" %
      (warm, last, max(kb for _, kb in samples), last - warm))
print("soak: router gauges at end: active_requests=%d active_streams=%d client_connections=%d" %
      (m.get("xpyd_active_requests", -1), m.get("xpyd_active_streams", -1), m.get("xpyd_client_connections", -1)))
PY
