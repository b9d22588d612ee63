#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/prometheus_check.sh - a real Prometheus server (Debian's package) scrapes the router while a
# short load runs against a local simulated cluster; the script then asks Prometheus' HTTP API whether it
# stored the router's series with the right values, and stops everything. Exit 0 = stored and correct.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
if [ "${XPYD_SKIP_BUILD:-0}" != 1 ]; then ./scripts/deps.sh prometheus; ./scripts/build.sh >/dev/null; fi
B=${XPYD_BUILD_DIR:-build}/bin
N=${PROM_CHECK_PROMPTS:-60}
WORK=$(mktemp -d /tmp/xpyd-prom.XXXXXX)
trap 'xpyd_cluster_down; rm -rf "$WORK"' EXIT INT TERM
SIM_DECODE_US=1000 xpyd_cluster_up 1 1 kv-params
PP=$(xpyd_free_port)
cat >"$WORK/prometheus.yml" <<YML
global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: xpyd
    static_configs: [{targets: ["127.0.0.1:$RP"]}]
YML
prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/tsdb" \
  --web.listen-address="127.0.0.1:$PP" >"$WORK/prometheus.log" 2>&1 &
PIDS+=($!)
xpyd_wait_http "http://127.0.0.1:$PP/-/ready" 30
$B/xpyd_bench --port "$RP" --num-prompts "$N" --max-concurrency 8 --random-input-len 32 --random-output-len 8 \
  --disable-tqdm >/dev/null
query() { curl -fsS --max-time 2 "http://127.0.0.1:$PP/api/v1/query" --data-urlencode "query=$1" |
  python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(int(float(r[0]["value"][1])) if r else -1)'; }
# Until a scrape after the load landed, then one scrape more: rate() needs two samples in its window, and when the
# first scrape that found the router came after the load, the dashboard's rates were empty (bounded: 10 s each).
for _ in $(seq 1 100); do
  [ "$(query 'sum(xpyd_requests_total{status="200"})')" = "$N" ] && break
  sleep 0.1
done
scrapes=$(query 'count_over_time(up{job="xpyd"}[5m])')
for _ in $(seq 1 100); do
  [ "$(query 'count_over_time(up{job="xpyd"}[5m])')" -gt "$scrapes" ] && break
  sleep 0.1
done
got=$(query 'sum(xpyd_requests_total{status="200"})')
ok=$(query 'sum(xpyd_request_outcomes_total{outcome="ok"})')
ttft=$(query 'xpyd_ttft_seconds_count')
up=$(query 'up{job="xpyd"}')
echo "prometheus_check: requests_200=$got outcome_ok=$ok ttft_count=$ttft up=$up (want $N, $N, $N, 1)"
[ "$got" = "$N" ] && [ "$ok" = "$N" ] && [ "$ttft" = "$N" ] && [ "$up" = 1 ]
# Every query of the shipped dashboard, against this real scrape: each returns data, and the per-rank series keep
# their `engine` label (Prometheus renames a label called `instance` to `exported_instance`).
python3 - "$PP" conf/grafana/xpyd.json <<'PY'
import json, sys, urllib.parse, urllib.request
port, dash = sys.argv[1], json.load(open(sys.argv[2]))
def query(q):
    url = "http://127.0.0.1:%s/api/v1/query?%s" % (port, urllib.parse.urlencode({"query": q}))
    return json.load(urllib.request.urlopen(url, timeout=5))["data"]["result"]
bad = []
for panel in dash["panels"]:
    for t in panel.get("targets", []):
        q = t["expr"].replace("$__rate_interval", "1m")
        if not query(q):
            bad.append("%s: %s" % (panel["title"], q))
ranks = query("xpyd_instance_outstanding_tokens")
if not ranks or any("exported_instance" in r["metric"] or "engine" not in r["metric"] for r in ranks):
    bad.append("per-rank labels as stored: %s" % [r["metric"] for r in ranks])
for r in ranks:
    if r["metric"]["engine"] == r["metric"].get("instance"):
        bad.append("the engine label is the scraped target's address: %s" % r["metric"])
print("prometheus_check: %d dashboard queries, %s" % (sum(len(p.get("targets", [])) for p in dash["panels"]),
                                                   "all return data" if not bad else "FAILED:\n  " + "\n  ".join(bad)))
sys.exit(1 if bad else 0)
PY
