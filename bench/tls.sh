#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/tls.sh - what TLS costs the router, against nginx terminating TLS with the same certificate, in one
# run on this machine. The server under test (router with one thread, or nginx with one worker) is pinned to
# CPU 1 alone; the zero-delay decode sim and the load generator share CPU 0. Its CPU time comes from
# /proc/<pid>/stat around each run.
#   1. keep-alive: N streamed 16-token completions, 64 at once over keep-alive connections (xpyd_bench, TLS
#      sessions resumed): CPU per request for router plain, router TLS, nginx plain, nginx TLS, in ROUNDS
#      alternated rounds (the four one after the other, in reverse order every other round); the medians are
#      compared, and the router/nginx TLS ratio within each round;
#   2. handshakes: `openssl s_time -new` (a full handshake per connection, TLS 1.3, ECDSA P-256) for SECS
#      seconds: handshakes per second and CPU per handshake, router vs nginx.
#   3. at once: router TLS and nginx TLS, both on CPU 1, each loaded by its own xpyd_bench (N requests, 32 at
#      once) at the same time, in ROUNDS rounds: CPU per request of each and their ratio per round. Sequential
#      rounds (1.) compare minutes apart, and this machine's speed moves by several per cent in that time; run
#      together, both see the same machine, and the ratio varies by about half a per cent between rounds.
#   bench/tls.sh [requests=20000] [seconds=10] [rounds=3]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
. bench/lib.sh
N=${1:-20000} SECS=${2:-10} ROUNDS=${3:-3}
if [ "${XPYD_SKIP_BUILD:-0}" != 1 ]; then ./scripts/deps.sh nginx-light openssl; ./scripts/build.sh >/dev/null; fi
B=${XPYD_BUILD_DIR:-build}/bin
WORK=$(mktemp -d /tmp/xpyd-tls.XXXXXX)
trap 'xpyd_cluster_down; rm -rf "$WORK"' EXIT INT TERM
bench_certs "$WORK"
HZ=$(getconf CLK_TCK)
j() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d[sys.argv[2]])" "$@"; }

rm -f "$WORK/d.port"
taskset -c 0 $B/xpyd_sim --role both --port 0 --port-file "$WORK/d.port" --decode-us-per-token 0 --log-level warn \
  --max-batch 100000 >"$WORK/d.log" 2>&1 &
PIDS+=($!)
xpyd_wait_file "$WORK/d.port" 10
D=$(cat "$WORK/d.port")
RP=$(xpyd_free_port) RS=$(xpyd_free_port) NP=$(xpyd_free_port) NS=$(xpyd_free_port)
taskset -c 1 $B/xpyd_router --port "$RP" --log-level error --threads 1 --handoff none -d 127.0.0.1:$D \
  >"$WORK/rp.log" 2>&1 &
ROUTER_PLAIN=$!
PIDS+=($!)
taskset -c 1 $B/xpyd_router --port "$RS" --log-level error --threads 1 --handoff none -d 127.0.0.1:$D \
  --tls-cert "$WORK/srv.pem" --tls-key "$WORK/srv.key" >"$WORK/rs.log" 2>&1 &
ROUTER_TLS=$!
PIDS+=($!)
bench_nginx_conf "$WORK/ng" "$D" "$NP" "$NS" "$WORK/srv.pem" "$WORK/srv.key"
taskset -c 1 nginx -c "$WORK/ng/nginx.conf" -p "$WORK/ng" &
PIDS+=($!)
xpyd_wait_http "http://127.0.0.1:$RP/health" 10
xpyd_wait_http "http://127.0.0.1:$NP/health" 10
for p in $RS $NS; do
  for _ in $(seq 100); do curl -fs --cacert "$WORK/ca.pem" "https://localhost:$p/health" >/dev/null && break; sleep 0.1; done
done
NGW=$(pgrep -P "$(cat "$WORK/ng/nginx.pid")" | tr '\n' ' ')

echo "# TLS cost — $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs, $(openssl version | cut -d' ' -f1-2), nginx $(nginx -v 2>&1 | cut -d/ -f2)"
echo
echo "## 1. keep-alive: $N streamed 16-token completions, 64 at once, $ROUNDS alternated rounds (medians)"
echo
echo "| server | requests/s | CPU µs per request (each round) | median CPU µs per request | p99 E2E (ms) |"
echo "|---|---|---|---|---|"
declare -A CPU RPS P99
run_ka() { # label url pids...
  local label=$1 url=$2; shift 2
  local t0 t1
  t0=$(bench_cpu_ticks "$@")
  taskset -c 0 $B/xpyd_bench --base-url "$url" --tls-ca "$WORK/ca.pem" --num-prompts "$N" --max-concurrency 64 \
    --random-input-len 16 --random-output-len 16 --ignore-eos --disable-tqdm --percentile-metrics e2el \
    --metric-percentiles 99 --save-result --result-filename "$WORK/ka.json" >/dev/null || true
  t1=$(bench_cpu_ticks "$@")
  CPU[$label]+="$(python3 -c "print(($t1 - $t0) / $HZ / $N * 1e6)") "
  RPS[$label]+="$(j "$WORK/ka.json" request_throughput) "
  P99[$label]+="$(j "$WORK/ka.json" p99_e2el_ms) "
}
# Odd rounds run the four in one order, even rounds in the reverse one (ABBA), so that a machine getting
# slower or faster during the run does not favour whichever server always comes last.
for i in $(seq "$ROUNDS"); do
  if [ $((i % 2)) = 1 ]; then ORDER="np nt rp rt"; else ORDER="rt rp nt np"; fi
  for k in $ORDER; do
    case $k in
      np) run_ka "nginx plain" "http://127.0.0.1:$NP" $NGW ;;
      nt) run_ka "nginx TLS" "https://localhost:$NS" $NGW ;;
      rp) run_ka "xpyd_router plain" "http://127.0.0.1:$RP" $ROUTER_PLAIN ;;
      rt) run_ka "xpyd_router TLS" "https://localhost:$RS" $ROUTER_TLS ;;
    esac
  done
done
declare -A MED
for label in "nginx plain" "nginx TLS" "xpyd_router plain" "xpyd_router TLS"; do
  MED[$label]=$(python3 -c "import statistics, sys; print(statistics.median(map(float, sys.argv[1:])))" ${CPU[$label]})
  python3 - "$label" "${MED[$label]}" "${CPU[$label]}" "${RPS[$label]}" "${P99[$label]}" <<'PY'
import statistics, sys
label, med, cpu, rps, p99 = sys.argv[1], float(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split(), sys.argv[5].split()
print("| %s | %.0f | %s | %.1f | %.2f |" % (label, statistics.median(map(float, rps)), " / ".join("%.1f" % float(c) for c in cpu),
      med, statistics.median(map(float, p99))))
PY
done
python3 - "${MED[xpyd_router TLS]}" "${MED[nginx TLS]}" "${MED[xpyd_router plain]}" "${MED[nginx plain]}" \
  "${CPU[xpyd_router TLS]}" "${CPU[nginx TLS]}" <<'PY'
import statistics, sys
rt, nt, rp, np_ = map(float, sys.argv[1:5])
print("\nrouter TLS / nginx TLS CPU per request (medians): %.2f (acceptance: <= 1); TLS adds %.1f µs per request to "
      "the router, %.1f µs to nginx; router plain / nginx plain: %.2f" % (rt / nt, rt - rp, nt - np_, rp / np_))
# the same ratio within each round (the two measured minutes apart at most), and the median of those
pairs = [float(a) / float(b) for a, b in zip(sys.argv[5].split(), sys.argv[6].split())]
print("router TLS / nginx TLS per round: %s; median %.2f, %d of %d rounds <= 1"
      % (" ".join("%.2f" % x for x in pairs), statistics.median(pairs), sum(x <= 1 for x in pairs), len(pairs)))
PY

echo
echo "## 2. full handshakes (openssl s_time -new, ${SECS}s)"
echo
echo "| server | handshakes/s | CPU µs per handshake |"
echo "|---|---|---|"
run_hs() { # label port pids...
  local label=$1 port=$2; shift 2
  local t0 t1 n
  t0=$(bench_cpu_ticks "$@")
  n=$(taskset -c 0 openssl s_time -connect "127.0.0.1:$port" -new -time "$SECS" -CAfile "$WORK/ca.pem" 2>/dev/null |
      awk '/connections in [0-9.]+ real seconds/ {print $1; exit}')
  t1=$(bench_cpu_ticks "$@")
  python3 -c "n=int('$n' or 0); print('| $label | %.0f | %.1f |' % (n / $SECS, ($t1 - $t0) / $HZ / max(n, 1) * 1e6))"
}
run_hs "nginx" $NS $NGW
run_hs "xpyd_router" $RS $ROUTER_TLS

echo
echo "## 3. at once: router TLS and nginx TLS on one CPU, each loaded by its own client at the same time ($N requests each, 32 at once)"
echo
echo "| round | router TLS CPU µs per request | nginx TLS CPU µs per request | router / nginx |"
echo "|---|---|---|---|"
RATIOS=""
for i in $(seq "$ROUNDS"); do
  read -r r n <<<"$(bench_at_once "$N" "$WORK/ca.pem" "https://localhost:$RS" "$ROUTER_TLS" "https://localhost:$NS" "$NGW")"
  ratio=$(python3 -c "print('%.3f' % ($r / $n))")
  RATIOS+="$ratio "
  echo "| $i | $r | $n | $ratio |"
done
echo
bench_ratios "router TLS / nginx TLS, run at once (acceptance: <= 1)" $RATIOS
