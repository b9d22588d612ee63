#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/balancer.sh - placement policies compared in one run on the same workload: a heavy-tailed (Pareto)
# mix of prompt and output lengths at a steady request rate, through xpyd_router, against 1 prefill and 4
# decode sims in the KV-bound regime of real engines: each decode rank holds at most KVCAP KV tokens (a
# request waits until its prompt fits, as in vLLM) and a decode step takes longer the more KV its batch
# holds. Reports p50/p99 TTFT and TPOT per decode policy, and how evenly the decode ranks were loaded.
#   bench/balancer.sh [prompts=600] [rate=30]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
N=${1:-600} RATE=${2:-30}
KVCAP=${BAL_KV_CAPACITY:-12000}
if [ "${XPYD_SKIP_BUILD:-0}" != 1 ]; then ./scripts/deps.sh; ./scripts/build.sh >/dev/null; fi
B=${XPYD_BUILD_DIR:-build}/bin
WORK=$(mktemp -d /tmp/xpyd-balancer.XXXXXX)
trap 'xpyd_cluster_down; rm -rf "$WORK"' EXIT INT TERM
echo "# balancer policies — $(date -u +%Y-%m-%dT%H:%MZ), $N prompts at $RATE req/s, Pareto lengths (mean in 512, out 128)"
echo "1 prefill sim (20 us/token); 4 decode sims: 5 ms/step + 1 us per KV token held, KV capacity $KVCAP tokens; router: one thread"
echo
echo "| decode policy | TTFT p50 (ms) | TTFT p99 (ms) | TPOT p50 (ms) | TPOT p99 (ms) | completed | tokens per decode rank | max/mean |"
echo "|---|---|---|---|---|---|---|---|"
for pol in ${BAL_POLICIES:-lot rr p2c}; do
  SIM_PREFILL_US=20 SIM_DECODE_US=5000 SIM_MAX_BATCH=256 \
    SIM_DECODE_ARGS="--kv-capacity-tokens $KVCAP --decode-ns-per-kv-token 1000 --max-model-len 32768" \
    xpyd_cluster_up 1 4 kv-params --decode-policy $pol --threads 1 ${BAL_ROUTER_ARGS:-}
  $B/xpyd_bench --port "$RP" --num-prompts "$N" --request-rate "$RATE" --seed 7 --length-dist pareto \
    --random-input-len 512 --random-output-len 128 --ignore-eos --disable-tqdm --percentile-metrics ttft,tpot \
    --metric-percentiles 50,99 --save-result --result-filename "$WORK/$pol.json" >/dev/null || true
  if [ -n "${XPYD_SAMPLES_DIR:-}" ]; then mkdir -p "$XPYD_SAMPLES_DIR"; cp "$WORK/$pol.json" "$XPYD_SAMPLES_DIR/cdf-policy-$pol.json"; fi
  toks=()
  for p in "${SIM_PORTS_D[@]}"; do
    toks+=("$(curl -fs "http://127.0.0.1:$p/metrics" | awk '/^vllm:generation_tokens_total/ {print $2}')")
  done
  python3 - "$WORK/$pol.json" "$pol" "${toks[@]}" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); pol = sys.argv[2]; toks = [float(x) for x in sys.argv[3:]]
mean = sum(toks) / len(toks)
print("| %s | %.1f | %.1f | %.2f | %.2f | %d/%d | %s | %.2f |" % (
    pol, r["p50_ttft_ms"], r["p99_ttft_ms"], r["p50_tpot_ms"], r["p99_tpot_ms"], r["completed"], r["num_prompts"],
    " / ".join("%d" % t for t in toks), max(toks) / mean if mean else 0))
PY
  xpyd_cluster_down
done
