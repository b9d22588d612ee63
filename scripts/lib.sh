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

# xpyd_wait_http URL SECONDS: polls URL until it answers 2xx; 1 after SECONDS.
xpyd_wait_http() {
  local url=$1 tries=$(($2 * 20))
  until curl -fsS -o /dev/null --max-time 1 "$url"; do
    tries=$((tries - 1))
    if [ $tries -le 0 ]; then echo "timed out waiting for $url" >&2; return 1; fi
    sleep 0.05
  done
  return 0
}
