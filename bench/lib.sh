# SPDX-License-Identifier: Apache-2.0
# bench/lib.sh - what the benchmark scripts share (sourced after scripts/lib.sh).

# bench_nginx_conf DIR UPSTREAM_PORT PLAIN_PORT [TLS_PORT CERT KEY]: writes DIR/nginx.conf, nginx as the
# benchmarks compare it: one worker, no access log, HTTP/1.1 to the upstream with keep-alive (256 idle
# connections), proxy_buffering and proxy_request_buffering off (each upstream read is relayed at once, as the
# router does); with TLS_PORT also a TLS listener (TLS 1.2/1.3, shared session cache and tickets).
bench_nginx_conf() {
  local dir=$1 up=$2 plain=$3 tls=${4:-} cert=${5:-} key=${6:-} tls_conf="" tls_listen=""
  if [ -n "$tls" ]; then
    tls_conf="ssl_certificate $cert; ssl_certificate_key $key;
  ssl_protocols TLSv1.2 TLSv1.3; ssl_session_cache shared:SSL:10m; ssl_session_tickets on;"
    tls_listen="listen 127.0.0.1:$tls ssl;"
  fi
  mkdir -p "$dir"
  cat >"$dir/nginx.conf" <<NGX
worker_processes 1;
daemon off;
user root;
pid $dir/nginx.pid;
error_log $dir/error.log;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path $dir; proxy_temp_path $dir; fastcgi_temp_path $dir;
  uwsgi_temp_path $dir; scgi_temp_path $dir;
  upstream decode { server 127.0.0.1:$up; keepalive 256; }
  $tls_conf
  server {
    listen 127.0.0.1:$plain;
    $tls_listen
    location / { proxy_pass http://decode; proxy_http_version 1.1; proxy_set_header Connection "";
                 proxy_buffering off; proxy_request_buffering off; }
  }
}
NGX
}

# bench_wait_traced PID: until strace has attached to every thread of PID (bounded: 10 s).
bench_wait_traced() {
  local i t ok
  for i in $(seq 1 200); do
    ok=1
    for t in /proc/$1/task/*; do grep -q '^TracerPid:[[:space:]]*0$' "$t/status" && ok=0; done
    [ $ok = 1 ] && return 0
    sleep 0.05
  done
  echo "strace did not attach to $1" >&2
  return 1
}

# bench_syscalls_per STRACE_FILE N DIGITS: from the summary of `strace -c -f`, the system calls per unit (N
# units: requests, tokens) and the five most frequent, as "TOTAL|name x, name y, ..." with DIGITS decimals.
bench_syscalls_per() {
  python3 - "$1" "$2" "$3" <<'PY'
import sys
rows = []
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) >= 5 and f[0][0].isdigit() and f[-1] != "total":
        rows.append((int(f[3]), f[-1]))
n, fmt = max(float(sys.argv[2]), 1.0), "%%.%sf" % sys.argv[3]
top = ", ".join(("%s " + fmt) % (name, c / n) for c, name in sorted(rows, reverse=True)[:5])
print((fmt + "|%s") % (sum(c for c, _ in rows) / n, top))
PY
}

# bench_certs DIR: a CA (DIR/ca.pem) and a server certificate for localhost and 127.0.0.1 signed by it
# (DIR/srv.pem, DIR/srv.key), ECDSA P-256, valid two days.
bench_certs() {
  ( cd "$1"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.pem -days 2 \
      -subj "/CN=xpyd bench CA" 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout srv.key -out srv.csr -subj "/CN=localhost" \
      2>/dev/null
    printf "subjectAltName=DNS:localhost,IP:127.0.0.1\n" >ext
    openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out srv.pem -days 2 -extfile ext 2>/dev/null )
}

# bench_cpu_ticks PID...: the CPU time (user + system, clock ticks) the processes used so far.
bench_cpu_ticks() { local t=0 p; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo $t; }

# bench_at_once N CA URL_A "PIDS_A" URL_B "PIDS_B": two servers measured at the same time. An xpyd_bench per
# server (N streamed 16-token completions, 32 at once, keep-alive, CA to verify TLS; on CPU 0, $B/xpyd_bench),
# both started together; prints the CPU µs per request of A and of B (from /proc, over the servers' PIDS).
# Both see the same machine, so their ratio moves far less between rounds than sequential rounds do.
# BENCH_AT_ONCE_WORKLOAD: xpyd_bench's workload flags instead of the random 16-token prompts.
bench_at_once() {
  local n=$1 ca=$2 ua=$3 pa=$4 ub=$5 pb=$6 a0 b0 a1 b1 w1 w2 wl
  read -r -d '' -a wl <<<"${BENCH_AT_ONCE_WORKLOAD:---random-input-len 16 --random-output-len 16 --ignore-eos}" || true
  local args=(--tls-ca "$ca" --num-prompts "$n" --max-concurrency 32 "${wl[@]}" --disable-tqdm)
  a0=$(bench_cpu_ticks $pa) b0=$(bench_cpu_ticks $pb)
  taskset -c 0 "$B/xpyd_bench" --base-url "$ua" "${args[@]}" >/dev/null &
  w1=$!
  taskset -c 0 "$B/xpyd_bench" --base-url "$ub" "${args[@]}" >/dev/null &
  w2=$!
  wait $w1 $w2 || true
  a1=$(bench_cpu_ticks $pa) b1=$(bench_cpu_ticks $pb)
  python3 -c "hz = $(getconf CLK_TCK); print('%.1f %.1f' % (($a1 - $a0) / hz / $n * 1e6, ($b1 - $b0) / hz / $n * 1e6))"
}

# bench_ratios LABEL RATIO...: "LABEL: median M, range LO-HI, K of N <= 1".
bench_ratios() {
  python3 - "$@" <<'PY'
import statistics, sys
x = [float(v) for v in sys.argv[2:]]
print("%s: median %.3f, range %.3f-%.3f, %d of %d <= 1"
      % (sys.argv[1], statistics.median(x), min(x), max(x), sum(v <= 1 for v in x), len(x)))
PY
}
