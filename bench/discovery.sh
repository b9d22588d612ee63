#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/discovery.sh - scale-out on etcd, measured in one run on this machine (a real etcd on loopback):
#   1. propagation: an engine registering (xpyd_sim --register) -> every router routing to it (p50/p99 over
#      K engines), and an engine SIGKILLed -> no router choosing it (lease TTL 2 s, health checks every 1 s);
#   2. etcd down for OUTAGE seconds under steady load: failed requests (should be 0);
#   3. router replicas sharing load: the skewed workload of bench/balancer.sh, clients split over two routers,
#      with load sync vs without vs one router taking all of it: decode load max/mean, TTFT p99;
#   4. cost: etcd writes per router per second, router CPU with discovery and sync vs without (idle and
#      under the load of 3).
#   bench/discovery.sh [K=20] [OUTAGE=30] [prompts=600] [rate=30]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
K=${1:-20} OUTAGE=${2:-30} N=${3:-600} RATE=${4:-30}
KVCAP=${BAL_KV_CAPACITY:-12000}
if [ "${XPYD_SKIP_BUILD:-0}" != 1 ]; then ./scripts/deps.sh; ./scripts/build.sh >/dev/null; fi
B=${XPYD_BUILD_DIR:-build}/bin
WORK=$(mktemp -d /tmp/xpyd-discovery.XXXXXX)
PIDS=()
ETCD_PID=
stop_etcd() { [ -z "$ETCD_PID" ] || { kill -9 "$ETCD_PID" 2>/dev/null || true; wait "$ETCD_PID" 2>/dev/null || true; ETCD_PID=; }; }
trap 'xpyd_cluster_down; stop_etcd; rm -rf "$WORK"' EXIT INT TERM
EC=$(xpyd_free_port) EP=$(xpyd_free_port)
start_etcd() {
  etcd --name b0 --data-dir "$WORK/etcd" --listen-client-urls "http://127.0.0.1:$EC" \
    --advertise-client-urls "http://127.0.0.1:$EC" --listen-peer-urls "http://127.0.0.1:$EP" \
    --initial-advertise-peer-urls "http://127.0.0.1:$EP" --initial-cluster "b0=http://127.0.0.1:$EP" \
    --log-level warn --logger zap >>"$WORK/etcd.log" 2>&1 &
  ETCD_PID=$!
  xpyd_wait_http "http://127.0.0.1:$EC/health" 30
}
URL="etcd://127.0.0.1:$EC/bench"
start_router() { # name args...
  local n=$1; shift
  rm -f "$WORK/$n.port"
  $B/xpyd_router --port 0 --port-file "$WORK/$n.port" --log-level info --threads 1 --router-id "$n" "$@" \
    >"$WORK/$n.log" 2>&1 &
  PIDS+=($!)
  echo $! >"$WORK/$n.pid"
  xpyd_wait_file "$WORK/$n.port" 10
  xpyd_wait_http "http://127.0.0.1:$(cat "$WORK/$n.port")/metrics" 10
}
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
echo "# etcd discovery — $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs, $(etcd --version | head -1)"
echo
start_etcd

# ---- 1. propagation ----
start_router ra --discovery "$URL" --handoff none --health-interval-ms 1000 --health-fall 1
start_router rb --discovery "$URL" --handoff none --health-interval-ms 1000 --health-fall 1
SIMS=()
for ((i = 0; i < K; i++)); do
  rm -f "$WORK/s$i.port"
  $B/xpyd_sim --role decode --port 0 --port-file "$WORK/s$i.port" --log-level info --register "$URL" \
    --register-ttl-s 2 >"$WORK/s$i.log" 2>&1 &
  SIMS+=($!)
  xpyd_wait_file "$WORK/s$i.port" 10
  # wait until both routers list it
  for r in ra rb; do
    for _ in $(seq 200); do grep -q "event=instance_added role=decode instance=127.0.0.1:$(cat "$WORK/s$i.port")" "$WORK/$r.log" && break; sleep 0.02; done
  done
done
KILLS=$((K / 2))
for ((i = 0; i < KILLS; i++)); do
  date +%s.%N >"$WORK/kill$i.t"
  kill -9 "${SIMS[$i]}"
  for r in ra rb; do
    for _ in $(seq 500); do
      grep -qE "event=(instance_removed role=decode instance=127.0.0.1:$(cat "$WORK/s$i.port")|health_transition endpoint=127.0.0.1:$(cat "$WORK/s$i.port") state=down)" "$WORK/$r.log" && break
      sleep 0.02
    done
  done
done
for ((i = KILLS; i < K; i++)); do kill "${SIMS[$i]}" 2>/dev/null || true; wait "${SIMS[$i]}" 2>/dev/null || true; done
python3 - "$WORK" "$K" "$KILLS" <<'PY'
import re, sys, datetime, os
w, k, kills = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def ts(line):
    m = re.search(r"ts=(\S+)Z", line)
    return datetime.datetime.fromisoformat(m.group(1)).replace(tzinfo=datetime.timezone.utc).timestamp()
logs = {r: open(os.path.join(w, r + ".log")).read().splitlines() for r in ("ra", "rb")}
def first(r, pat):
    for l in logs[r]:
        if re.search(pat, l):
            return ts(l)
    return None
add, dead = [], []
for i in range(k):
    port = open(os.path.join(w, "s%d.port" % i)).read().split()[0]
    reg = [ts(l) for l in open(os.path.join(w, "s%d.log" % i)) if "event=registered" in l]
    t = [first(r, r"event=instance_added role=decode instance=127.0.0.1:%s\b" % port) for r in logs]
    if reg and all(t):
        add.append(max(t) - reg[0])
    if i < kills:
        t0 = float(open(os.path.join(w, "kill%d.t" % i)).read())
        gone = []
        for r in logs:
            cands = [ts(l) for l in logs[r] if re.search(r"127\.0\.0\.1:%s\b" % port, l) and
                     re.search(r"event=(instance_removed|health_transition .*state=down)", l)]
            gone.append(min(cands) if cands else None)
        if all(gone):
            dead.append(max(gone) - t0)
pct = lambda a, p: sorted(a)[min(len(a) - 1, int(round(p / 100 * (len(a) - 1))))] if a else float("nan")
print("## 1. Propagation (2 routers, %d engines registered one by one, %d of them SIGKILLed)" % (k, kills))
print()
print("| event | n | p50 (ms) | p99 (ms) | max (ms) | bound |")
print("|---|---|---|---|---|---|")
print("| registered -> every router routes to it | %d | %.1f | %.1f | %.1f | p99 <= 1000 |" % (
    len(add), pct(add, 50) * 1e3, pct(add, 99) * 1e3, max(add) * 1e3))
print("| SIGKILL -> no router chooses it | %d | %.0f | %.0f | %.0f | <= lease TTL 2000 + health interval 1000 |" % (
    len(dead), pct(dead, 50) * 1e3, pct(dead, 99) * 1e3, max(dead) * 1e3))
print()
PY
xpyd_cluster_down

# ---- 2. etcd down under steady load ----
rm -f "$WORK"/d*.port
$B/xpyd_sim --role decode --port 0 --port-file "$WORK/d0.port" --log-level warn --register "$URL" \
  --register-ttl-s 5 --decode-us-per-token 1000 >"$WORK/d0.log" 2>&1 &
PIDS+=($!)
xpyd_wait_file "$WORK/d0.port" 10
start_router r2 --discovery "$URL" --handoff none
R2=$(cat "$WORK/r2.port")
for _ in $(seq 200); do curl -fs "http://127.0.0.1:$R2/health" >/dev/null && break; sleep 0.05; done
LOADN=$(( (OUTAGE + 15) * 40 ))
$B/xpyd_bench --port "$R2" --num-prompts "$LOADN" --request-rate 40 --random-input-len 64 --random-output-len 16 \
  --ignore-eos --disable-tqdm --save-result --result-filename "$WORK/outage.json" >/dev/null 2>&1 &
BP=$!
sleep 5
stop_etcd
date +%s >"$WORK/down.t"
DOWN_AT=$(cat "$WORK/down.t")
sleep "$OUTAGE"
start_etcd
UP_S=$(( $(date +%s) - DOWN_AT ))
wait $BP || true
for _ in $(seq 100); do [ "$(curl -fs "http://127.0.0.1:$R2/metrics" | awk '/^xpyd_discovery_up /{print $2}')" = 1 ] && break; sleep 0.1; done
UPNOW=$(curl -fs "http://127.0.0.1:$R2/metrics" | awk '/^xpyd_discovery_up /{print $2}')
python3 - "$WORK/outage.json" "$UP_S" "$UPNOW" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
failed = r["num_prompts"] - r["completed"]
print("## 2. etcd down for %s s under steady load (40 req/s through one router, one registered decode)" % sys.argv[2])
print()
print("| requests | completed | failed | discovery up again afterwards |")
print("|---|---|---|---|")
print("| %d | %d | %d | %s |" % (r["num_prompts"], r["completed"], failed, "yes" if sys.argv[3] == "1" else "no"))
print()
PY
xpyd_cluster_down

# ---- 3. two routers sharing load ----
run_share() { # label: one | nosync | sync
  local label=$1
  SIM_PREFILL_US=20 SIM_DECODE_US=5000 SIM_MAX_BATCH=256 \
    SIM_DECODE_ARGS="--kv-capacity-tokens $KVCAP --decode-ns-per-kv-token 1000 --max-model-len 32768" \
    xpyd_cluster_up 1 4 kv-params --threads 1 --discovery "$URL" --router-id "ra-$label" \
      --load-sync-ms "$([ "$label" = sync ] && echo 100 || echo 0)"
  local RA=$RP RB=$RP pargs=("127.0.0.1:${SIM_PORTS_P[0]}") dargs=()
  for p in "${SIM_PORTS_D[@]}"; do dargs+=("127.0.0.1:$p"); done
  if [ "$label" != one ]; then
    start_router "rb-$label" --handoff kv-params -p "${pargs[@]}" -d "${dargs[@]}" --discovery "$URL" \
      --load-sync-ms "$([ "$label" = sync ] && echo 100 || echo 0)"
    RB=$(cat "$WORK/rb-$label.port")
  fi
  local RPID=$(pgrep -f "router-id ra-$label" | head -1)
  local t0=$(ticks "$RPID")
  for who in a b; do
    local port=$RA seed=7
    [ $who = b ] && port=$RB seed=8
    $B/xpyd_bench --port "$port" --num-prompts $((N / 2)) --request-rate $((RATE / 2)) --seed $seed \
      --length-dist pareto --random-input-len 512 --random-output-len 128 --ignore-eos --disable-tqdm \
      --save-result --result-filename "$WORK/share-$label-$who.json" >/dev/null 2>&1 &
    echo $! >"$WORK/bench-$who.pid"
  done
  wait "$(cat "$WORK/bench-a.pid")" "$(cat "$WORK/bench-b.pid")" || true
  local cpu=$(( $(ticks "$RPID") - t0 ))
  local writes=$(curl -fs "http://127.0.0.1:$RA/metrics" | awk '/^xpyd_etcd_writes_total /{print $2}')
  local toks=()
  for p in "${SIM_PORTS_D[@]}"; do
    toks+=("$(curl -fs "http://127.0.0.1:$p/metrics" | awk '/^vllm:generation_tokens_total/ {print $2}')")
  done
  echo "$label $cpu $writes ${toks[*]}" >>"$WORK/share.txt"
  xpyd_cluster_down
}
: >"$WORK/share.txt"
for label in one nosync sync; do run_share $label; done
python3 - "$WORK" "$(getconf CLK_TCK)" "$N" "$RATE" <<'PY'
import json, sys, os
w, hz, n, rate = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
names = {"one": "one router (both clients)", "nosync": "two routers, no load sync", "sync": "two routers, load sync 100 ms"}
pct = lambda a, p: sorted(a)[min(len(a) - 1, int(round(p / 100 * (len(a) - 1))))]
print("## 3. Router replicas sharing load: %d prompts at %d req/s (Pareto lengths), clients split in two halves" % (n, rate))
print("1 prefill, 4 KV-bound decode sims (as bench/balancer.sh); each half sends to its router (both halves to the same one in the first row)")
print()
print("| setup | TTFT p50 (ms) | TTFT p99 (ms) | completed | tokens per decode rank | max/mean |")
print("|---|---|---|---|---|---|")
rows = {}
for line in open(os.path.join(w, "share.txt")):
    f = line.split()
    label, cpu, writes, toks = f[0], int(f[1]), float(f[2] or 0), [float(x) for x in f[3:]]
    res = [json.load(open(os.path.join(w, "share-%s-%s.json" % (label, x)))) for x in "ab"]
    ttft = [t for r in res for t, e in zip(r["ttfts"], r["errors"]) if not e]
    mean = sum(toks) / len(toks)
    rows[label] = max(toks) / mean
    print("| %s | %.1f | %.1f | %d/%d | %s | %.3f |" % (names[label], pct(ttft, 50) * 1e3, pct(ttft, 99) * 1e3,
          sum(r["completed"] for r in res), sum(r["num_prompts"] for r in res),
          " / ".join("%d" % t for t in toks), rows[label]))
print()
print("load max/mean, two routers with sync / one router: %.3f (acceptance: within 10 %%, <= 1.10); without sync: %.3f"
      % (rows["sync"] / rows["one"], rows["nosync"] / rows["one"]))
print()
PY

# ---- 4. cost ----
start_router c0 --handoff none -d 127.0.0.1:9 --health-interval-ms 0
start_router c1 --handoff none -d 127.0.0.1:9 --health-interval-ms 0 --discovery "$URL" --load-sync-ms 100
sleep 1
P0=$(cat "$WORK/c0.pid") P1=$(cat "$WORK/c1.pid")
a0=$(ticks "$P0") a1=$(ticks "$P1") w0=$(curl -fs "http://127.0.0.1:$(cat "$WORK/c1.port")/metrics" | awk '/^xpyd_etcd_writes_total /{print $2}')
sleep 20
b0=$(ticks "$P0") b1=$(ticks "$P1") w1=$(curl -fs "http://127.0.0.1:$(cat "$WORK/c1.port")/metrics" | awk '/^xpyd_etcd_writes_total /{print $2}')
python3 - "$a0" "$b0" "$a1" "$b1" "$w0" "$w1" "$(getconf CLK_TCK)" "$WORK" <<'PY'
import sys, os
a0, b0, a1, b1, w0, w1, hz, w = sys.argv[1:9]
hz = int(hz)
print("## 4. Cost")
print()
print("Idle router for 20 s: CPU without discovery %.0f ms, with discovery and load sync (100 ms) %.0f ms; etcd writes "
      "%.2f per second (a put only when the load changed: none while idle; lease keep-alives every TTL/3 are not writes)."
      % ((int(b0) - int(a0)) * 1000 / hz, (int(b1) - int(a1)) * 1000 / hz, (float(w1) - float(w0)) / 20))
rows = [l.split() for l in open(os.path.join(w, "share.txt"))]
import json
for f in rows:
    dur = json.load(open(os.path.join(w, "share-%s-a.json" % f[0])))["duration"]
    print("Under section 3's load, router A (%s): CPU %.2f s over a %.0f s run, %s etcd writes (%.1f per second)."
          % (f[0], int(f[1]) / hz, dur, f[2], float(f[2] or 0) / dur))
PY
