# SPDX-License-Identifier: Apache-2.0
"""--max-connections: a connection over the cap gets 503 + Retry-After + Connection: close (counted), never a
silent reset; slots come back as connections close. Out of file descriptors, the router waits (the connections
stay in the listen queue) instead of spinning on accept."""
import json
import os
import resource
import socket
import time

import xpyd_testlib as t


def keepalive_conn(port, path="/health"):
    c = socket.create_connection(("127.0.0.1", port))
    c.settimeout(5)
    c.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode())
    got = b""
    while b"}" not in got:
        chunk = c.recv(4096)
        if not chunk:
            break
        got += chunk
    return c, got


def tcp_sockets(port):
    """(state, rx_queue) of every TCP socket whose local port is port (/proc/net/tcp{,6}: state 0A LISTEN, 01
    ESTABLISHED, 08 CLOSE_WAIT; a LISTEN socket's rx_queue is its accept queue)."""
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if int(f[1].rsplit(":", 1)[1], 16) == port:
                yield f[3], int(f[4].split(":")[1], 16)


def accept_backlog(port):
    """Connections waiting in the kernel for the listener on port to accept them."""
    for state, rx in tcp_sockets(port):
        if state == "0A":
            return rx
    raise AssertionError("no listener on port %d" % port)


def open_on_router_side(port):
    """Connections to port the router has not closed yet (ESTABLISHED, or CLOSE_WAIT: the client closed first):
    once it closes one it has also stopped counting it."""
    return sum(1 for state, _ in tcp_sockets(port) if state in ("01", "08"))


class MaxConnections(t.TestCase):
    def test_cap(self):
        p, d = self.start(t.sim("--role", "prefill")), self.start(t.sim("--role", "decode"))
        r = self.start(t.router([p.port], [d.port], "--max-connections", "2", "--threads", "1"))
        a, got = keepalive_conn(r.port)
        self.assertTrue(got.startswith(b"HTTP/1.1 200"), got)
        b, got = keepalive_conn(r.port)
        self.assertTrue(got.startswith(b"HTTP/1.1 200"), got)
        # the third gets an answer it can act on, not a reset
        status, hdrs, body = t.raw_exchange(r.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                            b"Content-Length: 2\r\n\r\n{}")
        self.assertOpenAIError(status, json.loads(body), 503, "max-connections")
        self.assertEqual(hdrs.get("retry-after"), "1")
        self.assertEqual(hdrs.get("connection"), "close")
        a.close()
        b.close()
        # slots come back: once both are gone, /metrics itself is served and counts the refusals (polls made
        # before the router saw the closes may have been refused too)
        t.wait_until(lambda: t.metric(r.port, "xpyd_client_connections") <= 1, what="slots freed")
        self.assertGreaterEqual(t.metric(r.port, 'xpyd_client_rejected_total{reason="over_capacity"}'), 1)
        self.assertEqual(t.metric(r.port, 'xpyd_client_rejected_total{reason="over_capacity"}'),
                         t.metric(r.port, "xpyd_client_connections_rejected_total"))
        st, _, _ = t.post_json(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 1})
        self.assertEqual(st, 200)

    def test_far_over_the_cap_closed_at_accept(self):
        """More than a quarter + 16 over --max-connections a connection is closed at accept, unanswered
        (answering costs buffers too), and counted; the connections under that line get their 503."""
        p, d = self.start(t.sim("--role", "prefill")), self.start(t.sim("--role", "decode"))
        r = self.start(t.router([p.port], [d.port], "--max-connections", "4", "--threads", "1"))
        before = t.metric(r.port, "xpyd_client_connections_rejected_total")
        # that scrape's connection no longer counts (the router may see its close after the burst's accepts)
        t.wait_until(lambda: open_on_router_side(r.port) == 0, what="the scrape's connection closed by the router")
        line = 4 + 4 // 4 + 16
        conns = [socket.create_connection(("127.0.0.1", r.port)) for _ in range(line + 4)]
        # the kernel completes the handshakes; the router accepts them on its own time: nothing is sent until it
        # has accepted every one (else an early 503's close frees a slot before the last ones are counted)
        t.wait_until(lambda: accept_backlog(r.port) == 0, what="every connection accepted by the router")
        answers = []
        for c in conns:  # all were accepted (or refused) before any of them sent a byte
            c.settimeout(5)
            try:
                c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                got = c.recv(4096)
            except OSError:
                got = b""
            answers.append(got[:12])
        for c in conns:
            c.close()
        self.assertEqual(answers[:4], [b"HTTP/1.1 200"] * 4)
        self.assertEqual(answers[4:line], [b"HTTP/1.1 503"] * (line - 4))
        self.assertEqual(answers[line:], [b""] * 4)  # closed at accept, unanswered
        t.wait_until(lambda: t.metric(r.port, "xpyd_client_connections") <= 1, what="slots freed")
        # 17 answered 503 and 4 closed at accept (polls of /metrics made before the router saw the closes may
        # have been refused as well)
        self.assertGreaterEqual(t.metric(r.port, "xpyd_client_connections_rejected_total"), before + line - 4 + 4)


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class OutOfDescriptors(t.TestCase):
    def test_out_of_descriptors_waits_then_serves(self):
        """With every descriptor the router may open in use, accept fails (EMFILE): the router pauses accepting
        (one warning a second, not a spin on the failing accept), the connections wait in the listen queue, and
        once descriptors are free again they are all served."""
        r = self.start(t.router(["127.0.0.1:1"], ["127.0.0.1:2"], "--threads", "2", ready_path="/status"))
        held = [keepalive_conn(r.port, "/status") for _ in range(4)]  # answered, kept open: descriptors in use
        self.assertTrue(all(b" 200 " in got.split(b"\r\n")[0] for _, got in held), held)
        # no descriptor left: the limit is what the router has open now (a connection it closes meanwhile, the
        # readiness polls' or an engine probe's, lets one more in)
        limit = len(os.listdir("/proc/%d/fd" % r.p.pid))
        hard = resource.prlimit(r.p.pid, resource.RLIMIT_NOFILE)[1]
        soft = resource.prlimit(r.p.pid, resource.RLIMIT_NOFILE, (limit, hard))[0]  # returns the old limits
        queued = []
        for _ in range(24):
            c = socket.create_connection(("127.0.0.1", r.port))
            c.settimeout(20)
            c.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            queued.append(c)
        since = time.monotonic()
        t.wait_until(lambda: "accept failed" in r.output(), what="the router out of descriptors")
        c0, w0 = cpu_seconds(r.p.pid), time.monotonic()
        t.wait_until(lambda: time.monotonic() - w0 >= 1.5, timeout=5, interval=0.1, what="1.5 s out of descriptors")
        busy = (cpu_seconds(r.p.pid) - c0) / (time.monotonic() - w0)
        self.assertLess(busy, 0.5, "the router spins while accept fails (%.2f of a core)" % busy)
        lines, elapsed = r.output().count("accept failed"), time.monotonic() - since
        self.assertLessEqual(lines, 2 * (int(elapsed) + 1), r.output()[-2000:])  # 2 workers, one a second each
        for c, _ in held:
            c.close()
        answers = []
        for c in queued:
            got, e = t.read_to_close(c)
            c.close()
            answers.append(repr(e).encode() if e else got.split(b"\r\n", 1)[0])
        self.assertEqual(answers, [b"HTTP/1.1 200 OK"] * len(queued))
        # each failed accept paused its worker for 100 ms (at most 10 a second per worker) or until it next took a
        # connection (as descriptors came free); a worker spinning on the failing accept counts thousands a
        # second, however loaded the machine
        errors, elapsed = t.metric(r.port, "xpyd_client_accept_errors_total"), time.monotonic() - since
        self.assertGreaterEqual(errors, 1)
        self.assertLessEqual(errors, 2 * (10 * elapsed + 2) + len(queued) + len(held),
                             "accept errors in %.1f s" % elapsed)
        resource.prlimit(r.p.pid, resource.RLIMIT_NOFILE, (soft, hard))  # (the sanitizer's exit reads /proc)
        t.wait_until(lambda: t.metric(r.port, "xpyd_client_connections") <= 1, what="connections closed")


if __name__ == "__main__":
    t.main()
