#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/launch_router.sh - start (or --print) xpyd_router from a topology file, and say whether it came up;
# --stop ends it. Paths are the caller's (a relative --config is read from the directory you run this in).
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
# flag | variable | default | meaning   (--help is generated from this table)
OPTS=(
  "--config|CFG||topology/settings JSON file (required to start)"
  "--run-dir|RUN|/tmp/xpyd-router|where the pid, port and log files go"
  "--wait-s|WAIT|30|seconds to wait for the router to answer /health before reporting failure"
  "--bin|BIN|auto|xpyd_router to run (auto: \$XPYD_BIN, else the repository's build/bin, else PATH)"
)
usage() {
  echo "usage: launch_router.sh --config FILE [options] [-- extra xpyd_router flags]"
  echo "       launch_router.sh --stop [--run-dir DIR]"
  local o f v d h
  for o in "${OPTS[@]}"; do
    IFS='|' read -r f v d h <<<"$o"
    printf '  %-12s %s%s\n' "$f" "$h" "${d:+ (default: $d)}"
  done
  printf '  %-12s %s\n' --print "print the command and the expanded topology (xpyd_router --dry-run), start nothing"
  printf '  %-12s %s\n' --stop "stop the router this run dir started"
}
for o in "${OPTS[@]}"; do IFS='|' read -r f v d h <<<"$o"; printf -v "$v" '%s' "$d"; done
PRINT=0 STOP=0 EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --print) PRINT=1; shift; continue ;; --stop) STOP=1; shift; continue ;;
    --) shift; EXTRA=("$@"); break ;; -h|--help) usage; exit 0 ;;
  esac
  found=0
  for o in "${OPTS[@]}"; do
    IFS='|' read -r f v d h <<<"$o"
    if [ "$1" = "$f" ]; then
      [ $# -ge 2 ] || { echo "launch_router.sh: $f needs a value" >&2; exit 2; }
      printf -v "$v" '%s' "$2"; found=1; shift 2; break
    fi
  done
  [ $found = 1 ] || { echo "launch_router.sh: unknown argument '$1' (see --help)" >&2; exit 2; }
done
if [ $STOP = 1 ]; then # SIGTERM drains; wait for the exit (bounded by --wait-s) so the log is complete
  if [ -f "$RUN/router.pid" ]; then
    pid=$(cat "$RUN/router.pid")
    kill "$pid" 2>/dev/null || true
    end=$((SECONDS + WAIT))
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.1; done
  fi
  rm -f "$RUN/router.pid" "$RUN/router.port"; exit 0
fi
[ -n "$CFG" ] || { echo "launch_router.sh: --config is required" >&2; exit 2; }
[ -f "$CFG" ] || { echo "launch_router.sh: no such file: $CFG (relative paths are from $(pwd))" >&2; exit 2; }
CFG=$(cd "$(dirname "$CFG")" && pwd)/$(basename "$CFG")
if [ "$BIN" = auto ]; then
  if [ -n "${XPYD_BIN:-}" ]; then BIN=$XPYD_BIN/xpyd_router
  elif [ -x "$HERE/build/bin/xpyd_router" ]; then BIN=$HERE/build/bin/xpyd_router
  else BIN=$(command -v xpyd_router || true); fi
fi
[ -n "$BIN" ] && [ -x "$BIN" ] || { echo "launch_router.sh: xpyd_router not found (build it, or pass --bin)" >&2; exit 2; }
cmd=("$BIN" --config "$CFG" "${EXTRA[@]}")
if [ $PRINT = 1 ]; then echo "${cmd[*]}"; "${cmd[@]}" --dry-run; exit $?; fi
mkdir -p "$RUN"
rm -f "$RUN/router.port"
nohup "${cmd[@]}" --port-file "$RUN/router.port" >"$RUN/router.log" 2>&1 &
pid=$!
echo $pid >"$RUN/router.pid"
# Up means: the process lives and answers GET /health (200: ready; 503: up, no engine usable yet).
deadline=$((SECONDS + WAIT))
while [ $SECONDS -lt $deadline ]; do
  if ! kill -0 $pid 2>/dev/null; then
    wait $pid && rc=0 || rc=$?
    echo "launch_router.sh: xpyd_router exited (status $rc) instead of starting; its log ($RUN/router.log):" >&2
    tail -20 "$RUN/router.log" >&2
    rm -f "$RUN/router.pid"; exit 1
  fi
  if [ -s "$RUN/router.port" ]; then
    port=$(cat "$RUN/router.port")
    # the address it listens on (its ready line), a wildcard one reached through loopback
    host=$(sed -n 's/.*xpyd_router ready" listen=\(.*\):[0-9]* .*/\1/p' "$RUN/router.log" | tail -1)
    case "$host" in ""|0.0.0.0) host=127.0.0.1 ;; ::) host="[::1]" ;; *:*) host="[$host]" ;; esac
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://$host:$port/health" || true)
    case "$code" in
      200) echo "xpyd_router ready: pid $pid, port $port (log $RUN/router.log)"; exit 0 ;;
      503) echo "xpyd_router up but no engine usable yet (/health 503): pid $pid, port $port (log $RUN/router.log)"
           exit 0 ;;
    esac
  fi
  sleep 0.2
done
echo "launch_router.sh: xpyd_router (pid $pid) did not answer /health within $WAIT s; log $RUN/router.log" >&2
exit 1
