#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/demo.sh - the main job on a local simulated cluster: installs what is missing, builds, starts
# 2 prefill + 2 decode xpyd_sim engines and xpyd_router in front (ephemeral loopback ports), streams one
# request, runs a short benchmark_serving-style load with xpyd_bench, shows the router's view, and stops
# everything (also on Ctrl-C or error). Tunables: DEMO_PROMPTS, DEMO_CONCURRENCY, DEMO_HANDOFF.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
if [ "${XPYD_SKIP_BUILD:-0}" != 1 ]; then
  ./scripts/deps.sh # only what building and running xpyd needs; the tests' packages come with scripts/test.sh
  echo "== building xpyd in ${XPYD_BUILD_DIR:-build}/ (without the tests)"
  # one line per finished target; compiler messages, if any, come through as they are
  ./scripts/build.sh -DXPYD_TESTS=OFF | sed -un -E 's/^\[ *([0-9]+)%\] Built target (.*)/  [\1%] built \2/p'
fi
B=${XPYD_BIN_DIR:-${XPYD_BUILD_DIR:-build}/bin} # XPYD_BIN_DIR: run installed binaries (e.g. /usr/bin)
PROMPTS=${DEMO_PROMPTS:-200}
CONC=${DEMO_CONCURRENCY:-32}
HANDOFF=${DEMO_HANDOFF:-kv-params}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/xpyd-demo.XXXXXX")
trap 'xpyd_cluster_down; rm -rf "$WORK"' EXIT INT TERM
xpyd_cluster_up 2 2 "$HANDOFF"
echo "== cluster: 2 prefill + 2 decode simulated engines, router on 127.0.0.1:$RP (handoff $HANDOFF)"
echo "== one streamed request through the router:"
curl -sN "http://127.0.0.1:$RP/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model":"sim-model","prompt":"Disaggregated serving splits prefill and decode","max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}'
echo "== load: $PROMPTS prompts, concurrency $CONC"
$B/xpyd_bench --port "$RP" --num-prompts "$PROMPTS" --max-concurrency "$CONC" --random-input-len 256 \
  --random-output-len 64 --random-range-ratio 0.5 --ignore-eos --disable-tqdm \
  --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99
echo "== router view after the run (every in-flight and outstanding-token number back to zero):"
curl -s "http://127.0.0.1:$RP/status" | python3 -c '
import json, sys
s = json.load(sys.stdin)
for role, p in s["pools"].items():
    for i in p["instances"]:
        print("  %-7s %s:%d selected=%-5d inflight=%d outstanding_tokens=%d" % (role, i["host"], i["port"], i["selected"], i["inflight"], i["outstanding_tokens"]))
'
echo "== KV leases still held by the prefills (stranded KV, must be 0):"
for i in 0 1; do
  printf '  p%s: ' "$i"; curl -s "http://127.0.0.1:${SIM_PORTS_P[$i]}/metrics" | awk '/^xpyd_sim:kv_leases_active/ {print $2}'
done
echo "== done; everything is stopped on exit"
