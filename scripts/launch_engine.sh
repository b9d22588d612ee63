#!/usr/bin/env bash
# scripts/launch_engine.sh - start (or --print) real engine instances for a PD deployment behind xpyd_router:
# one vLLM (or SGLang) server per DP rank in external DP mode, one per host in internal mode, with the
# --kv-transfer-config each handoff mode needs. --stop ends what a previous run started (pid file).
# Connectors: nixl (--handoff kv-params); mooncake = upstream vLLM's MooncakeConnector (--handoff mooncake:
# the prefill runs its DP ranks internally and serves /query on --bootstrap-port); mooncake-ascend =
# vllm-ascend's MooncakeConnectorV1 (--handoff kv-params); mooncake-store (--handoff store); sglang.
#
#   launch_engine.sh --role prefill|decode --connector nixl|mooncake|mooncake-ascend|mooncake-store|sglang --model M
#                    [--host 0.0.0.0] [--port 8100] [--dp 1] [--dp-mode external|internal] [--tp 1]
#                    [--dp-address IP] [--dp-rpc-port 13345] [--side-port 5600] [--kv-port 20001]
#                    [--bootstrap-port 8998] [--mooncake-config mooncake.json] [--run-dir DIR] [--print]
#   launch_engine.sh --stop [--run-dir DIR]
set -euo pipefail
ROLE="" CONN="" MODEL="" HOST=0.0.0.0 PORT=8100 DP=1 DPMODE=external TP=1 DPADDR=127.0.0.1 DPRPC=13345
SIDE=5600 KVPORT=20001 BOOT=8998 MCFG=mooncake.json RUN=/tmp/xpyd-engines PRINT=0 STOP=0
die() { echo "launch_engine.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --role) ROLE=$2; shift 2 ;; --connector) CONN=$2; shift 2 ;; --model) MODEL=$2; shift 2 ;;
    --host) HOST=$2; shift 2 ;; --port) PORT=$2; shift 2 ;; --dp) DP=$2; shift 2 ;;
    --dp-mode) DPMODE=$2; shift 2 ;; --tp) TP=$2; shift 2 ;; --dp-address) DPADDR=$2; shift 2 ;;
    --dp-rpc-port) DPRPC=$2; shift 2 ;; --side-port) SIDE=$2; shift 2 ;; --kv-port) KVPORT=$2; shift 2 ;;
    --bootstrap-port) BOOT=$2; shift 2 ;; --mooncake-config) MCFG=$2; shift 2 ;; --run-dir) RUN=$2; shift 2 ;;
    --print) PRINT=1; shift ;; --stop) STOP=1; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) die "unknown argument '$1'" ;;
  esac
done
if [ $STOP = 1 ]; then
  [ -f "$RUN/engines.pids" ] || exit 0
  while read -r pid; do kill "$pid" 2>/dev/null || true; done <"$RUN/engines.pids"
  rm -f "$RUN/engines.pids"; exit 0
fi
case "$ROLE" in prefill|decode) ;; *) die "--role must be prefill or decode" ;; esac
[ -n "$MODEL" ] || die "--model is required"
case "$DPMODE" in external|internal) ;; *) die "--dp-mode must be external or internal" ;; esac
[[ "$DP" =~ ^[1-9][0-9]*$ && "$TP" =~ ^[1-9][0-9]*$ ]] || die "--dp and --tp take positive integers"

# kv_role per connector: NIXL pulls with kv_both on either side; the Mooncake connectors are directional.
if [ "$ROLE" = prefill ]; then KVROLE=kv_producer; else KVROLE=kv_consumer; fi
cmds=()
add_vllm() { # rank port
  local r=$1 p=$2 env="" cfg
  case "$CONN" in
    nixl)
      env="VLLM_NIXL_SIDE_CHANNEL_PORT=$((SIDE + r)) "
      cfg='{"kv_connector":"NixlConnector","kv_role":"kv_both"}' ;;
    mooncake) # upstream vLLM: the prefill's bootstrap server answers /query (one per instance; vLLM derives
              # each worker's own port from this base)
      [ "$ROLE" = prefill ] && env="VLLM_MOONCAKE_BOOTSTRAP_PORT=$BOOT "
      cfg="{\"kv_connector\":\"MooncakeConnector\",\"kv_role\":\"$KVROLE\"}" ;;
    mooncake-ascend)
      cfg="{\"kv_connector\":\"MooncakeConnectorV1\",\"kv_role\":\"$KVROLE\",\"kv_port\":\"$((KVPORT + r))\",\"engine_id\":\"$ROLE-$p\",\"kv_connector_module_path\":\"vllm_ascend.distributed.mooncake_connector\"}" ;;
    mooncake-store)
      env="MOONCAKE_CONFIG_PATH=$MCFG "
      cfg="{\"kv_connector\":\"MooncakeStoreConnector\",\"kv_role\":\"$KVROLE\"}" ;;
  esac
  local dpargs=""
  if [ "$DP" -gt 1 ]; then
    if [ "$DPMODE" = external ]; then
      dpargs=" --data-parallel-size $DP --data-parallel-rank $r --data-parallel-address $DPADDR --data-parallel-rpc-port $DPRPC"
    else
      dpargs=" --data-parallel-size $DP --data-parallel-address $DPADDR --data-parallel-rpc-port $DPRPC"
    fi
  fi
  [ -n "$env" ] && env="env $env" # runnable as printed, and through bash -c "exec ..."
  cmds+=("${env}vllm serve $MODEL --host $HOST --port $p --tensor-parallel-size $TP$dpargs --kv-transfer-config '$cfg'")
}
if [ "$CONN" = mooncake ] && [ "$ROLE" = prefill ] && [ "$DPMODE" = external ] && [ "$DP" -gt 1 ]; then
  die "--connector mooncake: a prefill runs its DP ranks internally (one port, /query lists them): use --dp-mode internal"
fi
case "$CONN" in
  nixl|mooncake|mooncake-ascend|mooncake-store)
    if [ "$DPMODE" = external ]; then
      for ((r = 0; r < DP; r++)); do add_vllm $r $((PORT + r)); done
    else
      add_vllm 0 "$PORT"
    fi ;;
  sglang)
    dpflag=""; [ "$DP" -gt 1 ] && dpflag=" --dp-size $DP --enable-dp-attention"
    boot=""; [ "$ROLE" = prefill ] && boot=" --disaggregation-bootstrap-port $BOOT"
    cmds+=("python3 -m sglang.launch_server --model-path $MODEL --host $HOST --port $PORT --tp-size $TP$dpflag --disaggregation-mode $ROLE$boot --disaggregation-transfer-backend mooncake") ;;
  *) die "--connector must be nixl, mooncake, mooncake-ascend, mooncake-store or sglang" ;;
esac
if [ $PRINT = 1 ]; then printf '%s\n' "${cmds[@]}"; exit 0; fi
mkdir -p "$RUN"
i=0
for c in "${cmds[@]}"; do
  nohup bash -c "exec $c" >"$RUN/$ROLE-$PORT-$i.log" 2>&1 &
  echo $! >>"$RUN/engines.pids"
  echo "started pid $! (log $RUN/$ROLE-$PORT-$i.log): $c"
  i=$((i + 1))
done
