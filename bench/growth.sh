#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/growth.sh - how a request's cost grows with its prompt, on the P->D path (kv-params: the body goes to a
# prefill, then to a decode) and on one hop (--handoff none), against the floor relay (bench/floor_relay.c, the
# same two exchanges with next to no user-space work) measured in the same run:
#   1. CPU per request (the process's utime+stime over N requests, 4 keep-alive clients, the relay alone on
#      CPU 1) for prompts of 100 B to 128 KB, and the growth per KB (least squares over the sizes);
#   2. peak memory: 8 bodies of 1, 4 and 16 MiB in flight at once (a decode that holds its answer 300 ms),
#      peak RSS (VmHWM, reset before each size) over the idle RSS, per byte of the bodies.
#   bench/growth.sh [requests per size=400] [build dir=build]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
N=${1:-400}
B=$(cd "${2:-build}" && pwd)/bin
WORK=$(mktemp -d /tmp/xpyd-growth.XXXXXX)
trap 'xpyd_cluster_down; rm -rf "$WORK"' EXIT INT TERM
sim() { # name args... : a sim on CPU 0 (its port in $WORK/name.port)
  local n=$1
  shift
  taskset -c 0 $B/xpyd_sim --port 0 --port-file "$WORK/$n.port" --log-level warn --max-model-len 40000000 \
    --max-batch 100000 --max-body-bytes 268435456 --prefill-us-per-token 0 --decode-us-per-token 0 --kv-lease-ms 600000 "$@" \
    >"$WORK/$n.log" 2>&1 &
  PIDS+=($!)
  xpyd_wait_file "$WORK/$n.port" 10
}
relay() { # name cmd... (PORT in it: the port it gets): a relay on CPU 1; its port and pid in $WORK/name.{port,pid}
  local n=$1 port a args=()
  shift
  port=$(xpyd_free_port)
  for a in "$@"; do args+=("${a/PORT/$port}"); done
  taskset -c 1 "${args[@]}" >"$WORK/$n.log" 2>&1 &
  PIDS+=($!)
  echo $! >"$WORK/$n.pid"
  echo "$port" >"$WORK/$n.port"
  xpyd_wait_http "http://127.0.0.1:$port/v1/models" 10
}
sim p --role prefill
sim d --role decode
sim h --role both
sim slow --role both --decode-us-per-token 300000
P=$(cat "$WORK/p.port") D=$(cat "$WORK/d.port") H=$(cat "$WORK/h.port") S=$(cat "$WORK/slow.port")
R=($B/xpyd_router --log-level error --threads 1 --max-body-bytes 67108864 --port PORT)
relay rpd "${R[@]}" -p 127.0.0.1:$P -d 127.0.0.1:$D
relay rhop "${R[@]}" --handoff none -d 127.0.0.1:$H
relay rmem "${R[@]}" --handoff none -d 127.0.0.1:$S
relay fpd $B/xpyd_floor_relay pd PORT $D $P
relay fhop $B/xpyd_floor_relay hop PORT $H

echo "# Growth with the prompt — $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo |
  cut -d: -f2 | xargs)), $(uname -r); bench/growth.sh $N"
WORK=$WORK N=$N python3 - <<'PY'
import http.client, json, os, threading, time

W, N = os.environ["WORK"], int(os.environ["N"])
port = lambda n: int(open("%s/%s.port" % (W, n)).read())
pid = lambda n: int(open("%s/%s.pid" % (W, n)).read())


def cpu_s(p):  # every thread's time on a CPU, in ns (schedstat), as seconds
    t = 0
    for tid in os.listdir("/proc/%d/task" % p):
        with open("/proc/%d/task/%s/schedstat" % (p, tid)) as f:
            t += int(f.read().split()[0])
    return t / 1e9


def status_kib(p, key):
    for l in open("/proc/%d/status" % p):
        if l.startswith(key + ":"):
            return int(l.split()[1])


def body(size):
    words = ("lorem ipsum dolor sit amet consectetur adipiscing elit " * (size // 50 + 2))[:size]
    return json.dumps({"model": "sim-model", "prompt": words, "max_tokens": 2, "stream": False}).encode()


def load(p, data, n, clients=4):
    errors = []

    def run(k):
        try:
            c = http.client.HTTPConnection("127.0.0.1", p, timeout=60)
            for _ in range(k):
                c.request("POST", "/v1/completions", data, {"Content-Type": "application/json"})
                r = c.getresponse()
                out = r.read()
                if r.status != 200:
                    errors.append((r.status, out[:200]))
            c.close()
        except Exception as e:  # counted: a relay that drops a connection fails the run
            errors.append(repr(e))

    ts = [threading.Thread(target=run, args=(n // clients,)) for _ in range(clients)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    if errors:
        raise SystemExit("failed requests: %r" % errors[:3])
    return n // clients * clients


SIZES = [100, 1024, 8192, 32768, 131072]
rows = {}
for name, label in [("rpd", "xpyd_router P->D"), ("fpd", "floor relay P->D"), ("rhop", "xpyd_router one hop"),
                    ("fhop", "floor relay one hop")]:
    load(port(name), body(1000), 40)  # warm-up: connections, allocator
    rows[name] = []
    for size in SIZES:
        data = body(size)
        c0 = cpu_s(pid(name))
        done = load(port(name), data, N)
        rows[name].append((cpu_s(pid(name)) - c0) / done * 1e6)


def slope(ys):  # µs per KB, least squares over the sizes
    xs = [s / 1024 for s in SIZES]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


print("\n## 1. CPU per request against prompt size (%d requests per size)\n" % N)
print("| relay | " + " | ".join("%s B" % s if s < 1024 else "%d KB" % (s // 1024) for s in SIZES) +
      " | growth µs/KB |")
print("|---" * (len(SIZES) + 2) + "|")
for name, label in [("rpd", "xpyd_router P->D (kv-params)"), ("fpd", "floor relay P->D"),
                    ("rhop", "xpyd_router one hop (none)"), ("fhop", "floor relay one hop")]:
    print("| %s | %s | %.2f |" % (label, " | ".join("%.0f" % v for v in rows[name]), slope(rows[name])))
for a, b, what in [("rpd", "fpd", "P->D"), ("rhop", "fhop", "one hop")]:
    print("\n%s: the router's growth %.2f µs/KB, the floor's %.2f µs/KB: the router's own %.2f µs/KB "
          "(ratio %.2f)" % (what, slope(rows[a]), slope(rows[b]), slope(rows[a]) - slope(rows[b]),
                             slope(rows[a]) / slope(rows[b])), end="")
print("\n\n## 2. Router memory with 8 bodies in flight at once (one hop, a decode that answers after 300 ms)\n")
print("| body | idle RSS MiB | peak RSS MiB | peak over idle per body byte |")
print("|---|---|---|---|")
rp, rport = pid("rmem"), port("rmem")
for mib in (1, 4, 16):
    data = json.dumps({"model": "sim-model", "prompt": [0] * (mib << 19), "max_tokens": 1},
                      separators=(",", ":")).encode()
    time.sleep(3)  # the router purges its allocator's dirty pages once idle
    idle = status_kib(rp, "VmRSS")
    with open("/proc/%d/clear_refs" % rp, "w") as f:
        f.write("5")  # VmHWM from now
    load(rport, data, 8, clients=8)
    peak = status_kib(rp, "VmHWM")
    print("| %d MiB (%d bytes) | %.0f | %.0f | %.2f |" % (mib, len(data), idle / 1024, peak / 1024,
                                                        (peak - idle) * 1024 / (8 * len(data))))
PY
