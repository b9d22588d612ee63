#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/ha.sh - high availability with an existing load balancer: HAProxy (Debian's haproxy) in front of two
# xpyd routers on loopback, a steady closed-loop load through it, one router SIGKILLed mid-run. Reports what
# the clients saw: requests that failed (only those in flight on the killed router may), failures among
# requests started after the kill, and when the last failure happened relative to the kill and to HAProxy's
# check interval. The HAProxy configuration is the one README.md shows.
#   bench/ha.sh [seconds=20] [clients=8]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
SECS=${1:-20} CLIENTS=${2:-8}
if [ "${XPYD_SKIP_BUILD:-0}" != 1 ]; then ./scripts/deps.sh haproxy; ./scripts/build.sh >/dev/null; fi
command -v haproxy >/dev/null || { echo "bench/ha.sh: haproxy is not installed (scripts/deps.sh haproxy)" >&2; exit 2; }
B=${XPYD_BUILD_DIR:-build}/bin
WORK=$(mktemp -d /tmp/xpyd-ha.XXXXXX)
PIDS=()
trap 'xpyd_cluster_down; rm -rf "$WORK"' EXIT INT TERM
DARGS=()
for i in 0 1; do
  $B/xpyd_sim --role decode --port 0 --port-file "$WORK/d$i.port" --log-level warn --decode-us-per-token 2000 \
    >"$WORK/d$i.log" 2>&1 &
  PIDS+=($!)
  xpyd_wait_file "$WORK/d$i.port" 10
  DARGS+=("127.0.0.1:$(cat "$WORK/d$i.port")")
done
RPORTS=()
for i in 0 1; do
  $B/xpyd_router --port 0 --port-file "$WORK/r$i.port" --log-level warn --threads 1 --handoff none -d "${DARGS[@]}" \
    >"$WORK/r$i.log" 2>&1 &
  PIDS+=($!)
  echo $! >"$WORK/r$i.pid"
  xpyd_wait_file "$WORK/r$i.port" 10
  RPORTS+=("$(cat "$WORK/r$i.port")")
  xpyd_wait_http "http://127.0.0.1:${RPORTS[$i]}/health" 10
done
HP=$(xpyd_free_port)
INTER=500 FALL=2
cat >"$WORK/haproxy.cfg" <<CFG
global
  maxconn 4096
defaults
  mode http
  timeout connect 2s
  timeout client 60s
  timeout server 60s
  retries 2
  option redispatch
  retry-on conn-failure empty-response
frontend xpyd
  bind 127.0.0.1:$HP
  default_backend routers
backend routers
  balance leastconn
  option httpchk GET /health
  http-check expect status 200
  server r0 127.0.0.1:${RPORTS[0]} check inter ${INTER}ms fall $FALL rise 2
  server r1 127.0.0.1:${RPORTS[1]} check inter ${INTER}ms fall $FALL rise 2
CFG
haproxy -f "$WORK/haproxy.cfg" -db >"$WORK/haproxy.log" 2>&1 &
PIDS+=($!)
xpyd_wait_http "http://127.0.0.1:$HP/health" 10
python3 - "$HP" "$SECS" "$CLIENTS" "$(cat "$WORK/r0.pid")" "$INTER" "$FALL" <<'PY'
import http.client, json, os, signal, sys, threading, time
port, secs, clients, victim, inter, fall = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
body = json.dumps({"model": "sim-model", "prompt": "hello", "max_tokens": 16})
log, stop = [], threading.Event()
def client():
    c = None
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            if c is None:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            data = r.read()
            ok = r.status == 200 and b"choices" in data
            log.append((t0, time.monotonic(), ok, r.status))
        except Exception as e:
            log.append((t0, time.monotonic(), False, type(e).__name__))
            c = None
th = [threading.Thread(target=client) for _ in range(clients)]
for t in th:
    t.start()
time.sleep(secs / 2)
kill_at = time.monotonic()
os.kill(victim, signal.SIGKILL)
time.sleep(secs / 2)
stop.set()
for t in th:
    t.join()
fails = [e for e in log if not e[2]]
after = [e for e in fails if e[0] > kill_at]
last = max((e[1] for e in fails), default=kill_at) - kill_at
print("## HAProxy in front of two routers, one SIGKILLed (%d closed-loop clients, %.0f s, 16-token completions)" % (clients, secs))
print()
print("| requests | failed | failed among those started after the kill | last failure after the kill (ms) | HAProxy check: inter x fall (ms) |")
print("|---|---|---|---|---|")
print("| %d | %d | %d | %.0f | %d |" % (len(log), len(fails), len(after), last * 1000, inter * fall))
print()
print("failures: %s" % sorted(set(str(e[3]) for e in fails)))
PY
