#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/xpyd_start_proxy.sh - the Gaudi PD guide's proxy command, run by xpyd_router. The guide edits the IP
# arrays below and starts the proxy with
#   bash xpyd_start_proxy.sh X Y Z FIRST_TOKEN_FROM_P [REPEAT_D_TIMES] [benchmark]
#     X   prefill nodes (one instance each, on PBASE_PORT 8100)
#     Y   decode nodes (8 cards each: 8 / Z instances per node, DP ranks on DBASE_PORT 8200, 8201, ...)
#     Z   tensor-parallel size of a decode instance (1, 2, 4 or 8)
#     FIRST_TOKEN_FROM_P   true: the first token comes from the prefill (--first-token prefill); false: decode
#     REPEAT_D_TIMES       decode-only clones per request in benchmark mode (default 127)
#     benchmark            benchmark (repeat) mode: --repeat-d-times REPEAT_D_TIMES (also accepted as the 5th
#                          argument, the short form `X Y Z false benchmark`)
# The engines speak the Mooncake store handoff (--handoff store), the router listens on PROXY_PORT 8868, as the
# Python proxy did. The IPs may also come from the environment (XPYD_PREFILL_IPS / XPYD_DECODE_IPS, space
# separated), and the ports (PBASE_PORT, DBASE_PORT, PROXY_PORT); XPYD_ROUTER names the binary (default: the
# xpyd_router on PATH, else this checkout's build). Extra router flags: XPYD_ROUTER_ARGS.
set -euo pipefail

# Adjust Prefill/Decode IPs (as in the guide)
PREFILL_IPS=("10.239.129.9" "10.239.129.67" "10.239.129.21" "10.239.128.165" "10.239.128.244" "10.239.128.153")
DECODE_IPS=("10.239.129.81" "10.239.129.165" "10.239.129.67" "10.239.129.21")

[ -n "${XPYD_PREFILL_IPS:-}" ] && read -r -a PREFILL_IPS <<<"$XPYD_PREFILL_IPS"
[ -n "${XPYD_DECODE_IPS:-}" ] && read -r -a DECODE_IPS <<<"$XPYD_DECODE_IPS"
PBASE_PORT=${PBASE_PORT:-8100}
DBASE_PORT=${DBASE_PORT:-8200}
PROXY_PORT=${PROXY_PORT:-8868}
WORLD_SIZE_PER_NODE=8

usage() {
  echo "usage: $0 PREFILL_NODES DECODE_NODES DECODE_TP FIRST_TOKEN_FROM_P(true|false) [REPEAT_D_TIMES] [benchmark]" >&2
  echo "  e.g. $0 2 2 1 false    (2 prefill nodes, 2 decode nodes of 8 DP ranks each, first token from decode)" >&2
  exit 2
}
[ $# -ge 4 ] || usage
P=$1 D=$2 TP=$3 FIRST=$4
REPEAT=127 BENCH=0
shift 4
for a in "$@"; do
  case $a in
  benchmark) BENCH=1 ;;
  '' | *[!0-9]*) echo "$0: '$a' is neither a repeat count nor 'benchmark'" >&2; usage ;;
  *) REPEAT=$a ;;
  esac
done
case $P$D$TP in *[!0-9]*) usage ;; esac
[ "$P" -ge 1 ] && [ "$P" -le ${#PREFILL_IPS[@]} ] || {
  echo "$0: $P prefill nodes, but PREFILL_IPS lists ${#PREFILL_IPS[@]}" >&2; exit 2; }
[ "$D" -ge 1 ] && [ "$D" -le ${#DECODE_IPS[@]} ] || {
  echo "$0: $D decode nodes, but DECODE_IPS lists ${#DECODE_IPS[@]}" >&2; exit 2; }
case $TP in 1 | 2 | 4 | 8) ;; *) echo "$0: decode TP size must be 1, 2, 4 or 8 (a node has 8 cards), got $TP" >&2; exit 2 ;; esac
case $FIRST in true | false) ;; *) echo "$0: FIRST_TOKEN_FROM_P must be true or false, got '$FIRST'" >&2; exit 2 ;; esac
NUM_DECODE=$((WORLD_SIZE_PER_NODE / TP))

ROUTER=${XPYD_ROUTER:-$(command -v xpyd_router || echo "$(cd "$(dirname "$0")/.." && pwd)/build/bin/xpyd_router")}
args=(--host 0.0.0.0 --port "$PROXY_PORT" --handoff store)
# decode: each node's ranks on DBASE_PORT + r, interleaved port-major across nodes as the guide lists them
args+=(-d)
for ((j = 0; j < D; j++)); do args+=("${DECODE_IPS[$j]}:$DBASE_PORT"); done
args+=(--decode-dp "$NUM_DECODE" --decode-tp "$TP")
args+=(-p)
for ((i = 0; i < P; i++)); do args+=("${PREFILL_IPS[$i]}:$PBASE_PORT"); done
[ "$FIRST" = true ] && args+=(--first-token prefill)
[ $BENCH = 1 ] && args+=(--repeat-d-times "$REPEAT")
# shellcheck disable=SC2206 # extra flags are words by design
[ -n "${XPYD_ROUTER_ARGS:-}" ] && args+=($XPYD_ROUTER_ARGS)
echo "Running: $ROUTER ${args[*]}"
exec "$ROUTER" "${args[@]}"
