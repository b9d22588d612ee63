# SPDX-License-Identifier: Apache-2.0
"""Chaos run: a router in front of sims that fail in every way we can make them (killed and restarted,
injected 500s, streams cut mid-way, stalls) and raw engines that answer garbage, reset, drip or never answer,
with clients that send mixed requests and hang up at random points. Bounded in requests and time.

Every request a client completes is classified from what the client saw:
  completed  a 200 with a whole answer (JSON with choices, or a stream ending in [DONE] without an error event)
  failed     a clear error: a status >= 400 with an OpenAI error body, or a stream whose last events are an
             error event then [DONE]
  hung_up    the client itself closed early (chosen at random)
  lost       anything else: a 200 with an empty or truncated body, a reset without an answer, ... (must be 0)
After the run: the router is alive, its in-flight and outstanding-token gauges are back to zero, the prefill
sims hold no more KV leases than the chaos itself can strand (stranded_bound(); their lease expiry is set
beyond the round, so it frees nothing), and the router exits 0 on SIGTERM.

Used by test_chaos.py (small, in CI) and bench/chaos.sh (larger, reported in bench/RESULTS.md)."""
import json
import os
import random
import signal
import socket
import threading
import time

import xpyd_testlib as t


class BadEngine:
    """A raw TCP engine on an ephemeral loopback port misbehaving in one way per connection, in turn:
    garbage bytes, a reset, a drip of a valid stream that stops, a stall (never answers)."""

    MODES = ("garbage", "reset", "drip", "stall")

    def __init__(self):
        self.conns = []
        self.generate_requests = 0
        self.raw = t.RawServer(lambda c, n: self.serve(c, self.MODES[n % 4]))
        self.port = self.raw.port
        self.stop_ev = self.raw.stop_ev

    def serve(self, c, mode):
        self.conns.append(c)
        try:
            c.settimeout(5)
            got = b""
            while b"\r\n\r\n" not in got:
                d = c.recv(65536)
                if not d:
                    return
                got += d
            if got.startswith(b"GET /health"):
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                return
            self.generate_requests += 1  # each may have carried a prefill's KV, which this engine never frees
            if mode == "garbage":
                c.sendall(b"\x00\xffHTTP/9 what\r\n\r\n{{{{")
            elif mode == "reset":
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            elif mode == "drip":
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
                for ch in b'data: {"choices":[{"text":"x"}]}\n\n'[:20]:
                    c.sendall(bytes([ch]))
                    time.sleep(0.02)
            elif mode == "stall":
                self.stop_ev.wait(30)
        except OSError:
            pass
        finally:
            try:
                c.close()
            except OSError:
                pass

    def stop(self):
        self.raw.stop()


def classify_stream(status, raw, hung_up):
    if hung_up:
        return "hung_up"
    if status != 200:
        try:
            err = json.loads(raw.split(b"\r\n\r\n", 1)[-1] if raw.startswith(b"HTTP") else raw)["error"]
            return "failed" if err.get("message") and err.get("code") == status else "lost"
        except (ValueError, KeyError, TypeError, AttributeError):
            return "lost"
    events = [e[len(b"data: "):] for e in raw.split(b"\n\n") if e.startswith(b"data: ")]
    if not events or events[-1] != b"[DONE]":
        return "lost"  # a 200 stream that ended without [DONE]
    for e in events[:-1]:
        try:
            if "error" in json.loads(e):
                return "failed" if e is events[-2] else "lost"
        except ValueError:
            return "lost"
    return "completed"


def one_request(port, rng, stats, lock):
    stream = rng.random() < 0.6
    body = {"prompt": "chaos " * rng.randint(1, 20), "max_tokens": rng.randint(1, 12), "stream": stream}
    hang_up_after = rng.randint(0, 300) if rng.random() < 0.1 else None
    data = json.dumps(body).encode()
    outcome = "lost"
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=20)
        try:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
            got = b""
            hung = False
            while True:
                if hang_up_after is not None and len(got) >= hang_up_after:
                    hung = True
                    break
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
        finally:
            s.close()
        if hung:
            outcome = "hung_up"
        else:
            head, _, rest = got.partition(b"\r\n\r\n")
            status = int(head.split()[1]) if head.startswith(b"HTTP/1.1 ") else 0
            if b"transfer-encoding: chunked" in head.lower():
                rest = dechunk(rest)
            if status == 200 and not stream:
                try:
                    outcome = "completed" if json.loads(rest)["choices"] else "lost"
                except (ValueError, KeyError, TypeError):
                    outcome = "lost"
            else:
                outcome = classify_stream(status, rest, False)
    except OSError:
        outcome = "lost"  # the router reset or timed out on us without an answer
    except Exception as e:  # an answer this client cannot even read is lost too
        outcome = "lost"
        with lock:
            stats.setdefault("lost_examples", []).append(repr(e)[:200])
    with lock:
        stats[outcome] = stats.get(outcome, 0) + 1
        stats["sent"] = stats.get("sent", 0) + 1


def dechunk(b):
    out, pos = b"", 0
    while True:
        nl = b.find(b"\r\n", pos)
        if nl < 0:
            return out + b"<truncated>"
        try:
            n = int(b[pos:nl].split(b";")[0], 16)
        except ValueError:
            return out + b"<bad-chunk>"
        if n == 0:
            return out
        out += b[nl + 2:nl + 2 + n]
        pos = nl + 2 + n + 2


# KV leases the chaos itself may strand, beyond any router's reach. A prefill's KV is freed when a decode pulls
# it, or when a decode given it sees the request cancelled; it stays held (until the sim's lease expiry, set
# beyond the round) only when the last decode request that carried it went to an engine that never reads it:
#  - a decode SIGKILLed before it pulled (at most the requests in flight on it: one per client, per kill;
#    the router cannot know whether it had pulled: real engines send their answer head first),
#  - the garbage engine (every generate request it got),
#  - the decode with injected failures (it answers 500 before reading; every injected failure),
#  - a release dispatched while no decode was usable (no engine to send it to).
# stranded_bound() is the sum of those causes as the round counted them. A router that does not hand the decode
# the prefill's KV strands every lease (~240; the 'decode-without-kv-params' mutant in tests/mutation), which
# the check before this one (3 s lease, 20 s wait) let pass.
def stranded_bound(report, clients):
    return (report["kills"] * clients + report["bad_engine_requests"] + report["decode_injected_failures"] +
            report["router_kv_release_dispatches"])


def run(requests=300, clients=8, seconds=60, seed=1, log=print, router_args=(), kill_points=None, profile="all"):
    """Runs one bounded chaos round; returns the report dict (asserting nothing itself).

    kill_points: None kills the decode three times at random moments (0.3-0.8 s apart, down 0.1-0.4 s).
    A list of (kill_at, restart_at) request counts kills it once `kill_at` requests have been answered and
    restarts it once `restart_at` have: the faults then land at the same points of the workload in every
    round, so two configurations can be compared on the same chaos (bench/chaos.sh --compare).

    profile "all" is every fault above. "deaths" keeps only engine deaths and what migration and prefill
    fallback answer: the killed decode, a decode cutting every stream after 3 tokens, one preempting
    (stop_reason "recomputed") after 5, a plain one, a prefill failing 10 %; no garbage engine and no random
    decode 500s, whose outcome depends on retry timing more than on anything the router decides."""
    rng = random.Random(seed)
    procs = []
    bad = BadEngine()
    try:
        # the lease outlives the whole round, so the sims' own expiry can free nothing before the check below:
        # what is left when the router is idle was left by the router (or by the chaos itself, see STRANDED)
        lease = ["--kv-lease-ms", str((seconds + 120) * 1000)]
        prefills = [t.sim("--role", "prefill", *lease), t.sim("--role", "prefill", "--fail-rate", "0.1", *lease)]
        procs += prefills
        decodes = [t.sim("--role", "decode", "--decode-us-per-token", "2000"),
                   t.sim("--role", "decode", "--fail-after-tokens", "3", "--decode-us-per-token", "1000"),
                   t.sim("--role", "decode", "--fail-rate", "0.2") if profile == "all" else
                   t.sim("--role", "decode", "--recompute-after-tokens", "5", "--decode-us-per-token", "1000")]
        if profile == "deaths":
            decodes.append(t.sim("--role", "decode", "--decode-us-per-token", "1000"))
        procs += decodes
        killable = decodes[0]
        killed_port = killable.port
        router = t.Proc("xpyd_router", [
            "--port", "0", "--log-level", "error", "--threads", "2",
            "-p"] + ["127.0.0.1:%d" % p.port for p in prefills] + [
            "-d"] + ["127.0.0.1:%d" % d.port for d in decodes] + (["127.0.0.1:%d" % bad.port] if profile == "all" else []) + [
            "--first-token-timeout-ms", "1500", "--stream-idle-timeout-ms", "700", "--connect-timeout-ms", "500",
            "--health-interval-ms", "200", "--health-timeout-ms", "300", "--eject-base-ms", "200",
            "--retry-backoff-ms", "5"] + list(router_args))
        procs.append(router)
        stats, lock = {}, threading.Lock()
        deadline = time.monotonic() + seconds
        per_client = requests // clients

        def client(i):
            crng = random.Random(seed * 1000 + i)
            for _ in range(per_client):
                if time.monotonic() > deadline:
                    return
                one_request(router.port, crng, stats, lock)

        ths = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for th in ths:
            th.start()
        # kill and restart a decode while the load runs
        kills = 0
        answered = lambda: stats.get("sent", 0)
        alive = lambda: any(th.is_alive() for th in ths)

        def wait_answered(n):
            while alive() and answered() < n:
                time.sleep(0.002)
            return alive()

        while alive() and kills < (3 if kill_points is None else len(kill_points)):
            if kill_points is None:
                time.sleep(rng.uniform(0.3, 0.8))
            elif not wait_answered(kill_points[kills][0]):
                break
            killable.p.send_signal(signal.SIGKILL)
            killable.p.wait()
            killable.stopped = True
            if kill_points is None:
                time.sleep(rng.uniform(0.1, 0.4))
            else:
                wait_answered(kill_points[kills][1])
            # back on the same port, as a restarted engine would be: the router's health checks and
            # passive ejection take it out while it is down and back in once it answers
            killable = t.sim("--role", "decode", "--decode-us-per-token", "2000", "--port", str(killed_port))
            procs.append(killable)
            kills += 1
            log("killed and restarted the decode on port %d (%d)" % (killed_port, kills))
        for th in ths:
            th.join()
        report = dict(stats)
        report.setdefault("lost", 0)
        report["kills"] = kills
        report["router_alive"] = router.alive()
        t.wait_until(lambda: t.router_idle(router.port), timeout=20, what="router load back to zero")
        report["router_idle"] = True
        m = t.metrics(router.port)
        report["router_kv_release_dispatches"] = m.get("xpyd_kv_release_dispatches_total", 0)
        report["bad_engine_requests"] = bad.generate_requests
        report["decode_injected_failures"] = t.metric(decodes[2].port, 'xpyd_sim:faults_injected_total{kind="fail_rate"}',
                                                      default=0)
        report["profile"] = profile
        report["leases_stranded_bound"] = stranded_bound(report, clients)
        leases = lambda: sum(t.metric(p.port, "xpyd_sim:kv_leases_active") for p in prefills)
        # releases reach the prefills asynchronously (dispatch-and-cancel, a decode's pull): wait for them
        try:
            t.wait_until(lambda: leases() <= report["leases_stranded_bound"], timeout=10, what="KV leases freed")
        except AssertionError:
            pass
        report["leases_held"] = leases()
        report["leases_expired"] = sum(t.metric(p.port, "xpyd_sim:kv_leases_expired_total") for p in prefills)
        report["leases_created"] = sum(t.metric(p.port, "xpyd_sim:kv_leases_created_total") for p in prefills)
        report["leases_released"] = sum(t.metric(p.port, "xpyd_sim:kv_leases_released_total") +
                                        t.metric(p.port, "xpyd_sim:kv_leases_cancelled_total", default=0)
                                        for p in prefills)
        report["router_active_requests"] = m.get("xpyd_active_requests", 0)
        report["router_retries"] = m.get("xpyd_retries_total", 0)
        report["router_migrations"] = m.get("xpyd_migrations_total", 0)
        report["router_errors"] = {k.split('"')[1]: v for k, v in m.items()
                                   if k.startswith("xpyd_request_errors_total{") and v}
        report["router_prefill_fallbacks"] = m.get("xpyd_prefill_fallbacks_total", 0)
        report["router_rss_kib"] = t.rss_kib(router.p.pid)
        router.stop()  # raises unless it exits 0
        report["router_exit_0"] = True
        report["killed_port"] = killed_port
        return report
    finally:
        for p in procs:
            p.stop(check=False)
        bad.stop()




def fixed_kill_points(requests, kills=4, down=0.04):
    """Kills spread evenly over the workload, each down while `down` of the requests are answered."""
    step = requests / (kills + 1)
    return [(int(step * (k + 1)), int(step * (k + 1) + requests * down)) for k in range(kills)]


if __name__ == "__main__":
    import sys
    args = sys.argv[1:]
    compare, profile = 0, "all"
    if "--profile" in args:  # --profile deaths: see run()
        i = args.index("--profile")
        profile = args[i + 1]
        del args[i:i + 2]
    if "--compare" in args:  # --compare R: R rounds of (router flags as given) vs (--migration-limit 0
        i = args.index("--compare")  # --prefill-fallback off), alternated, with fixed kill points
        compare = int(args[i + 1])
        del args[i:i + 2]
    n = int(args[0]) if len(args) > 0 else 2000
    secs = int(args[1]) if len(args) > 1 else 300
    flags = args[2:]
    say = lambda m: print(m, file=sys.stderr)
    if not compare:
        print(json.dumps(run(requests=n, clients=16, seconds=secs, log=say, router_args=flags, profile=profile),
                         sort_keys=True))
    else:
        points = fixed_kill_points(n)
        for r in range(compare):
            for name, extra in (("on", []), ("off", ["--migration-limit", "0", "--prefill-fallback", "off"])):
                rep = run(requests=n, clients=16, seconds=secs, log=say, router_args=flags + extra,
                          kill_points=points, profile=profile)
                rep["config"], rep["round"], rep["kill_points"] = name, r + 1, points
                print(json.dumps(rep, sort_keys=True), flush=True)
