#!/usr/bin/env bash
# scripts/launch_router.sh - start (or --print) xpyd_router from a topology file; --stop ends it.
#   launch_router.sh --config conf/1p1d.json [--run-dir DIR] [--print] [-- extra router flags]
#   launch_router.sh --stop [--run-dir DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
CFG="" RUN=/tmp/xpyd-router PRINT=0 STOP=0 EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --config) CFG=$2; shift 2 ;; --run-dir) RUN=$2; shift 2 ;; --print) PRINT=1; shift ;;
    --stop) STOP=1; shift ;; --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,4p' "$0"; exit 0 ;;
    *) echo "launch_router.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
if [ $STOP = 1 ]; then
  [ -f "$RUN/router.pid" ] && kill "$(cat "$RUN/router.pid")" 2>/dev/null || true
  rm -f "$RUN/router.pid"; exit 0
fi
[ -n "$CFG" ] || { echo "launch_router.sh: --config is required" >&2; exit 2; }
BIN=${XPYD_BIN:-build/bin}/xpyd_router
cmd="$BIN --config $CFG"
[ ${#EXTRA[@]} -gt 0 ] && cmd+=" ${EXTRA[*]}"
if [ $PRINT = 1 ]; then echo "$cmd"; $BIN --config "$CFG" "${EXTRA[@]}" --dry-run; exit 0; fi
mkdir -p "$RUN"
nohup $cmd >"$RUN/router.log" 2>&1 &
echo $! >"$RUN/router.pid"
echo "started xpyd_router pid $! (log $RUN/router.log)"
