#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/overhead.sh - what the router itself costs, measured side by side in one run on this machine:
#   1. added latency: the router vs the same kv-params P->D sequence done by the client directly
#      (xpyd_bench --direct-prefill), TTFT and ITL p50/p99, at 256 concurrent streams;
#   2. single-hop relay: xpyd_router --handoff none vs nginx (proxy_buffering off), both relaying the same
#      decode stream, requests/s and p99 end-to-end at fixed concurrency, one worker each on the same core;
#   3. router maximum throughput on one core: requests/s with short outputs, streamed tokens/s with long
#      outputs, CPU seconds per 1,000 requests (from /proc/<pid>/stat); metrics on vs off;
#   4. memory: router RSS with N open streams, per stream;
#   5. syscalls per relayed request (strace -c -f on a short run): nginx, router single hop, router P->D;
#   6. streamed tokens per router CPU-second with an engine that spaces tokens (1 ms ITL, 256 streams), and
#      syscalls per streamed token.
# Sections 2 and 6 also run bench/floor_relay.c (xpyd_floor_relay): a relay with next to no user-space work
# (raw epoll, one engine connection per client, no parsing), i.e. what the kernel charges any relay here.
# Pinning (taskset): the router / nginx on CPU 1 alone; sims and the load generator on CPU 0.
#   bench/overhead.sh [--quick] [--only N]   (quick: smaller counts, for a smoke run; N: one section)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
. bench/lib.sh
QUICK=0 ONLY=0
while [ $# -gt 0 ]; do
  case "$1" in --quick) QUICK=1; shift ;; --only) ONLY=$2; shift 2 ;; *) echo "usage: $0 [--quick] [--only N]" >&2; exit 2 ;; esac
done
want() { [ "$ONLY" = 0 ] || [ "$ONLY" = "$1" ]; }
if [ "${XPYD_SKIP_BUILD:-0}" != 1 ]; then ./scripts/deps.sh nginx-light strace; ./scripts/build.sh >/dev/null; fi
B=${XPYD_BUILD_DIR:-build}/bin
WORK=$(mktemp -d /tmp/xpyd-overhead.XXXXXX)
trap 'xpyd_cluster_down; rm -rf "$WORK"' EXIT INT TERM
if [ $QUICK = 1 ]; then NLAT=256; NREQ=2000; NLONG=64; NMEM=500; NSYS=300; NSPACED=256; else NLAT=1024; NREQ=20000; NLONG=256; NMEM=${OVERHEAD_STREAMS:-9000}; NSYS=2000; NSPACED=1024; fi
HOP_ROUNDS=${OVERHEAD_ROUNDS:-$([ $QUICK = 1 ] && echo 1 || echo 3)} # section 2

start_sim() { # name args...
  local n=$1; shift
  rm -f "$WORK/$n.port"
  taskset -c 0 $B/xpyd_sim --port 0 --port-file "$WORK/$n.port" --log-level warn --max-batch 100000 \
    --max-model-len 1000000 "$@" >"$WORK/$n.log" 2>&1 &
  PIDS+=($!)
  xpyd_wait_file "$WORK/$n.port" 10
}
start_router() { # name args...
  local n=$1; shift
  rm -f "$WORK/$n.port"
  taskset -c 1 $B/xpyd_router --port 0 --port-file "$WORK/$n.port" --log-level error --threads 1 "$@" \
    >"$WORK/$n.log" 2>&1 &
  PIDS+=($!)
  echo $! >"$WORK/$n.pid"
  xpyd_wait_file "$WORK/$n.port" 10
  xpyd_wait_http "http://127.0.0.1:$(cat "$WORK/$n.port")/health" 10
}
bench() { # result-file args...
  local out=$1; shift
  taskset -c 0 $B/xpyd_bench --disable-tqdm --ignore-eos --save-result --result-filename "$out" \
    --metric-percentiles 50,99 --percentile-metrics ttft,itl,e2el "$@" >/dev/null || true
}
cpu_ticks() { local t=0 p; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo $t; }
# XPYD_SAMPLES_DIR: keep the raw results for bench/plot.sh (cdf-<chart>-<label>.json, cpu.tsv)
keep() { [ -z "${XPYD_SAMPLES_DIR:-}" ] || { mkdir -p "$XPYD_SAMPLES_DIR"; cp "$1" "$XPYD_SAMPLES_DIR/$2"; }; }
keep_cpu() { [ -z "${XPYD_SAMPLES_DIR:-}" ] || { mkdir -p "$XPYD_SAMPLES_DIR"; printf '%s\t%s\n' "$1" "$2" >>"$XPYD_SAMPLES_DIR/cpu.tsv"; }; }
j() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d[sys.argv[2]])" "$@"; }

echo "# xpyd router overhead — $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(uname -r)"
echo

# start_nginx DECODE_PORT: nginx (one worker, pinned to CPU 1) relaying to the decode, proxy_buffering off,
# upstream keep-alive; sets NG (its port) and NGW (its worker's pid)
start_nginx() {
  local D=$1
  NG=$(xpyd_free_port)
  bench_nginx_conf "$WORK/ng" "$D" "$NG"
  taskset -c 1 nginx -c "$WORK/ng/nginx.conf" -p "$WORK/ng" &
  PIDS+=($!)
  xpyd_wait_http "http://127.0.0.1:$NG/health" 10
  NGW=$(pgrep -P "$(cat "$WORK/ng/nginx.pid")" | tr '\n' ' ')
}

# the floor relay (bench/floor_relay.c): what any relay pays here for the same traffic with next to no user-space
# work; sets FL (its port) and FLP (its pid). start_floor hop|pd DECODE_PORT [PREFILL_PORT]
start_floor() {
  FL=$(xpyd_free_port)
  taskset -c 1 $B/xpyd_floor_relay "$1" "$FL" "$2" ${3:-} >"$WORK/floor-$1.log" 2>&1 &
  FLP=$!
  PIDS+=($!)
  xpyd_wait_http "http://127.0.0.1:$FL/v1/models" 10
}

# ---- 1. added latency ----
# 1a: one client, every process on CPU 0: no cross-CPU wake-ups in either path (on this VM an idle vCPU
#     takes hundreds of µs to wake, which would be charged to whichever path crosses CPUs).
# 1b: 256 concurrent streams, the router alone on CPU 1.
if want 1; then
lat_pair() { # label router-cpu prompts concurrency output itl_us
  local label=$1 rcpu=$2 n=$3 c=$4 out=$5 itl=$6
  start_sim p --role prefill --prefill-us-per-token 0
  start_sim d --role decode --decode-us-per-token "$itl"
  P=$(cat "$WORK/p.port"); D=$(cat "$WORK/d.port")
  rm -f "$WORK/r1.port"
  taskset -c "$rcpu" $B/xpyd_router --port 0 --port-file "$WORK/r1.port" --log-level error --threads 1 \
    -p 127.0.0.1:$P -d 127.0.0.1:$D >"$WORK/r1.log" 2>&1 &
  PIDS+=($!)
  xpyd_wait_file "$WORK/r1.port" 10
  R1=$(cat "$WORK/r1.port")
  xpyd_wait_http "http://127.0.0.1:$R1/health" 10
  local A=(--num-prompts "$n" --max-concurrency "$c" --random-input-len 128 --random-output-len "$out")
  bench "$WORK/direct.json" --port $D --direct-prefill 127.0.0.1:$P "${A[@]}"
  bench "$WORK/router.json" --port $R1 "${A[@]}"
  case "$label" in 1a.*) keep "$WORK/direct.json" cdf-pd-direct.json; keep "$WORK/router.json" cdf-pd-router.json ;; esac
  python3 - "$WORK/direct.json" "$WORK/router.json" "$label" <<'PY'
import json, sys
d, r = (json.load(open(f)) for f in sys.argv[1:3])
print("### " + sys.argv[3])
print("| metric | direct (µs) | router (µs) | added (µs) |\n|---|---|---|---|")
for m in ("ttft", "itl"):
    for p in ("p50", "p99"):
        a, b = d["%s_%s_ms" % (p, m)] * 1000, r["%s_%s_ms" % (p, m)] * 1000
        print("| %s %s | %.0f | %.0f | %+.0f |" % (m.upper(), p, a, b, b - a))
print("\ncompleted: direct %d/%d, router %d/%d\n" % (d["completed"], d["num_prompts"], r["completed"], r["num_prompts"]))
PY
  xpyd_cluster_down
}
echo "## 1. Added latency: router vs the same kv-params P->D sequence done by the client (xpyd_bench --direct-prefill)"
echo
lat_pair "1a. one client, all on CPU 0, 1 ms ITL engine, 20 tokens" 0 $((NLAT / 2)) 1 20 1000
lat_pair "1b. 256 concurrent streams, router alone on CPU 1, 100 ms ITL engine, 20 tokens (CPU 0 runs sims and client)" 1 $NLAT 256 20 100000
fi

# ---- 2. single hop: router (--handoff none) vs nginx ----
if want 2; then
start_sim p --role prefill --prefill-us-per-token 0
start_sim d --role decode --decode-us-per-token 0
P=$(cat "$WORK/p.port"); D=$(cat "$WORK/d.port")
start_router r2 --handoff none -d 127.0.0.1:$D
R2=$(cat "$WORK/r2.port")
start_router r2pd -p 127.0.0.1:$P -d 127.0.0.1:$D
R2PD=$(cat "$WORK/r2pd.port")
start_nginx $D
start_floor hop $D; FLH=$FL FLHP=$FLP
start_floor pd $D $P; FLPD=$FL FLPDP=$FLP
HOP=(--num-prompts $NREQ --max-concurrency 64 --random-input-len 16 --random-output-len 16)
# the five relays one after the other, HOP_ROUNDS times, every other round in reverse order (ABBA): drift during
# the run favours none of them; CPU per request is compared within each round and the medians reported
HPID=("$NGW" "$(cat "$WORK/r2.pid")" "$(cat "$WORK/r2pd.pid")" "$FLHP" "$FLPDP")
HPORT=($NG $R2 $R2PD $FLH $FLPD)
: >"$WORK/hop_ticks"
for round in $(seq 1 $HOP_ROUNDS); do
  order="0 1 2 3 4"; [ $((round % 2)) = 0 ] && order="4 3 2 1 0"
  for i in $order; do
    t0=$(cpu_ticks ${HPID[$i]})
    bench "$WORK/hop_${i}_$round.json" --port ${HPORT[$i]} "${HOP[@]}"
    echo "$i $round $(( $(cpu_ticks ${HPID[$i]}) - t0 ))" >>"$WORK/hop_ticks"
  done
done
keep "$WORK/hop_0_1.json" cdf-hop-nginx.json
keep "$WORK/hop_1_1.json" cdf-hop-router.json
python3 - "$WORK" $HOP_ROUNDS "$(getconf CLK_TCK)" >"$WORK/hop.md" <<'PY'
import json, statistics as st, sys
work, rounds, hz = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ticks = {}
for line in open(work + "/hop_ticks"):
    i, rnd, t = map(int, line.split())
    ticks[i, rnd] = t
names = ("nginx 1.22 (proxy_buffering off)", "xpyd_router --handoff none",
         "xpyd_router P->D (kv-params: prefill, then decode)",
         "floor relay, single hop (bench/floor_relay.c: raw epoll, a TCP relay)",
         "floor relay, P->D (the same two exchanges, no JSON)")
res = {(i, r): json.load(open("%s/hop_%d_%d.json" % (work, i, r))) for i in range(5) for r in range(1, rounds + 1)}
cpu = {k: ticks[k] / hz / max(d["completed"], 1) * 1e6 for k, d in res.items()}
med = lambda xs: st.median(xs)
print("## 2. Single-hop relay of the same decode stream, concurrency 64, 16 tokens, one worker each on CPU 1, "
      "%d round%s (every other one in reverse order; medians)" % (rounds, "s" if rounds > 1 else ""))
print("| relay | requests/s | p99 E2E (ms) | p99 ITL (ms) | CPU µs / request | CPU µs / request, each round | completed |")
print("|---|---|---|---|---|---|---|")
for i, name in enumerate(names):
    ds = [res[i, r] for r in range(1, rounds + 1)]
    print("| %s | %.0f | %.2f | %.2f | %.0f | %s | %d/%d |" % (
        name, med([d["request_throughput"] for d in ds]), med([d["p99_e2el_ms"] for d in ds]),
        med([d["p99_itl_ms"] for d in ds]), med([cpu[i, r] for r in range(1, rounds + 1)]),
        " / ".join("%.0f" % cpu[i, r] for r in range(1, rounds + 1)),
        sum(d["completed"] for d in ds), sum(d["num_prompts"] for d in ds)))
def ratio(i):
    rs = [cpu[i, r] / cpu[0, r] for r in range(1, rounds + 1)]
    return "%s (median %.2f)" % (" ".join("%.2f" % x for x in rs), med(rs))
print("\nCPU per request vs nginx's single hop in the same round: router single hop %s, goal <= 0.9; "
      "router P->D %s, goal <= 1.2" % (ratio(1), ratio(2)))
print("The floor relay (next to no user-space work: what the kernel charges any relay for this traffic) vs nginx's "
      "single hop: single hop %s, P->D %s\n" % (ratio(3), ratio(4)))
PY
cat "$WORK/hop.md"
keep_cpu "nginx, one hop, 16 tokens" "$(awk -F'|' '/^\| nginx/ {gsub(/ /,"",$6); print $6}' "$WORK/hop.md")"
keep_cpu "router, one hop, 16 tokens" "$(awk -F'|' '/^\| xpyd_router --handoff none/ {gsub(/ /,"",$6); print $6}' "$WORK/hop.md")"
xpyd_cluster_down
fi

# ---- 3. router throughput on one core, metrics on vs off ----
if want 3; then
start_sim p --role prefill --prefill-us-per-token 0
start_sim d --role decode --decode-us-per-token 0
P=$(cat "$WORK/p.port"); D=$(cat "$WORK/d.port")
echo "## 3. Router throughput, one thread pinned to CPU 1 (zero-delay sims); metrics on/off alternated twice"
echo "| run | requests/s | streamed tokens/s | router CPU s / 1,000 req | completed |"
echo "|---|---|---|---|---|"
for metrics in on off on off; do
  start_router r3$metrics -p 127.0.0.1:$P -d 127.0.0.1:$D --metrics $metrics
  R3=$(cat "$WORK/r3$metrics.port"); RPID=$(cat "$WORK/r3$metrics.pid")
  for shape in short long; do
    if [ $shape = short ]; then A=(--num-prompts $NREQ --max-concurrency 64 --random-input-len 16 --random-output-len 2)
    else A=(--num-prompts $NLONG --max-concurrency 64 --random-input-len 16 --random-output-len 2000); fi
    t0=$(cpu_ticks $RPID)
    bench "$WORK/tp_${metrics}_$shape.json" --port $R3 "${A[@]}"
    t1=$(cpu_ticks $RPID)
    python3 - "$WORK/tp_${metrics}_$shape.json" $((t1 - t0)) "$(getconf CLK_TCK)" "$shape, metrics $metrics" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); ticks, hz, name = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
cpu = ticks / hz
print("| %s | %.0f | %.0f | %.3f | %d/%d |" % (name, d["request_throughput"], d["output_throughput"],
      cpu / max(d["completed"], 1) * 1000, d["completed"], d["num_prompts"]))
PY
    if [ $shape = short ] && [ $metrics = on ] && [ ! -e "$WORK/kept_pd" ]; then
      touch "$WORK/kept_pd"
      keep_cpu "router, P+D, 2 tokens" "$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('%.0f' % ($((t1 - t0)) / $(getconf CLK_TCK) / max(d['completed'], 1) * 1e6))" "$WORK/tp_${metrics}_$shape.json")"
    fi
  done
  kill "$RPID"; wait "$RPID" 2>/dev/null || true
done
echo
xpyd_cluster_down
fi

# ---- 4. memory per open stream ----
if want 4; then
start_sim p --role prefill --prefill-us-per-token 0
start_sim d --role decode --decode-us-per-token 10000000
P=$(cat "$WORK/p.port"); D=$(cat "$WORK/d.port")
start_router r4 -p 127.0.0.1:$P -d 127.0.0.1:$D
R4=$(cat "$WORK/r4.port"); RPID=$(cat "$WORK/r4.pid")
rss() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
before=$(rss $RPID)
# clients arrive at 2,000/s (a burst of thousands of SYNs would only measure the accept backlog)
taskset -c 0 $B/xpyd_bench --port $R4 --num-prompts $NMEM --max-concurrency $NMEM --random-input-len 16 \
  --random-output-len 2 --request-rate 2000 --ignore-eos --disable-tqdm --timeout-ms 600000 >/dev/null 2>&1 &
BPID=$!
for _ in $(seq 1 600); do  # until every stream is open at the router (bounded: 60 s)
  n=$(curl -fs "http://127.0.0.1:$R4/status" | python3 -c 'import json,sys; print(json.load(sys.stdin)["active_requests"])')
  [ "$n" -ge "$NMEM" ] && break
  sleep 0.1
done
during=$(rss $RPID)
kill $BPID; wait $BPID 2>/dev/null || true
echo "## 4. Memory: router RSS with $n open streams (decode answering slowly)"
echo "| RSS idle (KiB) | RSS with streams (KiB) | per stream (KiB) |"
echo "|---|---|---|"
python3 -c "import sys; b,d,n=map(int,sys.argv[1:4]); print('| %d | %d | %.1f |' % (b, d, (d-b)/max(n,1)))" "$before" "$during" "$n"
for _ in $(seq 1 100); do  # the clients went away: the router must let go of everything
  [ "$(curl -fs "http://127.0.0.1:$R4/status" | python3 -c 'import json,sys; print(json.load(sys.stdin)["active_requests"])')" = 0 ] && break
  sleep 0.1
done
echo
echo "after the clients disconnected: $(curl -fs "http://127.0.0.1:$R4/status" | python3 -c 'import json,sys; s=json.load(sys.stdin); print("active_requests=%d decode_inflight=%d" % (s["active_requests"], s["pools"]["decode"]["inflight"]))')"
fi

# ---- 5. syscalls per relayed request ----
# strace slows whatever it traces, so this is its own short run: counts, not times.
if want 5; then
if ! command -v strace >/dev/null; then echo "## 5. skipped: strace is not installed (scripts/deps.sh strace)"; else
start_sim p --role prefill --prefill-us-per-token 0
start_sim d --role decode --decode-us-per-token 0
P=$(cat "$WORK/p.port"); D=$(cat "$WORK/d.port")
start_router r5 --handoff none -d 127.0.0.1:$D
start_router r5pd -p 127.0.0.1:$P -d 127.0.0.1:$D
start_nginx $D
SYS=(--num-prompts $NSYS --max-concurrency 64 --random-input-len 16 --random-output-len 16)
echo "## 5. Syscalls per relayed request (strace -c -f, $NSYS requests, concurrency 64, 16 tokens)"
echo "| proxy | syscalls / request | the most frequent (per request) | completed |"
echo "|---|---|---|---|"
for row in "nginx 1.22:${NGW%% *}:$NG" "xpyd_router --handoff none:$(cat "$WORK/r5.pid"):$(cat "$WORK/r5.port")" \
           "xpyd_router P->D:$(cat "$WORK/r5pd.pid"):$(cat "$WORK/r5pd.port")"; do
  IFS=: read -r name pid port <<<"$row"
  bench "$WORK/sys_warm.json" --port "$port" --num-prompts 200 --max-concurrency 64 --random-input-len 16 --random-output-len 16
  strace -c -f -p "$pid" -o "$WORK/strace.txt" 2>/dev/null &
  SPID=$!
  bench_wait_traced "$pid"
  bench "$WORK/sys.json" --port "$port" "${SYS[@]}"
  kill -INT $SPID; wait $SPID 2>/dev/null || true
  IFS='|' read -r per top <<<"$(bench_syscalls_per "$WORK/strace.txt" "$(j "$WORK/sys.json" completed)" 1)"
  echo "| $name | $per | $top | $(j "$WORK/sys.json" completed)/$(j "$WORK/sys.json" num_prompts) |"
done
echo
xpyd_cluster_down
fi
fi

# ---- 6. streamed tokens per router CPU-second, tokens spaced by the engine ----
# The same spaced stream relayed by nginx (single hop) and by the router single hop, as the baseline of the
# same run: what one relay write per token costs on this machine whoever relays it.
if want 6; then
start_sim p --role prefill --prefill-us-per-token 0
start_sim d --role decode --decode-us-per-token 1000
P=$(cat "$WORK/p.port"); D=$(cat "$WORK/d.port")
start_router r6 -p 127.0.0.1:$P -d 127.0.0.1:$D
R6=$(cat "$WORK/r6.port"); RPID=$(cat "$WORK/r6.pid")
start_router r6h --handoff none -d 127.0.0.1:$D
start_nginx $D
start_floor hop $D
SP=(--num-prompts $NSPACED --max-concurrency 256 --random-input-len 16 --random-output-len 200)
echo "## 6. Streamed tokens per relay CPU-second: 1 ms ITL engine, 256 streams, 200 tokens each, the relay alone on CPU 1"
echo "| relay | streamed tokens | relay CPU (s) | tokens per relay CPU-second | tokens/s | ITL p50 / p99 (ms) | completed |"
echo "|---|---|---|---|---|---|---|"
for row in "nginx 1.22 single hop:${NGW%% *}:$NG" "xpyd_router --handoff none:$(cat "$WORK/r6h.pid"):$(cat "$WORK/r6h.port")" \
           "xpyd_router P->D (kv-params):$RPID:$R6" "floor relay single hop (bench/floor_relay.c):$FLP:$FL"; do
  IFS=: read -r label pid port <<<"$row"
  t0=$(cpu_ticks $pid)
  bench "$WORK/spaced.json" --port $port "${SP[@]}"
  t1=$(cpu_ticks $pid)
  python3 - "$WORK/spaced.json" $((t1 - t0)) "$(getconf CLK_TCK)" "$label" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); cpu = int(sys.argv[2]) / int(sys.argv[3])
print("| %s | %d | %.2f | %.0f | %.0f | %.2f / %.2f | %d/%d |" % (sys.argv[4], d["total_output_tokens"], cpu,
      d["total_output_tokens"] / max(cpu, 1e-9), d["output_throughput"], d["p50_itl_ms"], d["p99_itl_ms"],
      d["completed"], d["num_prompts"]))
PY
done
if command -v strace >/dev/null; then
  echo
  echo "syscalls per streamed token (strace -c -f, 256 streams x 200 tokens):"
  echo
  for row in "nginx 1.22 single hop:${NGW%% *}:$NG" "xpyd_router P->D (kv-params):$RPID:$R6"; do
    IFS=: read -r label pid port <<<"$row"
    strace -c -f -p "$pid" -o "$WORK/strace6.txt" 2>/dev/null &
    SPID=$!
    bench_wait_traced "$pid"
    bench "$WORK/spaced_s.json" --port $port --num-prompts 256 --max-concurrency 256 --random-input-len 16 --random-output-len 200
    kill -INT $SPID; wait $SPID 2>/dev/null || true
    IFS='|' read -r per top <<<"$(bench_syscalls_per "$WORK/strace6.txt" "$(j "$WORK/spaced_s.json" total_output_tokens)" 2)"
    echo "- $label: $per ($top)"
  done
  echo
fi
xpyd_cluster_down
fi
