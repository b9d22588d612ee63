#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/plot.sh - charts (PNG, gnuplot) from recorded benchmark results:
#   bench/plot.sh SAMPLES_DIR [OUT_DIR=SAMPLES_DIR/charts]
# SAMPLES_DIR is what the benchmarks leave when run with XPYD_SAMPLES_DIR=DIR (bench/overhead.sh,
# bench/balancer.sh, bench/transfer.sh); bench/samples/ holds a recorded set. Reads:
#   cdf-<chart>-<label>.json  xpyd_bench results (per-request ttfts/itls): one TTFT and one ITL CDF per <chart>,
#                             one line per <label> (pd: router vs direct; hop: router vs nginx; policy: placement)
#   cpu.tsv                   label <TAB> CPU µs per request: bars
#   transfer.tsv              label <TAB> GB/s: bars
# Writes <chart>_ttft_cdf.png, <chart>_itl_cdf.png, cpu_per_request.png, transfer.png; prints each path.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 SAMPLES_DIR [OUT_DIR]" >&2; exit 2; }
IN=$(cd "$1" && pwd)
OUT=${2:-$IN/charts}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
command -v gnuplot >/dev/null || { echo "plot.sh: gnuplot is missing (scripts/deps.sh installs gnuplot-nox)" >&2; exit 1; }
TMP=$(mktemp -d /tmp/xpyd-plot.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

# CDF data: one file per chart, metric and label (value in ms, cumulative fraction)
python3 - "$IN" "$TMP" <<'PY'
import glob, json, os, sys
src, tmp = sys.argv[1:3]
charts = {}
for f in sorted(glob.glob(os.path.join(src, "cdf-*-*.json"))):
    chart, label = os.path.basename(f)[len("cdf-"):-len(".json")].split("-", 1)
    d = json.load(open(f))
    for metric, key in (("ttft", "ttfts"), ("itl", "itls")):
        vals = d.get(key) or []
        vals = sorted(x * 1000.0 for v in vals for x in (v if isinstance(v, list) else [v]) if x is not None and x > 0)
        if not vals:
            continue
        path = os.path.join(tmp, "%s_%s_%s.dat" % (chart, metric, label))
        with open(path, "w") as o:
            n = len(vals)
            step = max(1, n // 2000)
            for i in range(0, n, step):
                o.write("%.6f %.6f\n" % (vals[i], (i + 1) / n))
            o.write("%.6f 1.0\n" % vals[-1])
        charts.setdefault((chart, metric), []).append((label, path))
with open(os.path.join(tmp, "charts.txt"), "w") as o:
    for (chart, metric), lines in sorted(charts.items()):
        o.write("%s %s %s\n" % (chart, metric, " ".join("%s=%s" % l for l in lines)))
PY

TITLE_pd="router vs the same prefill->decode sequence done by the client"
TITLE_hop="one hop to a decode engine: router vs nginx"
TITLE_policy="decode placement policies, skewed workload"
while read -r chart metric lines; do
  title_var=TITLE_$chart
  plots=""
  for l in $lines; do
    plots+="${plots:+, }'${l#*=}' using 1:2 with lines lw 2 title '${l%%=*}'"
  done
  png="$OUT/${chart}_${metric}_cdf.png"
  gnuplot <<GP
set terminal png size 800,500 font ",10"
set output "$png"
set title "${!title_var:-$chart}: ${metric^^} distribution"
set xlabel "${metric^^} (ms, log scale)"
set ylabel "fraction of ${metric^^}s at most x"
set logscale x
set key bottom right
set grid
set yrange [0:1]
plot $plots
GP
  echo "$png"
done <"$TMP/charts.txt"

bars() { # tsv png title ylabel
  [ -s "$1" ] || return 0
  awk -F'\t' '{printf "%d \"%s\" %s\n", NR-1, $1, $2}' "$1" >"$TMP/bars.dat"
  gnuplot <<GP
set terminal png size 800,500 font ",10"
set output "$2"
set title "$3"
set ylabel "$4"
set style fill solid 0.6
set boxwidth 0.6
set grid ytics
set yrange [0:*]
set xtics rotate by -15
set bmargin 6
set offsets 0.3, 0.3, graph 0.12, 0
unset key
plot "$TMP/bars.dat" using 1:3:xtic(2) with boxes, "" using 1:3:(sprintf("%.3g", \$3)) with labels offset 0,1 notitle
GP
  echo "$2"
}
bars "$IN/cpu.tsv" "$OUT/cpu_per_request.png" "proxy CPU per request (same run, one core each)" "CPU µs per request"
bars "$IN/transfer.tsv" "$OUT/transfer.png" "KV transfer engine vs iperf3, tcp loopback, 4 MiB blocks" "GB/s"
