# SPDX-License-Identifier: Apache-2.0
"""Client keep-alive: many streamed and non-streamed answers in a row on one connection, and the router never
closes it in between (libevhtp 1.2.18 closed an idle keep-alive connection when a stray write event came
after a streamed answer, racing the client's next request; see router/client_conn.c)."""
import json
import os
import shutil
import socket

import xpyd_testlib as t


def read_answer(s, buf):
    """Reads one HTTP answer (Content-Length or chunked) from s; returns (status, body, rest of buf)."""
    while b"\r\n\r\n" not in buf:
        d = s.recv(65536)
        if not d:
            raise AssertionError("connection closed by the router between requests")
        buf += d
    head, _, buf = buf.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    hl = head.lower()
    if b"transfer-encoding: chunked" in hl:
        body = b""
        while True:
            while b"\r\n" not in buf:
                buf += s.recv(65536)
            line, _, buf = buf.partition(b"\r\n")
            n = int(line, 16)
            while len(buf) < n + 2:
                buf += s.recv(65536)
            body, buf = body + buf[:n], buf[n + 2:]
            if n == 0:
                return status, body, buf
    n = int([l for l in hl.split(b"\r\n") if l.startswith(b"content-length:")][0].split(b":")[1])
    while len(buf) < n:
        buf += s.recv(65536)
    return status, buf[:n], buf[n:]


class KeepAlive(t.TestCase):
    def test_one_connection_many_answers(self):
        p, d = self.start(t.sim("--role", "prefill")), self.start(t.sim("--role", "decode",
                                                                            "--decode-us-per-token", "0"))
        r = self.start(t.router([p.port], [d.port], "--threads", "1"))
        before = t.metric(r.port, "xpyd_client_connections_accepted_total")
        s = socket.create_connection(("127.0.0.1", r.port), timeout=10)
        buf = b""
        for i in range(60):
            body = json.dumps({"prompt": "a", "max_tokens": 3, "stream": i % 3 != 0}).encode()
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            status, out, buf = read_answer(s, buf)
            self.assertEqual(status, 200, out)
            if i % 3 != 0:
                self.assertTrue(out.endswith(b"data: [DONE]\n\n"), out)
        s.close()
        # one connection for the 60 requests (+1 for the /metrics read below)
        self.assertEqual(t.metric(r.port, "xpyd_client_connections_accepted_total") - before, 2)

    def test_after_answers_given_within_the_request_read(self):
        # Answers the router gives while the request is still being read in (no instance can take it: 503;
        # a stream that cannot start: 503 too) are finished on the spot; the connection must then serve the
        # next request, streamed or not, and a refusal again (the request once stayed paused: the next hung)
        p, d = self.start(t.sim("--role", "prefill")), self.start(t.sim("--role", "decode"))
        cfg = os.path.join(t.tmpdir(prefix="xpyd-cfg-"), "c.json")
        self.addCleanup(shutil.rmtree, os.path.dirname(cfg), True)
        with open(cfg, "w") as f:  # every rank's max_model_len below prompt + 100 tokens
            json.dump({role: {"hosts": [{"host": "127.0.0.1", "port": e.port, "max_model_len": 50}]}
                       for role, e in (("prefill", p), ("decode", d))}, f)
        r = self.start(t.Proc("xpyd_router", ["--port", "0", "--log-level", "error", "--threads", "1", "--config", cfg]))
        s = socket.create_connection(("127.0.0.1", r.port), timeout=10)
        buf = b""
        for stream in (False, True, False, True):
            for tokens, want in ((100, 503), (2, 200)):
                body = json.dumps({"prompt": "a", "max_tokens": tokens, "stream": stream}).encode()
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                status, out, buf = read_answer(s, buf)
                self.assertEqual(status, want, (stream, tokens, out))
        s.close()
        t.wait_until(lambda: t.router_idle(r.port), what="router idle")


if __name__ == "__main__":
    t.main()
