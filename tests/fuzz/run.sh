#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# tests/fuzz/run.sh [HARNESS...] - builds libFuzzer harnesses with clang (ASan+UBSan) and runs each on a copy of
# its seed corpus: every input of tests/fuzz/corpus/<harness>/ is replayed first (the findings kept there), then
# new inputs are tried for FUZZ_SECONDS (default 20; ctest's fuzz lane gives each harness 10). Without names,
# every harness in turn. Exit status 1 on any crash, leak or sanitizer report; the input that failed is kept in
# the run's folder and printed as base64, so a CI log is enough to replay it. Findings to keep go into
# tests/fuzz/corpus/<harness>/ so every later run replays them.
# A longer hunt than CI's: FUZZ_SECONDS=600 tests/fuzz/run.sh [HARNESS...]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
ALL=(sse config sim_request rewrite json_view upstream http_req relay admin metadata feedback desc tls etcd tokenizer
     template kv_events chat)
NAMES=("$@")
[ ${#NAMES[@]} -gt 0 ] || NAMES=("${ALL[@]}")
OUT=${FUZZ_OUT:-$(mktemp -d /tmp/xpyd-fuzz.XXXXXX)}
mkdir -p "$OUT"
SECS=${FUZZ_SECONDS:-20}
CC=${FUZZ_CC:-clang}
FLAGS=(-g -O1 -std=c11 -D_GNU_SOURCE -Wall -Werror -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -I"$ROOT/common" -I"$ROOT/router" -I"$ROOT/balancer" -I"$ROOT/sim" -I"$OUT" $(pkg-config --cflags libcjson libevent))
HTTP_PARSER_INC=${HTTP_PARSER_INC:-/usr/include}
LIBS=($(pkg-config --libs libcjson libevent libevent_openssl openssl) -lpthread -lxxhash)
echo '#define XPYD_GIT_REV "fuzz"' >"$OUT/xpyd_gitrev.h" # what the build generates (cmake/gitrev.cmake)
C=$ROOT/common R=$ROOT/router
HTTP=("$C/xpyd_http_client.c" "$C/xpyd_http_response.c" "$C/xpyd_http_request.c" "$C/xpyd_endpoint.c" "$C/xpyd_tls.c" -I"$HTTP_PARSER_INC" -lhttp_parser)

sources() { # harness -> the code under test (besides tests/fuzz/fuzz_<harness>.c)
  case $1 in
  sse) echo "$C/xpyd_sse.c" ;;
  config) echo "$R/config.c $R/config_load.c $R/config_file.c $R/config_topology.c $R/kv_endpoint.c $R/handoff_traits.c $R/json_view.c -lm $C/xpyd_util.c $C/xpyd_settings.c $C/xpyd_version.c -DXPYD_VERSION=\"fuzz\"" \
    "$ROOT/balancer/xb*.c $C/xpyd_etcd.c ${HTTP[*]}" ;;
  sim_request) echo "$ROOT/sim/sim_request.c $ROOT/sim/sim_tokens.c $C/xpyd_util.c" ;;
  rewrite) echo "$R/rewrite.c $R/body_src.c $R/prompt.c $R/json_view.c $C/xpyd_util.c $ROOT/balancer/xb_prefix.c" ;;
  json_view) echo "$R/json_view.c $C/xpyd_util.c -lm" ;;
  chat) echo "$R/chat_prompt.c $R/json_view.c $C/xpyd_util.c $ROOT/tokenizer/tok_json.c -I$ROOT/tokenizer -lm" ;;
  http_req) echo "$R/http_req.c" ;;
  relay) echo "$R/relay.c $R/rewrite.c $R/json_view.c -lm $C/xpyd_sse.c $C/xpyd_util.c $ROOT/balancer/xb_prefix.c" ;;
  admin) echo "$R/admin_parse.c $R/kv_endpoint.c $R/json_view.c $C/xpyd_util.c -lm" ;;
  metadata) echo "$R/metadata_store.c $C/xpyd_util.c" ;;
  feedback) echo "$R/feedback_parse.c $R/json_view.c $C/xpyd_util.c -lm" ;;
  desc) echo "$ROOT/transfer/xt_desc.c -I$ROOT/transfer" ;;
  upstream) echo "$C/xpyd_sse.c $R/rewrite.c $R/json_view.c -lm $C/xpyd_util.c $ROOT/balancer/xb_prefix.c ${HTTP[*]}" ;;
  tls) echo "$C/xpyd_tls.c" ;;
  tokenizer) echo "$ROOT/tokenizer/tok_load.c $ROOT/tokenizer/tok_cfg.c $ROOT/tokenizer/tok_model.c" \
    "$ROOT/tokenizer/tok_encode.c $ROOT/tokenizer/tok_pretok.c $ROOT/tokenizer/tok_map.c" \
    "$ROOT/tokenizer/tok_cache.c $ROOT/tokenizer/tok_mem.c -I$ROOT/tokenizer" \
    "$(pkg-config --cflags --libs libpcre2-8 libutf8proc)" ;;
  template) echo "$ROOT/tokenizer/tok_chat.c $ROOT/tokenizer/tok_json.c $ROOT/tokenizer/tpl_*.c -I$ROOT/tokenizer -lm" \
    "$(pkg-config --cflags --libs libutf8proc)" ;;
  kv_events) echo "$R/kv_events.c $R/kv_index.c $ROOT/balancer/xb_prefix.c -I$ROOT/balancer" \
    "$(pkg-config --cflags --libs msgpack libxxhash)" ;;
  etcd) echo "$C/xpyd_etcd.c $R/etcd_parse.c $R/admin_parse.c $R/kv_endpoint.c $R/json_view.c $C/xpyd_util.c ${HTTP[*]}" ;;
  *) echo "unknown harness '$1' (known: ${ALL[*]})" >&2; return 1 ;;
  esac
}

rc=0
for h in "${NAMES[@]}"; do
  src=$(sources "$h")
  # shellcheck disable=SC2086 # the source list is words (and a glob) by design
  $CC "${FLAGS[@]}" -o "$OUT/fuzz_$h" "$ROOT/tests/fuzz/fuzz_$h.c" $src "${LIBS[@]}"
  mkdir -p "$OUT/corpus_$h"
  cp "$ROOT/tests/fuzz/corpus/$h/"* "$OUT/corpus_$h/"
  echo "== fuzz_$h: $(ls "$OUT/corpus_$h" | wc -l) corpus inputs replayed, then ${SECS}s of new ones"
  if ! (cd "$OUT" && ./fuzz_$h -max_total_time="$SECS" -max_len=8192 -close_fd_mask=3 -print_final_stats=1 \
        -artifact_prefix="$OUT/crash_$h-" "corpus_$h" >"$OUT/fuzz_$h.log" 2>&1); then
    echo "fuzz_$h FAILED:"; tail -40 "$OUT/fuzz_$h.log"; rc=1
    for f in "$OUT"/crash_$h-*; do
      [ -e "$f" ] && { echo "input $f (base64):"; base64 -w0 "$f"; echo; }
    done
  else
    grep -E "stat::number_of_executed_units" "$OUT/fuzz_$h.log" || true
  fi
done
if [ $rc -ne 0 ]; then echo "fuzz outputs kept in $OUT"; elif [ -z "${FUZZ_OUT:-}" ]; then rm -rf "$OUT"; fi
exit $rc
