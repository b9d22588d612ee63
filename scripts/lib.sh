# SPDX-License-Identifier: Apache-2.0
# scripts/lib.sh - shared shell helpers for xpyd scripts (sourced, not run).

# xpyd_wait_file FILE SECONDS: waits until FILE exists and is not empty (polling); 1 after SECONDS.
xpyd_wait_file() {
  local f=$1 tries=$(($2 * 20))
  while [ ! -s "$f" ]; do
    tries=$((tries - 1))
    if [ $tries -le 0 ]; then echo "timed out waiting for $f" >&2; return 1; fi
    sleep 0.05
  done
  return 0
}

# xpyd_free_port: prints a loopback TCP port free right now (the kernel's pick), for servers that take a port
# number rather than --port 0.
# xpyd_free_port: a port free a moment ago, below the kernel's ephemeral range (which every outgoing connection
# draws from: a port from it could be taken before the caller binds it).
xpyd_free_port() {
  python3 -c '
import random, socket
lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for _ in range(500):
    p = random.SystemRandom().randrange(10000, lo)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
    except OSError:
        continue
    finally:
        s.close()
    print(p)
    break
'
}

# xpyd_wait_http URL SECONDS: polls URL until it answers 2xx; 1 after SECONDS.
xpyd_wait_http() {
  local url=$1 tries=$(($2 * 20))
  until curl -fs -o /dev/null --max-time 1 "$url"; do
    tries=$((tries - 1))
    if [ $tries -le 0 ]; then echo "timed out waiting for $url" >&2; return 1; fi
    sleep 0.05
  done
  return 0
}

# Local simulated cluster. Set B (bin dir) and WORK (a temp dir) first; PIDS collects what was started.
# xpyd_cluster_up NPREFILL NDECODE HANDOFF [router flags...]: starts the sims and the router on ephemeral
# loopback ports and waits until the router is healthy; sets RP (router port) and SIM_PORTS_P/SIM_PORTS_D.
PIDS=()
xpyd_cluster_up() {
  local np=$1 nd=$2 handoff=$3; shift 3
  local i pargs=() dargs=()
  rm -f "$WORK"/*.port  # a file left by an earlier cluster in WORK would name a dead port
  for ((i = 0; i < np; i++)); do
    $B/xpyd_sim --role prefill --port 0 --port-file "$WORK/p$i.port" --handoff "$handoff" --store-dir "$WORK/store" \
      --log-level warn --prefill-us-per-token "${SIM_PREFILL_US:-50}" ${SIM_PREFILL_ARGS:-} >"$WORK/p$i.log" 2>&1 &
    PIDS+=($!)
  done
  for ((i = 0; i < nd; i++)); do
    $B/xpyd_sim --role decode --port 0 --port-file "$WORK/d$i.port" --handoff "$handoff" --store-dir "$WORK/store" \
      --log-level warn --decode-us-per-token "${SIM_DECODE_US:-5000}" --max-batch "${SIM_MAX_BATCH:-64}" \
      ${SIM_DECODE_ARGS:-} >"$WORK/d$i.log" 2>&1 &
    PIDS+=($!)
  done
  SIM_PORTS_P=() SIM_PORTS_D=()
  for ((i = 0; i < np; i++)); do xpyd_wait_file "$WORK/p$i.port" 10; SIM_PORTS_P+=("$(cat "$WORK/p$i.port")"); pargs+=("127.0.0.1:${SIM_PORTS_P[$i]}"); done
  for ((i = 0; i < nd; i++)); do xpyd_wait_file "$WORK/d$i.port" 10; SIM_PORTS_D+=("$(cat "$WORK/d$i.port")"); dargs+=("127.0.0.1:${SIM_PORTS_D[$i]}"); done
  $B/xpyd_router --port 0 --port-file "$WORK/router.port" --handoff "$handoff" -p "${pargs[@]}" -d "${dargs[@]}" "$@" \
    >"$WORK/router.log" 2>&1 &
  PIDS+=($!)
  xpyd_wait_file "$WORK/router.port" 10
  RP=$(cat "$WORK/router.port")
  xpyd_wait_http "http://127.0.0.1:$RP/health" 10
}

# xpyd_cluster_down: stops everything in PIDS and waits for it.
xpyd_cluster_down() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
}
