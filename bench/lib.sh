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
