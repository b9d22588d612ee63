# SPDX-License-Identifier: Apache-2.0
"""Graceful shutdown: on SIGTERM /health answers 503, new connections are refused, streams in flight finish
with every token and [DONE], and the router exits 0 once they are done; the drain timeout bounds it."""
import signal
import socket

import xpyd_testlib as t


class GracefulShutdown(t.TestCase):
    def test_second_signal_exits_at_once(self):
        """A second SIGTERM during the drain ends it: the router exits without waiting for streams."""
        import time
        p = self.start(t.sim("--role", "prefill"))
        d = self.start(t.sim("--role", "decode", "--decode-us-per-token", "50000"))
        r = self.start(t.router([p.port], [d.port], "--drain-timeout-ms", "60000"))
        s = t.Stream(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 1000, "stream": True})
        next(s.events())
        r.signal(signal.SIGTERM)
        t.wait_until(lambda: "event=draining" in r.output(), what="signal seen")
        time.sleep(0.3)  # draining, with the stream still in flight
        self.assertTrue(r.alive(), "the first SIGTERM did not drain")
        t0 = time.monotonic()
        r.signal(signal.SIGTERM)
        t.wait_until(lambda: not r.alive(), timeout=10, what="exit after the second SIGTERM")
        self.assertLess(time.monotonic() - t0, 5)
        self.assertEqual(r.p.returncode, 0)
        s.close()

    def test_streams_finish_then_exit_zero(self):
        p = self.start(t.sim("--role", "prefill"))
        d = self.start(t.sim("--role", "decode", "--decode-us-per-token", "20000"))
        r = self.start(t.router([p.port], [d.port]))
        streams = [t.Stream(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 40, "stream": True})
                   for _ in range(3)]
        for s in streams:
            next(s.events())
        health = socket.create_connection(("127.0.0.1", r.port))  # an open keep-alive connection:
        health.settimeout(5)                                          # one answered request makes it one
        health.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while b'{"status":"ok"}' not in got:
            got += health.recv(4096)
        r.signal(signal.SIGTERM)
        # on the open connection: /health turns 503, then a generate request is refused with a clear 503
        t.wait_until(lambda: "event=draining" in r.output(), what="signal seen")
        health.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while b"}" not in got:
            got += health.recv(4096)
        self.assertTrue(got.startswith(b"HTTP/1.1 503"), got[:60])
        self.assertIn(b'"draining"', got)
        body = '{"prompt":"x","max_tokens":1}'
        health.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        "Content-Length: %d\r\n\r\n%s" % (len(body), body)).encode())
        head = health.recv(4096)
        self.assertTrue(head.startswith(b"HTTP/1.1 503"), head[:60])
        self.assertIn(b"shutting down", head)
        health.close()
        with self.assertRaises(OSError):  # the listener is closed
            socket.create_connection(("127.0.0.1", r.port), timeout=1)
        for s in streams:
            payloads = [json for json, _ in s.events()]
            self.assertEqual(payloads[-1], "[DONE]")
            self.assertEqual(len(t.content_events(payloads)), 39)  # the rest of the 40
        t.wait_until(lambda: not r.alive(), timeout=10, what="exit after drain")
        self.assertEqual(r.p.returncode, 0)
        self.assertIn("event=drained active=0", r.output())

    def test_drain_timeout_bounds_shutdown(self):
        p = self.start(t.sim("--role", "prefill"))
        d = self.start(t.sim("--role", "decode", "--decode-us-per-token", "1000000"))
        r = self.start(t.router([p.port], [d.port], "--drain-timeout-ms", "300"))
        st = t.Stream(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 100, "stream": True}, lazy=True)
        t.wait_until(lambda: t.status(r.port)["active_requests"] == 1, what="in flight")
        r.signal(signal.SIGTERM)
        t.wait_until(lambda: not r.alive(), timeout=10, what="exit at the drain timeout")
        self.assertEqual(r.p.returncode, 0)
        self.assertIn("event=drained active=1", r.output())
        st.close()


if __name__ == "__main__":
    t.main()
