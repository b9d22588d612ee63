#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/cpu_ab.sh - CPU per request of two router builds, measured at the same time: each build's router (one
# thread) runs on CPU 1, both behind the same zero-delay decode sim, each loaded by its own xpyd_bench (N
# streamed 16-token completions, 32 at once, keep-alive; TLS with a generated certificate, or plain) started
# together, in ROUNDS rounds. Prints both CPU times per request and B/A per round, and the median ratio.
# Rounds run one after the other move by several per cent with this machine's speed; two builds run at once see
# the same machine, so a change of half a per cent shows (A against A: ratios 0.99-1.00).
# CPU_AB_PROMPT=ids: each request a prompt of 4,100 token ids instead (prefix-repetition, 48 prefixes of 4,000,
# as bench/kv_events.sh sends), placed with --decode-policy cache: reading the ids and hashing their blocks.
#   bench/cpu_ab.sh BUILD_DIR_A BUILD_DIR_B [requests=20000] [rounds=5] [tls|plain=tls]
#   e.g. git worktree add /tmp/base HEAD~1 && (cd /tmp/base && ./scripts/build.sh) && bench/cpu_ab.sh /tmp/base/build build
set -euo pipefail
[ $# -ge 2 ] || { sed -n 2,9p "$0"; exit 2; }
A=$(cd "$1" && pwd)/bin BB=$(cd "$2" && pwd)/bin
cd "$(dirname "$0")/.."
. scripts/lib.sh
. bench/lib.sh
N=${3:-20000} ROUNDS=${4:-5} MODE=${5:-tls}
B=$BB
WORK=$(mktemp -d /tmp/xpyd-cpuab.XXXXXX)
trap 'xpyd_cluster_down; rm -rf "$WORK"' EXIT INT TERM
bench_certs "$WORK"
taskset -c 0 $B/xpyd_sim --role both --port 0 --port-file "$WORK/d.port" --decode-us-per-token 0 --log-level warn \
  --max-batch 100000 >"$WORK/d.log" 2>&1 &
PIDS+=($!)
xpyd_wait_file "$WORK/d.port" 10
D=$(cat "$WORK/d.port")
POLICY=()
if [ "${CPU_AB_PROMPT:-}" = ids ]; then
  POLICY=(--decode-policy cache)
  export BENCH_AT_ONCE_WORKLOAD="--tokenizer-free --dataset-name prefix-repetition --prefix-repetition-prefix-len 4000
    --prefix-repetition-suffix-len 100 --prefix-repetition-num-prefixes 48 --prefix-repetition-output-len 16"
fi
TLSARGS=()
[ "$MODE" = tls ] && TLSARGS=(--tls-cert "$WORK/srv.pem" --tls-key "$WORK/srv.key")
start() { # bin-dir log -> "port pid"
  local port
  port=$(xpyd_free_port)
  taskset -c 1 "$1/xpyd_router" --port "$port" --log-level error --threads 1 --handoff none -d "127.0.0.1:$D" \
    "${TLSARGS[@]}" "${POLICY[@]}" >"$2" 2>&1 &
  echo "$port $!"
}
read -r PA RA <<<"$(start "$A" "$WORK/a.log")"
PIDS+=($RA)
read -r PB RB <<<"$(start "$BB" "$WORK/b.log")"
PIDS+=($RB)
url() { if [ "$MODE" = tls ]; then echo "https://localhost:$1"; else echo "http://127.0.0.1:$1"; fi; }
for p in $PA $PB; do
  ok=0
  for _ in $(seq 100); do curl -fs --cacert "$WORK/ca.pem" "$(url $p)/health" >/dev/null && { ok=1; break; }; sleep 0.1; done
  [ $ok = 1 ] || { echo "a router did not come up" >&2; cat "$WORK"/a.log "$WORK"/b.log >&2; exit 1; }
done
echo "# CPU per request, A = $1, B = $2 ($MODE, $N streamed 16-token requests each${CPU_AB_PROMPT:+, prompts of $CPU_AB_PROMPT}, both at once) — $(date -u +%Y-%m-%dT%H:%MZ)"
echo
echo "| round | A CPU µs per request | B CPU µs per request | B / A |"
echo "|---|---|---|---|"
RATIOS=""
for i in $(seq 0 "$ROUNDS"); do # round 0 warms both up and is not reported
  read -r a b <<<"$(bench_at_once "$N" "$WORK/ca.pem" "$(url $PA)" "$RA" "$(url $PB)" "$RB")"
  [ "$i" = 0 ] && continue
  ratio=$(python3 -c "print('%.3f' % ($b / $a))")
  RATIOS+="$ratio "
  echo "| $i | $a | $b | $ratio |"
done
echo
bench_ratios "B / A" $RATIOS
