"""Limits: --max-connections closes client connections over the cap (counted) and frees slots as
connections close; the retry budget refuses retries beyond its share (counted), so an outage is not
amplified, while the default budget lets retries save requests."""
import socket

import xpyd_testlib as t


def keepalive_conn(port):
    c = socket.create_connection(("127.0.0.1", port))
    c.settimeout(5)
    c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    got = b""
    while b"}" not in got:
        chunk = c.recv(4096)
        if not chunk:
            return None, got
        got += chunk
    return c, got


class MaxConnections(t.TestCase):
    def test_cap(self):
        p, d = self.start(t.sim("--role", "prefill")), self.start(t.sim("--role", "decode"))
        r = self.start(t.router([p.port], [d.port], "--max-connections", "2", "--threads", "1"))
        a, _ = keepalive_conn(r.port)
        b, _ = keepalive_conn(r.port)
        self.assertIsNotNone(a)
        self.assertIsNotNone(b)
        third, got = None, b""
        try:
            third, got = keepalive_conn(r.port)
        except OSError:
            pass
        self.assertIsNone(third, "a third connection was served over --max-connections 2")
        self.assertEqual(got, b"")
        a.close()
        t.wait_until(lambda: t.metric(r.port, "xpyd_client_connections") <= 2, what="slot freed")
        self.assertGreaterEqual(t.metric(r.port, "xpyd_client_connections_rejected_total"), 1)
        b.close()


class RetryBudget(t.TestCase):
    def test_zero_budget_refuses_retries(self):
        p = self.start(t.sim("--role", "prefill"))
        good = self.start(t.sim("--role", "decode"))
        dead = t.free_port()
        r = self.start(t.router([p.port], [dead, good.port], "--decode-policy", "rr", "--retry-budget-percent",
                                "0", "--retry-budget-min", "0", "--eject-after-failures", "0"))
        codes = [t.post_json(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 1})[0] for _ in range(4)]
        self.assertEqual(sorted(codes), [200, 200, 502, 502])
        self.assertEqual(t.metric(r.port, "xpyd_retries_denied_total"), 2)
        self.assertEqual(t.metric(r.port, 'xpyd_retries_total{role="decode"}'), 0)

    def test_default_budget_saves_requests_with_backoff(self):
        p = self.start(t.sim("--role", "prefill"))
        good = self.start(t.sim("--role", "decode"))
        dead = t.free_port()
        r = self.start(t.router([p.port], [dead, good.port], "--decode-policy", "rr", "--eject-after-failures", "0",
                                "--retry-backoff-ms", "50"))
        for _ in range(4):
            st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 1})
            self.assertEqual(st, 200, out)
        self.assertGreaterEqual(t.metric(r.port, 'xpyd_retries_total{role="decode"}'), 2)
        self.assertEqual(t.metric(r.port, "xpyd_retries_denied_total"), 0)
        t.wait_until(lambda: t.router_idle(r.port), what="idle")


if __name__ == "__main__":
    t.main()
