#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/kv_events.sh - precise prefix-cache routing (issue 40): placement by what engines report caching (their KV
# events) against the router's own guess (`cache` without events) and `lot`, side by side in one run, on 4 prefill
# + 4 decode sims where the cache decides TTFT and throughput:
#  - each prefill rank has a vLLM-style block pool (sim_blocks.c) of CACHE_BLOCKS blocks of 16 tokens, by default
#    a quarter of the workload's distinct context (TENANTS tenants x 4,000 tokens, plus every question's own
#    blocks): the pool holds the contexts only if each tenant stays on one rank, and evictions never stop;
#  - a prefill computes one prompt at a time, 20 us per uncached token; decodes 2 ms per token, 16 tokens;
#  - the workload: TENANTS tenants with 4,000-token shared contexts and 100-token questions (prefix-repetition,
#    token ids), at RATE req/s; halfway, prefill 0's engine restarts (killed, started again: an empty cache).
# Rows (each a fresh cluster, the same seeded workload):
#  precise   `cache` with every prefill publishing KV events (--kv-events)
#  greedy    the same, placing by cache alone (--cache-max-imbalance 1000): what knowing every cache buys
#  approx    `cache` from the router's own guess (the engines publish events, the router is not told where)
#  lot       least outstanding tokens, no cache awareness
#  *-2routers two routers in front of the same engines, each with half the clients (the same tenants): each
#            router's own guess sees half of what the engines cache and evict; their events show all of it
#  *-noevict the same without evictions (CACHE_BLOCKS large): precise must be no worse than approx
# CPU ms/req: the machine's busy CPU time while the clients ran (every process: sims, routers, load generator) and
# the routers' own, per completed request (this machine has 2 cores: rows near saturation trade CPU for throughput).
#   bench/kv_events.sh [prompts=600] [rate=24]    KV_ROWS="precise approx" runs only those rows;
#   KV_CONCURRENCY=64: saturation (that many requests in flight over all clients) instead of the rate (the
#   restart then comes once half the prompts are answered); CACHE_BLOCKS, TENANTS as above;
#   KV_ROUTER_CAPACITY=default: the router's guess is not told the engines' cache size (--prefix-cache-blocks
#   left at its default, as when engines are not scraped); by default it is told exactly;
#   KV_ROUTER_FLAGS: more flags for every row's routers (e.g. engine feedback: --scrape-interval-ms 100);
#   KV_RESTART=0: no restart (then one router reaches the ideal partition in either mode, hit 0.937: what the
#   restart costs is the rest of the difference);
#   KV_ENGINE_BLOCK=N (16): the prefills' block size, the same cache in tokens (--num-gpu-blocks scaled), the
#   router's blocks 16 tokens still; KV_FORMAT=map|array|sglang: their events' encoding (KV_ENGINE_BLOCK=1
#   KV_FORMAT=sglang: as SGLang publishes with its default --page-size 1, an event a token)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
N=${1:-600} RATE=${2:-24}
TENANTS=${TENANTS:-48}
CACHE_BLOCKS=${CACHE_BLOCKS:-3000}
EB=${KV_ENGINE_BLOCK:-16}
if [ "${XPYD_SKIP_BUILD:-0}" != 1 ]; then ./scripts/deps.sh; ./scripts/build.sh >/dev/null; fi
B=${XPYD_BUILD_DIR:-build}/bin
WORK=$(mktemp -d /tmp/xpyd-kvev.XXXXXX)
trap 'xpyd_cluster_down; rm -rf "$WORK"' EXIT INT TERM
WL="--tokenizer-free --dataset-name prefix-repetition --prefix-repetition-prefix-len 4000
    --prefix-repetition-suffix-len 100 --prefix-repetition-num-prefixes $TENANTS --prefix-repetition-output-len 16"

# CPU time in clock ticks: the whole machine's busy time (/proc/stat), and one process's (utime + stime)
cpu_busy() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }
proc_cpu() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }

# free loopback ports for the sims' publishers
kv_ports() { python3 -c 'import socket
s = [socket.socket() for _ in range(4)]
[x.bind(("127.0.0.1", 0)) for x in s]
print(" ".join(str(x.getsockname()[1]) for x in s))'; }

# prefill_up I BLOCKS EVENTS_PORT: starts (or restarts on its old ports) prefill sim I
prefill_up() {
  local i=$1 blocks=$2 kvp=$3 port=${4:-0} ev=()
  [ "$kvp" = 0 ] || ev=(--kv-events "tcp://*:$kvp")
  rm -f "$WORK/p$i.port"
  $B/xpyd_sim --role prefill --port "$port" --port-file "$WORK/p$i.port" --log-level warn --prefill-us-per-token 20 \
    --prefill-compute serial --prefix-caching on --num-gpu-blocks $((blocks * 16 / EB)) --block-size "$EB" \
    --kv-events-format "${KV_FORMAT:-map}" --max-model-len 65536 "${ev[@]}" >>"$WORK/p$i.log" 2>&1 &
  PPID_OF[$i]=$!
  PIDS+=($!)
  xpyd_wait_file "$WORK/p$i.port" 10
}

# run NAME POLICY EVENTS(0|1) BLOCKS ROUTERS "ROUTER FLAGS": one fresh cluster behind ROUTERS routers, one run
# with a restart halfway
run() {
  local name=$1 pol=$2 events=$3 blocks=$4 routers=$5 rflags=$6 i hosts="" kvp
  case " ${KV_ROWS:-$name} " in *" $name "*) ;; *) return 0 ;; esac
  rm -f "$WORK"/*.port # a file left by the previous cluster would name a dead port
  read -r -a KVP <<<"$(kv_ports)"
  PPID_OF=() P_PORT=()
  for ((i = 0; i < 4; i++)); do
    kvp=${KVP[$i]} # every row's engines publish (the same CPU on this small machine); only precise rows listen
    prefill_up "$i" "$blocks" "$kvp"
    P_PORT[$i]=$(cat "$WORK/p$i.port")
    hosts+="${hosts:+,}{\"host\":\"127.0.0.1\",\"port\":${P_PORT[$i]}$([ "$events" = 0 ] || echo ",\"kv_events\":\"tcp://127.0.0.1:$kvp\"")}"
  done
  local dh=""
  for ((i = 0; i < 4; i++)); do
    $B/xpyd_sim --role decode --port 0 --port-file "$WORK/d$i.port" --log-level warn --decode-us-per-token 2000 \
      --max-batch 256 --max-model-len 65536 >"$WORK/d$i.log" 2>&1 &
    PIDS+=($!)
    xpyd_wait_file "$WORK/d$i.port" 10
    dh+="${dh:+,}\"127.0.0.1:$(cat "$WORK/d$i.port")\""
  done
  echo "{\"prefill\":{\"hosts\":[$hosts]},\"decode\":{\"hosts\":[$dh]}}" >"$WORK/topo.json"
  RPS=() RPIDS=()
  for ((i = 0; i < routers; i++)); do
    # shellcheck disable=SC2086
    $B/xpyd_router --port 0 --port-file "$WORK/router$i.port" --config "$WORK/topo.json" --prefill-policy "$pol" \
      --threads 1 $([ "${KV_ROUTER_CAPACITY:-engines}" = default ] || echo "--prefix-cache-blocks $blocks") \
      $rflags ${KV_ROUTER_FLAGS:-} >"$WORK/router$i.log" 2>&1 &
    PIDS+=($!) RPIDS+=($!)
    xpyd_wait_file "$WORK/router$i.port" 10
    RPS+=("$(cat "$WORK/router$i.port")")
    xpyd_wait_http "http://127.0.0.1:${RPS[$i]}/health" 10 ||
      { for f in "$WORK"/router*.log "$WORK"/p*.log; do echo "== $f"; tail -n 5 "$f"; done; exit 1; }
  done
  # halfway, prefill 0's engine restarts with an empty cache on its old ports: at a rate, after N / RATE / 2 s; at
  # saturation, once the routers have answered N / 2 requests (by time, a row running faster met the restart
  # later or not at all: it was timing, not placement, that decided such a row)
  ( [ "${KV_RESTART:-1}" = 1 ] || exec sleep 3600 # (exec: killed with this subshell, no child left holding stdout)
    if [ -n "${KV_CONCURRENCY:-}" ]; then
      until [ "$(for p in "${RPS[@]}"; do curl -fs "http://127.0.0.1:$p/metrics"; done |
                 awk '/^xpyd_requests_total/ {s += $2} END {printf "%d", s}')" -ge $((N / 2)) ]; do sleep 0.02; done
    else
      sleep "$(python3 -c "print($N / $RATE / 2)")"
    fi
    kill -9 "${PPID_OF[0]}" 2>/dev/null; sleep 0.3
    prefill_up 0 "$blocks" "${KVP[0]}" "${P_PORT[0]}"; sleep 3600 ) &
  local restarter=$!
  # each router its own clients: the same tenants (--prefix-repetition-prefix-seed), their own order and questions
  local bp=() busy0 rcpu0=0 busy1 rcpu1=0 r
  busy0=$(cpu_busy)
  for r in "${RPIDS[@]}"; do rcpu0=$((rcpu0 + $(proc_cpu "$r"))); done
  for ((i = 0; i < routers; i++)); do
    # shellcheck disable=SC2086
    $B/xpyd_bench --port "${RPS[$i]}" --seed $((11 + i)) --prefix-repetition-prefix-seed 5 --disable-tqdm \
      --percentile-metrics ttft,e2el --metric-percentiles 50,90,99 --save-result \
      --result-filename "$WORK/$name.$i.json" $WL --num-prompts $((N / routers)) \
      $(if [ -n "${KV_CONCURRENCY:-}" ]; then echo "--max-concurrency $((KV_CONCURRENCY / routers))";
        else echo "--request-rate $(python3 -c "print($RATE / $routers)")"; fi) >"$WORK/$name.$i.txt" &
    bp+=($!)
  done
  for p in "${bp[@]}"; do wait "$p" 2>/dev/null || true; done # (2>: bash reports the restarted sim killed as it reaps it here)
  busy1=$(cpu_busy)
  for r in "${RPIDS[@]}"; do rcpu1=$((rcpu1 + $(proc_cpu "$r"))); done
  kill "$restarter" 2>/dev/null || true
  wait "$restarter" 2>/dev/null || true
  local hits=0 queries=0 p m h q comp=""
  for ((i = 0; i < 4; i++)); do
    m=$(curl -fs "http://127.0.0.1:${P_PORT[$i]}/metrics" || true)
    h=$(echo "$m" | awk '/^vllm:prefix_cache_hits_total/ {h=$2} END {printf "%d", h}')
    q=$(echo "$m" | awk '/^vllm:prefix_cache_queries_total/ {q=$2} END {printf "%d", q}')
    hits=$((hits + h)) queries=$((queries + q)) comp+="$((q - h)) " # tokens each rank computed (rank 0: since its restart)
  done
  rm=$(curl -fs "http://127.0.0.1:${RPS[0]}/metrics" | grep -E '^xpyd_(kv_events_(resets|batches)_total|kv_placements_total|prefix_(predicted|cached)_tokens_total|retries_denied_total)' | tr '\n' ';' || true)
  python3 - "$WORK" "$name" "$hits" "$queries" "$rm" "$routers" "$comp" \
    "$(((busy1 - busy0) * 1000 / $(getconf CLK_TCK)))" "$(((rcpu1 - rcpu0) * 1000 / $(getconf CLK_TCK)))" >>"$WORK/rows" <<'PY'
import json, sys
rs = [json.load(open("%s/%s.%d.json" % (sys.argv[1], sys.argv[2], i))) for i in range(int(sys.argv[6]))]
h, q = int(sys.argv[3]), int(sys.argv[4])
ttft = sorted(x for r in rs for x in r["ttfts"] if x and x > 0)
pct = lambda p: 1000 * ttft[min(len(ttft) - 1, int(p / 100 * len(ttft)))] if ttft else 0
done = sum(r["completed"] for r in rs)
dur = max(r["duration"] for r in rs)
print(json.dumps({"name": sys.argv[2], "completed": done, "failed": sum(r["failed"] for r in rs),
                  "hit": h / q if q else 0, "ttft50": pct(50), "ttft90": pct(90), "thr": done / dur,
                  "tok": sum(r["total_output_tokens"] for r in rs) / dur, "router": sys.argv[5],
                  "computed": [int(x) for x in sys.argv[7].split()],
                  "cpu_ms": int(sys.argv[8]) / max(done, 1), "router_cpu_ms": int(sys.argv[9]) / max(done, 1)}))
PY
  xpyd_cluster_down
  # the restarted sim is not a child of this shell's PIDS list when it was started by the subshell
  pkill -f "port-file $WORK/p0.port" 2>/dev/null || true
}

BIG=$((TENANTS * 4100 / 16 + 1000))
echo "# precise prefix-cache routing — $(date -u +%Y-%m-%dT%H:%MZ), 4P+4D sims, $TENANTS tenants x 4000 tokens, $CACHE_BLOCKS blocks x 16 tokens per prefill (engine blocks of $EB, events ${KV_FORMAT:-map}), $N prompts at $RATE req/s, prefill 0 $([ "${KV_RESTART:-1}" = 1 ] && echo restarted halfway || echo not restarted)"
run precise cache 1 "$CACHE_BLOCKS" 1 ""
run greedy cache 1 "$CACHE_BLOCKS" 1 "--cache-max-imbalance 1000"
run approx cache 0 "$CACHE_BLOCKS" 1 ""
run lot lot 0 "$CACHE_BLOCKS" 1 ""
run precise-2routers cache 1 "$CACHE_BLOCKS" 2 ""
run approx-2routers cache 0 "$CACHE_BLOCKS" 2 ""
run precise-noevict cache 1 "$BIG" 1 ""
run approx-noevict cache 0 "$BIG" 1 ""

python3 - "$WORK/rows" <<'PY'
import json, sys
rows = {r["name"]: r for r in map(json.loads, open(sys.argv[1]))}
print("\n| row | completed | engine hit rate | TTFT p50 (ms) | TTFT p90 (ms) | req/s | output tok/s | computed max/mean "
      "| CPU ms/req: machine, routers |")
print("|---|---|---|---|---|---|---|---|---|")
for r in rows.values():
    c = r["computed"][1:]  # rank 0 restarted: its counts start again
    print("| %s | %d/%d | %.3f | %.1f | %.1f | %.2f | %.1f | %.2f | %.2f, %.2f |" % (r["name"], r["completed"],
          r["completed"] + r["failed"], r["hit"], r["ttft50"], r["ttft90"], r["thr"], r["tok"],
          max(c) / max(sum(c) / len(c), 1) if c else 0, r["cpu_ms"], r["router_cpu_ms"]))
for r in rows.values():
    print("router %s: %s" % (r["name"], r["router"]))
g = lambda n, k: rows[n][k]
print("\nAcceptance (ratios from the rows above):")
def chk(text, ok): print("- %s: %s" % (text, "yes" if ok else "NO"))
if "precise" in rows and "greedy" in rows:
    chk("hit rate precise/greedy = %.3f (>= 0.95)" % (g("precise", "hit") / max(g("greedy", "hit"), 1e-9)),
        g("precise", "hit") >= 0.95 * g("greedy", "hit"))
for sfx in ("", "-2routers"):
    if "precise" + sfx not in rows or "approx" + sfx not in rows:
        continue
    chk("TTFT p90 precise%s/approx%s = %.3f (<= 0.5)" % (sfx, sfx, g("precise" + sfx, "ttft90") / g("approx" + sfx, "ttft90")),
        g("precise" + sfx, "ttft90") <= 0.5 * g("approx" + sfx, "ttft90"))
    chk("throughput precise%s/approx%s = %.3f (>= 1.2)" % (sfx, sfx, g("precise" + sfx, "thr") / g("approx" + sfx, "thr")),
        g("precise" + sfx, "thr") >= 1.2 * g("approx" + sfx, "thr"))
if "greedy" in rows and "approx" in rows:
    print("- what knowing every cache buys one router here: TTFT p90 greedy/approx = %.3f, req/s %.3f (not a check: "
          "near 1, the router's own guess already knows what the events tell it)" % (
          g("greedy", "ttft90") / g("approx", "ttft90"), g("greedy", "thr") / g("approx", "thr")))
if "precise-noevict" in rows and "approx-noevict" in rows:
    chk("no evictions: TTFT p90 precise/approx = %.3f, hit rate %.3f / %.3f (no worse)" % (
        g("precise-noevict", "ttft90") / g("approx-noevict", "ttft90"), g("precise-noevict", "hit"),
        g("approx-noevict", "hit")),
        g("precise-noevict", "ttft90") <= 1.05 * g("approx-noevict", "ttft90") and
        g("precise-noevict", "hit") >= 0.98 * g("approx-noevict", "hit"))
PY
