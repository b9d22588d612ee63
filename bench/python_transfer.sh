#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/python_transfer.sh - the Python binding's throughput (python/xpyd_transfer) against xpyd_transfer_bench
# (C) in the same run, on loopback tcp, both writing into the same C target with one submitting thread:
# 4 MiB blocks in batches of 16, and 16 KiB blocks in batches of 1024. Runs alternate C / Python three times
# per shape; the medians and their ratio are printed (issue 16's acceptance: Python >= 0.9 x C for 4 MiB).
#   bench/python_transfer.sh [seconds per run=3]
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-3}
[ "${XPYD_SKIP_BUILD:-0}" = 1 ] || { ./scripts/deps.sh; ./scripts/build.sh >/dev/null; }
B=${XPYD_BUILD_DIR:-build}
WORK=$(mktemp -d /tmp/xpyd-pytransfer.XXXXXX)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill $p 2>/dev/null; done; wait 2>/dev/null; rm -rf "$WORK"' EXIT
$B/bin/xpyd_transfer_bench --mode target --port 0 --buffer-size 256M >"$WORK/target.out" 2>&1 & PIDS+=($!)
for _ in $(seq 200); do grep -q "ready port" "$WORK/target.out" && break; sleep 0.05; done
TPORT=$(awk '/ready port/{print $4}' "$WORK/target.out")
export PYTHONPATH=$PWD/python XPYD_TRANSFER_LIB=$PWD/$B/lib/libxpyd_transfer.so.0
c_run() { # block batch
  $B/bin/xpyd_transfer_bench --mode initiator --target "127.0.0.1:$TPORT" --operation write --block-size "$1" \
    --batch-size "$2" --threads 1 --duration "$SECS" 2>/dev/null | sed -n 's/.*throughput=\([0-9.]*\) GB\/s.*/\1/p'
}
py_run() { # block-bytes batch
  python3 - "$TPORT" "$1" "$2" "$SECS" <<'PY'
import sys, time
import xpyd_transfer as xt
port, block, batch, secs = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
e = xt.Engine("py-bench", transport="tcp", threads=1)  # as the C bench with --threads 1: one engine stream
buf = bytearray(block * batch)
local = e.register(buf)
seg = e.open_segment("127.0.0.1:%d" % port)
remote = int(e.peer_descriptor(seg)["buffers"][0]["addr"])
reqs = [(xt.WRITE, local + i * block, remote + i * block, block) for i in range(batch)]
moved, t0 = 0, time.monotonic()
while time.monotonic() - t0 < secs:
    e.transfer(seg, reqs)
    moved += block * batch
print("%.3f" % (moved / (time.monotonic() - t0) / 1e9))
PY
}
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
for shape in "4M 4194304 16" "16K 16384 1024"; do
  set -- $shape
  cs=() ps=()
  for r in 1 2 3; do cs+=("$(c_run "$1" "$3")"); ps+=("$(py_run "$2" "$3")"); done
  c=$(median "${cs[@]}"); p=$(median "${ps[@]}")
  echo "blocks $1 x batch $3: xpyd_transfer_bench ${cs[*]} GB/s (median $c), python ${ps[*]} GB/s (median $p), python/C = $(python3 -c "print('%.2f' % ($p/$c))")"
done
