#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# tests/plot_test.sh - bench/plot.sh turns the recorded benchmark sample (bench/samples/) into non-empty PNG
# charts: TTFT and ITL CDFs per comparison, CPU per request bars, transfer throughput bars.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$(mktemp -d /tmp/xpyd-plot-test.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
bench/plot.sh bench/samples "$OUT" >"$OUT/list"
want="pd_ttft_cdf.png pd_itl_cdf.png hop_ttft_cdf.png hop_itl_cdf.png policy_ttft_cdf.png cpu_per_request.png transfer.png"
n=0
for f in $want; do
  [ -s "$OUT/$f" ] || { echo "FAIL: $f missing or empty"; cat "$OUT/list"; exit 1; }
  head -c 8 "$OUT/$f" | od -An -tx1 | grep -q "89 50 4e 47" || { echo "FAIL: $f is not a PNG"; exit 1; }
  n=$((n + 1))
done
[ "$(wc -l <"$OUT/list")" -ge "$n" ] || { echo "FAIL: plot.sh did not list its charts"; exit 1; }
echo "plot test: $n passed, 0 failed"
