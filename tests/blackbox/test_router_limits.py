"""Limits: --max-connections answers a connection over the cap with 503 + Retry-After (counted) and frees
slots as connections close; the retry budget refuses retries beyond its share (counted), so an outage is not
amplified, while the default budget lets retries save requests."""
import json
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
            break
        got += chunk
    return c, got


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
