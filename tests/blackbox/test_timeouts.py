"""Client-side timeouts of the connection guard, as a client sees them: a head that never completes gets 408
(the slowloris defence), a body that stalls gets 408, an idle keep-alive connection is closed quietly, a new
connection that sends nothing is closed quietly, and none of it disturbs other clients or leaks a slot."""
import json
import socket
import time

import xpyd_testlib as t


class ClientTimeouts(t.TestCase):
    def setUp(self):
        super().setUp()
        p, d = self.start(t.sim("--role", "prefill")), self.start(t.sim("--role", "decode"))
        self.r = self.start(t.router([p.port], [d.port], "--header-timeout-ms", "300", "--body-idle-timeout-ms",
                                     "300", "--keepalive-timeout-ms", "400", "--linger-ms", "200"))

    def settled(self):
        t.wait_until(lambda: t.metric(self.r.port, "xpyd_client_connections") <= 1, what="connections closed")

    def test_slow_headers_get_408(self):
        s = socket.create_connection(("127.0.0.1", self.r.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Drip: ")
        t0 = time.monotonic()
        for _ in range(3):  # a slowloris dripping bytes does not extend the deadline
            time.sleep(0.1)
            s.sendall(b"a")
        status, hdrs, body = t.raw_response(s)
        s.close()
        self.assertLess(time.monotonic() - t0, 5)
        self.assertOpenAIError(status, json.loads(body), 408, "headers")
        self.assertEqual(hdrs.get("connection"), "close")
        self.settled()
        self.assertEqual(t.metric(self.r.port, 'xpyd_client_rejected_total{reason="header_timeout"}'), 1)

    def test_stalled_body_gets_408(self):
        s = socket.create_connection(("127.0.0.1", self.r.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"prompt\":")
        status, _, body = t.raw_response(s)
        s.close()
        self.assertOpenAIError(status, json.loads(body), 408, "body")
        self.settled()
        self.assertEqual(t.metric(self.r.port, 'xpyd_client_rejected_total{reason="body_timeout"}'), 1)
        self.assertEqual(t.metric(self.r.port, "xpyd_active_requests"), 0)

    def test_idle_connections_closed_quietly(self):
        silent = socket.create_connection(("127.0.0.1", self.r.port))
        kept = socket.create_connection(("127.0.0.1", self.r.port))
        kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while b"}" not in got:
            got += kept.recv(4096)
        self.assertTrue(got.startswith(b"HTTP/1.1 200"), got)
        # both are closed without a byte: nothing was asked on them
        for s in (silent, kept):
            s.settimeout(5)
            self.assertEqual(s.recv(4096), b"")
            s.close()
        self.settled()
        self.assertGreaterEqual(t.metric(self.r.port, 'xpyd_client_rejected_total{reason="keepalive_idle"}'), 1)

    def test_requests_within_the_timeouts_are_unaffected(self):
        for _ in range(3):
            st, _, body = t.post_json(self.r.port, "/v1/completions", {"prompt": "hi", "max_tokens": 3})
            self.assertEqual(st, 200, body)
        self.assertEqual(t.metric(self.r.port, 'xpyd_client_rejected_total{reason="header_timeout"}'), 0)


if __name__ == "__main__":
    t.main()
