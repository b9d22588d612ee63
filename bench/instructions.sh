#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/instructions.sh - user-space instructions per request, router against nginx, counted by callgrind
# (valgrind): a count, not a timing, so it does not move with the machine's load the way CPU time does, and a
# change to the request path shows as a difference of a few per cent that bench/tls.sh's rounds cannot
# resolve. Kernel work (most of a proxy's CPU) is not counted.
#   Each server runs alone under callgrind (router with one thread, nginx single-process), with the zero-delay
#   decode sim; xpyd_bench sends N streamed 16-token completions, 16 at once over keep-alive connections, once
#   to warm up (counters then zeroed) and once counted. Printed per request: all instructions, and without the
#   TLS handshakes (SSL_do_handshake: the measured run opens its 16 connections anew).
#   Under valgrind the server runs some 50 times slower, so the engine's tokens wait in the socket and each
#   stream is read and written in a few pieces: per-token write costs (a TLS record per token at full speed) are
#   under-counted; the request's own work, the relay's per-event work and the parsing are counted in full.
#   With PACE (µs per token, e.g. 8000) the decode sim paces its tokens so that even under valgrind each one
#   arrives, is relayed and is written on its own (a TLS record per token, as at full speed); a
#   request then takes 16 x PACE µs and the run N x PACE µs in all, so keep N small (500 x 8000: 4 s).
#   bench/instructions.sh [requests=1000] [tls|plain=tls] [pace=0]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
. bench/lib.sh
N=${1:-1000} MODE=${2:-tls} PACE=${3:-0}
if [ "${XPYD_SKIP_BUILD:-0}" != 1 ]; then ./scripts/deps.sh valgrind nginx-light openssl; ./scripts/build.sh >/dev/null; fi
B=${XPYD_BUILD_DIR:-build}/bin
WORK=$(mktemp -d /tmp/xpyd-instr.XXXXXX)
trap 'xpyd_cluster_down; rm -rf "$WORK"' EXIT INT TERM
bench_certs "$WORK"

rm -f "$WORK/d.port"
$B/xpyd_sim --role both --port 0 --port-file "$WORK/d.port" --decode-us-per-token "$PACE" --log-level warn \
  --max-batch 100000 >"$WORK/d.log" 2>&1 &
PIDS+=($!)
xpyd_wait_file "$WORK/d.port" 10
D=$(cat "$WORK/d.port")

# count LABEL START-FUNCTION URL COMMAND...: the server under callgrind, collecting inside its event loop only
count() {
  local label=$1 loop=$2 url=$3; shift 3
  rm -f "$WORK"/cg.out*
  valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.out" --toggle-collect="$loop" "$@" >"$WORK/srv.log" 2>&1 &
  local pid=$!
  PIDS+=($pid)
  local ok=0
  for _ in $(seq 300); do
    curl -fsk "$url/v1/models" >/dev/null 2>&1 && { ok=1; break; }
    sleep 0.2
  done
  [ $ok = 1 ] || { echo "$label did not come up under valgrind" >&2; tail "$WORK/srv.log" >&2; return 1; }
  local args=(--base-url "$url" --tls-ca "$WORK/ca.pem" --max-concurrency 16 --random-input-len 16
              --random-output-len 16 --ignore-eos --disable-tqdm)
  $B/xpyd_bench "${args[@]}" --num-prompts 200 >/dev/null
  callgrind_control -z "$pid" >/dev/null 2>&1
  $B/xpyd_bench "${args[@]}" --num-prompts "$N" >/dev/null
  callgrind_control -d "$pid" >/dev/null 2>&1
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  # the dump asked for holds the counted run (the file written at exit holds what came after it: nothing)
  local f total hs
  f=$(ls -S "$WORK"/cg.out* | head -1)
  total=$(callgrind_annotate "$f" | awk '/PROGRAM TOTALS/ && !t {gsub(",", "", $1); t = $1} END {print t}')
  hs=$(callgrind_annotate --inclusive=yes "$f" | awk '/:SSL_do_handshake / && !h {gsub(",", "", $1); h = $1} END {print h + 0}')
  python3 -c "n=$N; t=$total; h=${hs:-0}; print('| %s | %.1f | %.1f |' % ('$label', t / n / 1e3, (t - h) / n / 1e3))"
}

P=$(xpyd_free_port)
if [ "$MODE" = tls ]; then URL=https://localhost:$P; else URL=http://127.0.0.1:$P; fi
echo "# User-space instructions per request ($MODE) — $(date -u +%Y-%m-%dT%H:%MZ), $(valgrind --version), nginx $(nginx -v 2>&1 | cut -d/ -f2)"
echo
echo "$N streamed 16-token completions, 16 at once, keep-alive, tokens paced $PACE µs apart; thousands of instructions per request"
echo
echo "| server | all | without TLS handshakes |"
echo "|---|---|---|"
TLSARGS=()
[ "$MODE" = tls ] && TLSARGS=(--tls-cert "$WORK/srv.pem" --tls-key "$WORK/srv.key")
count xpyd_router event_base_loop "$URL" $B/xpyd_router --port "$P" --log-level error --threads 1 --handoff none \
  -d 127.0.0.1:$D "${TLSARGS[@]}"
P=$(xpyd_free_port)
if [ "$MODE" = tls ]; then
  URL=https://localhost:$P
  bench_nginx_conf "$WORK/ng" "$D" "$(xpyd_free_port)" "$P" "$WORK/srv.pem" "$WORK/srv.key"
else
  URL=http://127.0.0.1:$P
  bench_nginx_conf "$WORK/ng" "$D" "$P"
fi
sed -i 's/^daemon off;/daemon off;\nmaster_process off;/' "$WORK/ng/nginx.conf"
count nginx ngx_process_events_and_timers "$URL" nginx -c "$WORK/ng/nginx.conf" -p "$WORK/ng"
