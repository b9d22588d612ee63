# SPDX-License-Identifier: Apache-2.0
"""Timeouts. Client side, the connection guard, as a client sees them: a head that never completes gets 408
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


CMPL = {"prompt": "a b c", "max_tokens": 4}


class UpstreamTimeouts(t.TestCase):
    def test_first_token_timeout(self):
        p = self.start(t.sim("--role", "prefill"))
        d = self.start(t.sim("--role", "decode", "--stall-ms", "5000"))
        r = self.start(t.router([p.port], [d.port], "--first-token-timeout-ms", "300"))
        st, _, out = t.post_json(r.port, "/v1/completions", CMPL)
        self.assertOpenAIError(st, out, 504, "no answer within the timeout")
        self.assertEqual(t.metric(r.port, 'xpyd_request_errors_total{reason="decode_timeout"}'), 1)
        t.wait_until(lambda: t.router_idle(r.port), what="router load back to zero")

    def test_stream_idle_timeout_mid_stream(self):
        p = self.start(t.sim("--role", "prefill"))
        d = self.start(t.sim("--role", "decode", "--decode-us-per-token", "3000000"))
        r = self.start(t.router([p.port], [d.port], "--stream-idle-timeout-ms", "300", "--log-level", "error"))
        st = t.Stream(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 5, "stream": True})
        self.assertEqual(st.status, 200)
        payloads = st.read_all()
        self.assertEqual(payloads[-1], "[DONE]")
        err = json.loads(payloads[-2])["error"]
        self.assertIn("decode 127.0.0.1:%d failed" % d.port, err["message"])
        self.assertLess(len(t.content_events(payloads)), 5)
        t.wait_until(lambda: t.metric(d.port, "xpyd_sim:requests_aborted_total") == 1, what="decode aborted")
        t.wait_until(lambda: t.router_idle(r.port), what="router load back to zero")


if __name__ == "__main__":
    t.main()
