#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/transfer.sh - libxpyd_transfer tcp throughput on loopback vs iperf3 single-stream loopback, measured
# in the same run (the acceptance ratio of issue 7 is >= 70 %). xpyd_transfer_bench moves large blocks
# (4 MiB, batches of 8) and verifies what it moved; it runs with 1 stream (the like-for-like comparison with
# one iperf3 stream) and with 4.
#   bench/transfer.sh [seconds=5]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
SECS=${1:-5}
[ "${XPYD_SKIP_BUILD:-0}" = 1 ] || { ./scripts/deps.sh iperf3; ./scripts/build.sh >/dev/null; }
command -v iperf3 >/dev/null || ./scripts/deps.sh iperf3
B=${XPYD_BUILD_DIR:-build}/bin
WORK=$(mktemp -d /tmp/xpyd-transfer.XXXXXX)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill $p 2>/dev/null; done; wait 2>/dev/null; rm -rf "$WORK"' EXIT
PORT=$(xpyd_free_port)
iperf3 -s -B 127.0.0.1 -p "$PORT" >/dev/null 2>&1 & PIDS+=($!)
python3 - "$PORT" <<'PY'
import socket, sys, time
for _ in range(200):  # wait until iperf3 listens (a bare connect is harmless to a persistent iperf3 server)
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1).close()
        break
    except OSError:
        time.sleep(0.05)
PY
sleep 0.2
iperf3 -c 127.0.0.1 -p "$PORT" -t "$SECS" -J >"$WORK/iperf.json"
IPERF=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%.3f" % (d["end"]["sum_received"]["bits_per_second"]/8e9))' "$WORK/iperf.json")
$B/xpyd_transfer_bench --mode target --port 0 --buffer-size 256M >"$WORK/target.out" 2>&1 & PIDS+=($!)
for _ in $(seq 200); do grep -q "ready port" "$WORK/target.out" && break; sleep 0.05; done
TPORT=$(awk '/ready port/{print $4}' "$WORK/target.out")
echo "iperf3 single stream loopback: $IPERF GB/s"
# XPYD_SAMPLES_DIR: keep the numbers for bench/plot.sh (transfer.tsv: label, GB/s)
tsv() { [ -z "${XPYD_SAMPLES_DIR:-}" ] || { mkdir -p "$XPYD_SAMPLES_DIR"; printf '%s\t%s\n' "$1" "$2" >>"$XPYD_SAMPLES_DIR/transfer.tsv"; }; }
tsv "iperf3, 1 stream" "$IPERF"
for op in write read; do
  for th in 1 4; do
    line=$($B/xpyd_transfer_bench --mode initiator --target "127.0.0.1:$TPORT" --operation $op --block-size 4M \
      --batch-size 8 --threads $th --duration "$SECS" 2>/dev/null)
    gbs=$(echo "$line" | sed -n 's/.*throughput=\([0-9.]*\) GB\/s.*/\1/p')
    tsv "xpyd $op, $th stream$([ $th = 1 ] || echo s)" "$gbs"
    echo "xpyd_transfer_bench $op threads=$th: $gbs GB/s ($(python3 -c "print('%.0f' % (100*$gbs/$IPERF))") % of iperf3) :: $line"
  done
done
