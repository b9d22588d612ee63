#!/usr/bin/env bash
# tests/fuzz/run.sh - builds the libFuzzer harnesses with clang (ASan+UBSan) and runs each for a bounded time
# (FUZZ_SECONDS, default 20) on a copy of its seed corpus. Exit status 1 on any crash, leak or sanitizer report.
# Findings to keep go into tests/fuzz/corpus/<harness>/ so every later run replays them.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${FUZZ_OUT:-$(mktemp -d /tmp/xpyd-fuzz.XXXXXX)}
mkdir -p "$OUT"
SECS=${FUZZ_SECONDS:-20}
CC=${FUZZ_CC:-clang}
FLAGS=(-g -O1 -std=c11 -D_GNU_SOURCE -Wall -Werror -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -I"$ROOT/common" -I"$ROOT/router" -I"$ROOT/balancer" -I"$ROOT/sim" $(pkg-config --cflags libcjson libevent))
HTTP_PARSER_INC=${HTTP_PARSER_INC:-/usr/include}
LIBS=($(pkg-config --libs libcjson libevent libevent_openssl openssl) -lpthread -lxxhash)
echo '#define XPYD_GIT_REV "fuzz"' >"$OUT/xpyd_gitrev.h" # what the build generates (cmake/gitrev.cmake)
build() { # name sources...
  local n=$1; shift
  $CC "${FLAGS[@]}" -o "$OUT/$n" "$@" "${LIBS[@]}"
}
build fuzz_sse "$ROOT/tests/fuzz/fuzz_sse.c" "$ROOT/common/xpyd_sse.c"
build fuzz_config "$ROOT/tests/fuzz/fuzz_config.c" "$ROOT/router/config.c" "$ROOT/common/xpyd_util.c" \
  "$ROOT/common/xpyd_settings.c" \
  "$ROOT/common/xpyd_version.c" -I"$OUT" -DXPYD_VERSION=\"fuzz\" \
  "$ROOT"/balancer/xb*.c "$ROOT/common/xpyd_etcd.c" "$ROOT/common/xpyd_http_client.c" "$ROOT/common/xpyd_tls.c" \
  -I"$HTTP_PARSER_INC" -lhttp_parser
build fuzz_sim_request "$ROOT/tests/fuzz/fuzz_sim_request.c" "$ROOT/sim/sim_request.c" \
  "$ROOT/sim/sim_tokens.c" "$ROOT/common/xpyd_util.c"
build fuzz_rewrite "$ROOT/tests/fuzz/fuzz_rewrite.c" "$ROOT/router/rewrite.c" "$ROOT/common/xpyd_util.c" \
  "$ROOT/balancer/xb_prefix.c"
build fuzz_http_req "$ROOT/tests/fuzz/fuzz_http_req.c" "$ROOT/router/http_req.c"
build fuzz_relay "$ROOT/tests/fuzz/fuzz_relay.c" "$ROOT/router/relay.c" "$ROOT/router/rewrite.c" "$ROOT/common/xpyd_sse.c" \
  "$ROOT/common/xpyd_util.c" "$ROOT/balancer/xb_prefix.c"
build fuzz_admin "$ROOT/tests/fuzz/fuzz_admin.c" "$ROOT/router/admin_parse.c"
build fuzz_metadata "$ROOT/tests/fuzz/fuzz_metadata.c" "$ROOT/router/metadata_store.c" "$ROOT/common/xpyd_util.c"
build fuzz_feedback "$ROOT/tests/fuzz/fuzz_feedback.c" "$ROOT/router/feedback_parse.c" -lm
build fuzz_desc "$ROOT/tests/fuzz/fuzz_desc.c" "$ROOT/transfer/xt_desc.c" -I"$ROOT/transfer"
build fuzz_upstream "$ROOT/tests/fuzz/fuzz_upstream.c" "$ROOT/common/xpyd_http_client.c" "$ROOT/common/xpyd_sse.c" \
  "$ROOT/router/rewrite.c" "$ROOT/common/xpyd_util.c" "$ROOT/balancer/xb_prefix.c" "$ROOT/common/xpyd_tls.c" \
  -I"$HTTP_PARSER_INC" -lhttp_parser
build fuzz_tls "$ROOT/tests/fuzz/fuzz_tls.c" "$ROOT/common/xpyd_tls.c"
build fuzz_etcd "$ROOT/tests/fuzz/fuzz_etcd.c" "$ROOT/common/xpyd_etcd.c" "$ROOT/router/etcd_parse.c" \
  "$ROOT/router/admin_parse.c" "$ROOT/common/xpyd_http_client.c" "$ROOT/common/xpyd_tls.c" "$ROOT/common/xpyd_util.c" \
  -I"$HTTP_PARSER_INC" -lhttp_parser
rc=0
for h in sse config sim_request rewrite upstream http_req relay admin metadata feedback desc tls etcd; do
  mkdir -p "$OUT/corpus_$h"
  cp "$ROOT/tests/fuzz/corpus/$h/"* "$OUT/corpus_$h/"
  echo "== fuzz_$h for ${SECS}s"
  if ! (cd "$OUT" && ./fuzz_$h -max_total_time="$SECS" -max_len=8192 -close_fd_mask=3 -print_final_stats=1 \
        -artifact_prefix="$OUT/crash_$h-" "corpus_$h" >"$OUT/fuzz_$h.log" 2>&1); then
    echo "fuzz_$h FAILED:"; tail -40 "$OUT/fuzz_$h.log"; rc=1
    for f in "$OUT"/crash_$h-*; do # the input that failed, kept and printed so a CI log is enough to replay it
      [ -e "$f" ] && { echo "input $f (base64):"; base64 -w0 "$f"; echo; }
    done
  else
    grep -E "stat::number_of_executed_units" "$OUT/fuzz_$h.log" || true
  fi
done
if [ $rc -ne 0 ]; then echo "fuzz outputs kept in $OUT"; elif [ -z "${FUZZ_OUT:-}" ]; then rm -rf "$OUT"; fi
exit $rc
