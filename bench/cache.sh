#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/cache.sh - cache-aware placement (policy `cache`, session affinity, local prefill) against `lot`, side
# by side in one run, on 4 prefill + 4 decode sims that model what makes placement matter:
#  - each rank has a vLLM-style prefix cache (--prefix-caching on) of CACHE_BLOCKS blocks of 16 tokens, by
#    default a third of the workload's distinct prefix tokens (32 prefixes x 2,000 tokens = 64,000);
#  - a prefill rank computes one prompt at a time (--prefill-compute serial), 20 us per uncached token
#    (50,000 tokens/s per rank), so computing fewer tokens is both lower TTFT and more throughput;
#  - decodes 2 ms per token, 16 output tokens.
# Rows (each a fresh cluster, the same seeded workload for both policies):
#  A  prefix-repetition at the same offered load (RATE req/s): engine-reported hit rate, TTFT, how evenly
#     the prefill and decode ranks were loaded (prompt tokens each computed, and requests each took: max/mean);
#  B  prefix-repetition at saturation (no rate limit, 64 in flight): request throughput;
#  C  multi-turn chat (conversations of 6 turns re-sending their history): hit rate of `cache`, and of an
#     oracle that sends every conversation back to its previous rank (session affinity on `user`, unbounded);
#  D  random prompts, no sharing: TTFT p99 and throughput, `cache` vs `lot`;
#  E  short prompts (64 tokens) at low load: local prefill (--local-prefill-max-tokens 128) vs always remote.
#   bench/cache.sh [prompts=600] [rate=40]
#   CACHE_ROWS="A C" runs only those rows; CACHE_ROUTER_ARGS="..." adds router flags to every row (e.g.
#   CACHE_ROWS=A CACHE_ROUTER_ARGS="--cache-uncached-weight 1").
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
N=${1:-600} RATE=${2:-40}
CACHE_BLOCKS=${CACHE_BLOCKS:-1333}
if [ "${XPYD_SKIP_BUILD:-0}" != 1 ]; then ./scripts/deps.sh; ./scripts/build.sh >/dev/null; fi
B=${XPYD_BUILD_DIR:-build}/bin
WORK=$(mktemp -d /tmp/xpyd-cache.XXXXXX)
trap 'xpyd_cluster_down; rm -rf "$WORK"' EXIT INT TERM
export SIM_PREFILL_US=20 SIM_DECODE_US=2000 SIM_MAX_BATCH=256
SIMC="--prefix-caching on --num-gpu-blocks $CACHE_BLOCKS --prefill-compute serial --max-model-len 65536"
export SIM_PREFILL_ARGS="$SIMC" SIM_DECODE_ARGS="$SIMC"
PR="--dataset-name prefix-repetition --prefix-repetition-prefix-len 2000 --prefix-repetition-suffix-len 200
    --prefix-repetition-num-prefixes 32 --prefix-repetition-output-len 16"

# run NAME POLICY "ROUTER FLAGS" "BENCH FLAGS": one fresh cluster, one xpyd_bench run, one summary line in
# $WORK/rows (JSON): the bench's result plus per-rank prefill tokens computed and requests taken.
run() {
  local name=$1 pol=$2 rflags="$3 ${CACHE_ROUTER_ARGS:-}" bflags=$4
  case " ${CACHE_ROWS:-A B C D E} " in *" ${name%%-*} "*) ;; *) return 0 ;; esac
  # shellcheck disable=SC2086
  xpyd_cluster_up 4 4 kv-params --prefill-policy "$pol" --decode-policy "$pol" --threads 1 \
    --prefix-cache-blocks "$CACHE_BLOCKS" $rflags
  # shellcheck disable=SC2086
  $B/xpyd_bench --port "$RP" --seed 11 --disable-tqdm --percentile-metrics ttft,e2el --metric-percentiles 50,99 \
    --save-result --result-filename "$WORK/$name.json" $bflags >"$WORK/$name.txt" || true
  local pm=() dm=() rm
  for p in "${SIM_PORTS_P[@]}"; do pm+=("$(curl -fs "http://127.0.0.1:$p/metrics" | awk '
      /^vllm:prompt_tokens_total/ {t=$2} /^vllm:prefix_cache_hits_total/ {h=$2} /^vllm:request_success_total/ {r=$2}
      END {printf "%d:%d", t-h, r}')")
  done
  for p in "${SIM_PORTS_D[@]}"; do dm+=("$(curl -fs "http://127.0.0.1:$p/metrics" | awk '
      /^vllm:request_success_total/ {r=$2} END {printf "%d", r}')")
  done
  rm=$(curl -fs "http://127.0.0.1:$RP/metrics" | grep -E '^xpyd_(pd_decisions_total|prefix_predicted_tokens_total|prefix_cached_tokens_total)' | tr '\n' ';')
  python3 - "$WORK/$name.json" "$name" "$pol" "${pm[*]}" "${dm[*]}" "$rm" >>"$WORK/rows" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
pre = [tuple(int(x) for x in v.split(":")) for v in sys.argv[4].split()]
dec = [int(x) for x in sys.argv[5].split()]
mm = lambda v: max(v) / (sum(v) / len(v)) if sum(v) else 0
print(json.dumps({"name": sys.argv[2], "policy": sys.argv[3], "completed": r["completed"], "failed": r["failed"],
                  "hit": r.get("cache_hit_rate"), "ttft50": r["median_ttft_ms"], "ttft99": r["p99_ttft_ms"],
                  "thr": r["request_throughput"], "dur": r["duration"],
                  "p_tokens": [t for t, _ in pre], "p_tok_mm": mm([t for t, _ in pre]),
                  "p_req_mm": mm([q for _, q in pre]), "d_req": dec, "d_req_mm": mm(dec), "router": sys.argv[6]}))
PY
  xpyd_cluster_down
}

echo "# cache-aware placement — $(date -u +%Y-%m-%dT%H:%MZ), 4P+4D sims, prefix cache $CACHE_BLOCKS blocks x 16 tokens per rank"
run A-lot lot "" "$PR --num-prompts $N --request-rate $RATE"
run A-cache cache "" "$PR --num-prompts $N --request-rate $RATE"
run B-lot lot "" "$PR --num-prompts $N --max-concurrency 64"
run B-cache cache "" "$PR --num-prompts $N --max-concurrency 64"
MT="--backend openai-chat --multi-turn 6 --random-input-len 300 --random-output-len 40 --num-prompts 480 --max-concurrency 16"
run C-cache cache "" "$MT"
run C-lot lot "" "$MT"
run C-oracle lot "--session-key body:user --session-epsilon 100" "$MT"
RND="--random-input-len 1000 --random-output-len 16 --num-prompts $N --request-rate $RATE"
run D-lot lot "" "$RND"
run D-cache cache "" "$RND"
SHORT="--random-input-len 64 --random-output-len 16 --num-prompts 200 --request-rate 5"
run E-remote cache "" "$SHORT"
run E-local cache "--local-prefill-max-tokens 128" "$SHORT"

python3 - "$WORK/rows" <<'PY'
import json, sys
rows = {r["name"]: r for r in map(json.loads, open(sys.argv[1]))}
def g(n, k): return rows[n][k]
def have(*names): return all(n in rows for n in names)
print("\n| row | policy | completed | hit rate | TTFT p50 (ms) | TTFT p99 (ms) | req/s | prefill tokens computed per rank | max/mean prefill tokens | max/mean prefill reqs | max/mean decode reqs |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows.values():
    print("| %s | %s | %d/%d | %s | %.1f | %.1f | %.2f | %s | %.2f | %.2f | %.2f |" % (
        r["name"], r["policy"], r["completed"], r["completed"] + r["failed"],
        "%.3f" % r["hit"] if r["hit"] is not None else "-", r["ttft50"], r["ttft99"], r["thr"],
        " / ".join(str(t) for t in r["p_tokens"]), r["p_tok_mm"], r["p_req_mm"], r["d_req_mm"]))
print("\nAcceptance (ratios from the rows above):")
def chk(text, ok): print("- %s: %s" % (text, "yes" if ok else "NO"))
if have("A-cache", "A-lot"):
    hr = g("A-cache", "hit") / max(g("A-lot", "hit"), 1e-9)
    chk("A hit rate cache/lot = %.2f (>= 3)" % hr, hr >= 3)
    t = g("A-cache", "ttft50") / g("A-lot", "ttft50")
    chk("A TTFT p50 cache/lot = %.2f (<= 0.5)" % t, t <= 0.5)
    mm = max(g("A-cache", "p_tok_mm"), g("A-cache", "d_req_mm"))
    chk("A cache: prefill tokens and decode requests max/mean = %.2f / %.2f (<= 1.3)" % (g("A-cache", "p_tok_mm"), g("A-cache", "d_req_mm")), mm <= 1.3)
if have("B-cache", "B-lot"):
    th = g("B-cache", "thr") / g("B-lot", "thr")
    chk("B saturation throughput cache/lot = %.2f (>= 1.5)" % th, th >= 1.5)
if have("C-cache", "C-oracle", "C-lot"):
    o = g("C-cache", "hit") / max(g("C-oracle", "hit"), 1e-9)
    chk("C multi-turn hit rate cache/oracle = %.2f (>= 0.8; lot: %.3f)" % (o, g("C-lot", "hit")), o >= 0.8)
if have("D-cache", "D-lot"):
    d1 = g("D-cache", "ttft99") / g("D-lot", "ttft99"); d2 = g("D-cache", "thr") / g("D-lot", "thr")
    chk("D no sharing: TTFT p99 cache/lot = %.3f, throughput %.3f (within 5 %%)" % (d1, d2), d1 <= 1.05 and d2 >= 0.95)
if have("E-local", "E-remote"):
    e = g("E-local", "ttft50") / g("E-remote", "ttft50")
    chk("E short prompts: TTFT p50 local/remote = %.2f (<= 0.7)" % e, e <= 0.7)
PY
