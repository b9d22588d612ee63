#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/launch_engine.sh - start (or --print) the real engines of one node of a PD deployment behind
# xpyd_router, with the --kv-transfer-config and environment each connector's own documentation prescribes.
# vLLM: external DP = one `vllm serve` per local rank (ports --port, --port+1, ...), internal DP = one process
# for the node's ranks (multi-node: --dp-size global, --dp-start-rank, --dp-local; non-head nodes headless).
# SGLang: internal DP = one server with --dp-size, external DP = one server per rank. --stop ends what a
# previous run in the same --run-dir started. Connectors and the router's --handoff for each:
#   nixl            vLLM NixlConnector                          --handoff kv-params
#   mooncake        vLLM MooncakeConnector (upstream v1)        --handoff mooncake (prefill: internal DP)
#   mooncake-ascend vllm-ascend MooncakeConnectorV1             --handoff kv-params
#   mooncake-store  vLLM MooncakeStoreConnector                 --handoff store
#   sglang          SGLang PD disaggregation                    --handoff bootstrap
set -euo pipefail
# flag | variable | default | meaning   (--help and the parser are generated from this table)
OPTS=(
  "--role|ROLE||prefill or decode (required)"
  "--connector|CONN||nixl, mooncake, mooncake-ascend, mooncake-store or sglang (required)"
  "--model|MODEL||model name or path (required)"
  "--host|HOST|0.0.0.0|address the engines' HTTP servers listen on"
  "--port|PORT|role|HTTP port of the node's first rank (role: 8100 for prefill, 8200 for decode)"
  "--dp|DP||shorthand for --dp-size N --dp-local N (one node)"
  "--dp-size|DPSIZE|1|data-parallel size of the whole engine (all nodes)"
  "--dp-local|DPLOCAL|all|DP ranks on this node (all: --dp-size)"
  "--dp-start-rank|DPSTART|0|first global DP rank on this node"
  "--dp-mode|DPMODE|external|external: a server per rank; internal: one server for the node's ranks"
  "--dp-address|DPADDR|127.0.0.1|address of the node holding DP rank 0 (vLLM --data-parallel-address)"
  "--dp-rpc-port|DPRPC|13345|vLLM --data-parallel-rpc-port"
  "--tp|TP|1|tensor-parallel size per rank"
  "--dp-attention|DPATT|off|SGLang internal DP: on adds --enable-dp-attention (data-parallel attention inside one TP group, for MLA/MoE models such as DeepSeek V3: the server uses --tp GPUs, which --dp-size must divide); off: --dp-size replicas of --tp GPUs each"
  "--gpus|GPUS||comma list of this node's GPU ids; each rank gets --tp of them in order (CUDA_VISIBLE_DEVICES)"
  "--side-host|SIDEHOST|auto|NIXL side-channel host others reach this node on (auto: --host, or this node's first address when --host is a wildcard)"
  "--side-port|SIDE|role|NIXL side-channel base port; vLLM adds the DP rank (role: 5600 prefill, 6600 decode)"
  "--kv-port|KVPORT|20001|mooncake-ascend kv_port base (plus the local rank)"
  "--bootstrap-port|BOOT|8998|prefill bootstrap server port (SGLang, vLLM MooncakeConnector)"
  "--mooncake-config|MCFG|mooncake.json|MOONCAKE_CONFIG_PATH for mooncake-store"
  "--hash-seed|HASHSEED|0|mooncake-store: PYTHONHASHSEED of every engine (prefills and decodes must share it: the store keys blocks by Python hashes)"
  "--prefill-sizes|PSIZES|own|mooncake-ascend: the prefill engine's DPxTP (own: this node's --dp-size x --tp when --role prefill; required otherwise)"
  "--decode-sizes|DSIZES|own|mooncake-ascend: the decode engine's DPxTP (own: this node's --dp-size x --tp when --role decode; required otherwise)"
  "--run-dir|RUN|/tmp/xpyd-engines|where the pid file and logs go"
  "--check-s|CHECK|2|after starting, seconds to watch for an engine that exits at once (reported as a failure)"
)
usage() {
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
  echo "usage: launch_engine.sh --role R --connector C --model M [options]   |   launch_engine.sh --stop [--run-dir DIR]"
  local o f v d h
  for o in "${OPTS[@]}"; do
    IFS='|' read -r f v d h <<<"$o"
    printf '  %-17s %s%s\n' "$f" "$h" "${d:+ (default: $d)}"
  done
  printf '  %-17s %s\n' --print "print the commands (runnable as printed), start nothing" --stop "stop what --run-dir's last run started"
}
die() { echo "launch_engine.sh: $*" >&2; exit 2; }
for o in "${OPTS[@]}"; do IFS='|' read -r f v d h <<<"$o"; printf -v "$v" '%s' "$d"; done
PRINT=0 STOP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --print) PRINT=1; shift; continue ;; --stop) STOP=1; shift; continue ;; -h|--help) usage; exit 0 ;;
  esac
  found=0
  for o in "${OPTS[@]}"; do
    IFS='|' read -r f v d h <<<"$o"
    if [ "$1" = "$f" ]; then
      [ $# -ge 2 ] || die "$f needs a value"
      printf -v "$v" '%s' "$2"; found=1; shift 2; break
    fi
  done
  [ $found = 1 ] || die "unknown argument '$1' (see --help)"
done
if [ $STOP = 1 ]; then
  [ -f "$RUN/engines.pids" ] || exit 0
  while read -r pid; do kill "$pid" 2>/dev/null || true; done <"$RUN/engines.pids"
  rm -f "$RUN/engines.pids"; exit 0
fi

# ---- checks and derived values ----
case "$ROLE" in prefill|decode) ;; *) die "--role must be prefill or decode" ;; esac
case "$CONN" in nixl|mooncake|mooncake-ascend|mooncake-store|sglang) ;;
  *) die "--connector must be nixl, mooncake, mooncake-ascend, mooncake-store or sglang" ;; esac
[ -n "$MODEL" ] || die "--model is required"
case "$DPMODE" in external|internal) ;; *) die "--dp-mode must be external or internal" ;; esac
if [ -n "$DP" ]; then DPSIZE=$DP; DPLOCAL=$DP; fi
[ "$DPLOCAL" = all ] && DPLOCAL=$DPSIZE
for n in "$DPSIZE" "$DPLOCAL" "$TP"; do [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "--dp-size, --dp-local and --tp take positive integers"; done
[[ "$DPSTART" =~ ^[0-9]+$ ]] || die "--dp-start-rank takes a non-negative integer"
[ $((DPSTART + DPLOCAL)) -le "$DPSIZE" ] || die "--dp-start-rank $DPSTART + --dp-local $DPLOCAL is more than --dp-size $DPSIZE"
[ "$PORT" = role ] && { [ "$ROLE" = prefill ] && PORT=8100 || PORT=8200; }
[ "$SIDE" = role ] && { [ "$ROLE" = prefill ] && SIDE=5600 || SIDE=6600; }
for n in "$PORT" "$SIDE" "$KVPORT" "$BOOT" "$DPRPC"; do [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 65535 ] || die "ports are 1-65535 (got '$n')"; done
if [ "$CONN" = mooncake ] && [ "$ROLE" = prefill ] && [ "$DPMODE" = external ] && [ "$DPSIZE" -gt 1 ]; then
  die "--connector mooncake: a prefill runs its DP ranks internally (one port, /query lists them): use --dp-mode internal"
fi
if [ "$CONN" = sglang ] && [ "$DPLOCAL" -ne "$DPSIZE" ]; then
  die "--connector sglang: multi-node DP is not generated by this helper (use SGLang's --nnodes/--node-rank directly)"
fi
if [ "$SIDEHOST" = auto ]; then
  case "$HOST" in 0.0.0.0|::|"") SIDEHOST=$( (hostname -I 2>/dev/null || true) | awk '{print $1}'); SIDEHOST=${SIDEHOST:-127.0.0.1} ;;
    *) SIDEHOST=$HOST ;; esac
fi
case "$DPATT" in on|off) ;; *) die "--dp-attention is on or off" ;; esac
if [ "$CONN" = mooncake-ascend ]; then
  [ "$PSIZES" = own ] && { [ "$ROLE" = prefill ] && PSIZES="${DPSIZE}x$TP" || die "--connector mooncake-ascend --role decode needs --prefill-sizes DPxTP (the prefill engine's)"; }
  [ "$DSIZES" = own ] && { [ "$ROLE" = decode ] && DSIZES="${DPSIZE}x$TP" || die "--connector mooncake-ascend --role prefill needs --decode-sizes DPxTP (the decode engine's)"; }
  for s in "$PSIZES" "$DSIZES"; do [[ "$s" =~ ^[1-9][0-9]*x[1-9][0-9]*$ ]] || die "--prefill-sizes/--decode-sizes take DPxTP, e.g. 2x8: got '$s'"; done
fi
if [ "$DPATT" = on ]; then
  [ "$CONN" = sglang ] && [ "$DPMODE" = internal ] || die "--dp-attention on is for --connector sglang with --dp-mode internal"
  [ $((TP % DPSIZE)) -eq 0 ] || die "--dp-attention on: --tp $TP must be a multiple of --dp-size $DPSIZE (SGLang checks tp_size % dp_size == 0)"
fi
IFS=',' read -r -a GPULIST <<<"$GPUS"
if [ -n "$GPUS" ]; then
  need=$((DPLOCAL * TP))
  [ "$DPATT" = on ] && need=$TP # attention DP shares the TP group's GPUs
  [ ${#GPULIST[@]} -ge $need ] || die "--gpus lists ${#GPULIST[@]} GPUs; this node's $DPLOCAL rank(s) x --tp $TP need $need"
  [ ${#GPULIST[@]} -eq $need ] || die "--gpus lists ${#GPULIST[@]} GPUs; this node's engines use $need (DP x TP, or TP with --dp-attention on)"
fi
gpus_for() { # first-local-rank count -> "0,1,..." (empty without --gpus)
  [ -n "$GPUS" ] || return 0
  local from=$(($1 * TP)) n=$(($2 * TP)) out="" i
  for ((i = from; i < from + n; i++)); do out+="${out:+,}${GPULIST[$i]}"; done
  echo "$out"
}
if [ "$ROLE" = prefill ]; then KVROLE=kv_producer; else KVROLE=kv_consumer; fi

# ---- the commands ----
cmds=()
add() { # env-assignments command...
  local env=$1; shift
  cmds+=("${env:+env $env }$*")
}
vllm_cmd() { # local-index port nranks(local) external?
  local i=$1 p=$2 n=$3 ext=$4 env="" cfg dpargs="" g
  g=$(gpus_for "$i" "$n")
  [ -n "$g" ] && env+="CUDA_VISIBLE_DEVICES=$g "
  case "$CONN" in
    nixl)
      env+="VLLM_NIXL_SIDE_CHANNEL_HOST=$SIDEHOST VLLM_NIXL_SIDE_CHANNEL_PORT=$SIDE "
      # a KV load failure fails the request (the decode does not recompute): vLLM's default since PR #34896;
      # "kv_load_failure_policy" is not written, so the line also starts vLLM < 0.11.1, which refuses the key
      cfg="{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"$KVROLE\"}" ;;
    mooncake)
      [ "$ROLE" = prefill ] && env+="VLLM_MOONCAKE_BOOTSTRAP_PORT=$BOOT "
      cfg="{\"kv_connector\":\"MooncakeConnector\",\"kv_role\":\"$KVROLE\"}" ;;
    mooncake-ascend) # both roles' parallel sizes, which the connector maps its KV layout with
      cfg="{\"kv_connector\":\"MooncakeConnectorV1\",\"kv_role\":\"$KVROLE\",\"kv_port\":\"$((KVPORT + i))\",\"engine_id\":\"$ROLE-$p\",\"kv_connector_module_path\":\"vllm_ascend.distributed.mooncake_connector\",\"kv_connector_extra_config\":{\"prefill\":{\"dp_size\":${PSIZES%x*},\"tp_size\":${PSIZES#*x}},\"decode\":{\"dp_size\":${DSIZES%x*},\"tp_size\":${DSIZES#*x}}}}" ;;
    mooncake-store) # block hashes must agree across processes: one Python hash seed for all of them
      env+="MOONCAKE_CONFIG_PATH=$MCFG PYTHONHASHSEED=$HASHSEED "
      cfg="{\"kv_connector\":\"MooncakeStoreConnector\",\"kv_role\":\"$KVROLE\"}" ;;
  esac
  if [ "$DPSIZE" -gt 1 ]; then
    dpargs=" --data-parallel-size $DPSIZE --data-parallel-address $DPADDR --data-parallel-rpc-port $DPRPC"
    if [ "$ext" = 1 ]; then
      dpargs+=" --data-parallel-rank $((DPSTART + i))"
    else
      dpargs+=" --data-parallel-size-local $DPLOCAL --data-parallel-start-rank $DPSTART"
      [ "$DPSTART" -gt 0 ] && dpargs+=" --headless" # the API server runs on the node with rank 0
    fi
  fi
  add "${env% }" "vllm serve $MODEL --host $HOST --port $p --tensor-parallel-size $TP$dpargs --kv-transfer-config '$cfg'"
}
case "$CONN" in
  sglang)
    if [ "$DPMODE" = internal ] || [ "$DPSIZE" -eq 1 ]; then
      if [ "$DPATT" = on ]; then g=$(gpus_for 0 1); else g=$(gpus_for 0 "$DPLOCAL"); fi
      env=""; [ -n "$g" ] && env="CUDA_VISIBLE_DEVICES=$g"
      dpflag=""; [ "$DPSIZE" -gt 1 ] && dpflag=" --dp-size $DPSIZE"
      [ "$DPATT" = on ] && dpflag+=" --enable-dp-attention"
      boot=""; [ "$ROLE" = prefill ] && boot=" --disaggregation-bootstrap-port $BOOT"
      add "$env" "python3 -m sglang.launch_server --model-path $MODEL --host $HOST --port $PORT --tp-size $TP$dpflag --disaggregation-mode $ROLE$boot --disaggregation-transfer-backend mooncake"
    else
      for ((i = 0; i < DPLOCAL; i++)); do
        g=$(gpus_for "$i" 1); env=""; [ -n "$g" ] && env="CUDA_VISIBLE_DEVICES=$g"
        boot=""; [ "$ROLE" = prefill ] && boot=" --disaggregation-bootstrap-port $((BOOT + i))"
        add "$env" "python3 -m sglang.launch_server --model-path $MODEL --host $HOST --port $((PORT + i)) --tp-size $TP --disaggregation-mode $ROLE$boot --disaggregation-transfer-backend mooncake"
      done
    fi ;;
  *)
    if [ "$DPMODE" = external ]; then
      for ((i = 0; i < DPLOCAL; i++)); do vllm_cmd "$i" $((PORT + i)) 1 1; done
    else
      vllm_cmd 0 "$PORT" "$DPLOCAL" 0
    fi ;;
esac
if [ $PRINT = 1 ]; then printf '%s\n' "${cmds[@]}"; exit 0; fi

# ---- start, and report engines that die at once ----
mkdir -p "$RUN"
pids=()
i=0
for c in "${cmds[@]}"; do
  log="$RUN/$ROLE-$PORT-$i.log"
  nohup bash -c "exec $c" >"$log" 2>&1 &
  pids+=($!)
  echo $! >>"$RUN/engines.pids"
  echo "started pid $! (log $log): $c"
  i=$((i + 1))
done
now() { date +%s.%N; }
end=$(awk -v n="$(now)" -v c="$CHECK" 'BEGIN{printf "%.3f", n + c}')
failed=0
while awk -v n="$(now)" -v e="$end" 'BEGIN{exit !(n < e)}'; do
  for k in "${!pids[@]}"; do
    if ! kill -0 "${pids[$k]}" 2>/dev/null; then
      echo "launch_engine.sh: pid ${pids[$k]} exited at once; its log ($RUN/$ROLE-$PORT-$k.log):" >&2
      tail -5 "$RUN/$ROLE-$PORT-$k.log" >&2
      failed=1; unset 'pids[k]'
    fi
  done
  [ $failed = 1 ] && break
  sleep 0.1
done
exit $failed
