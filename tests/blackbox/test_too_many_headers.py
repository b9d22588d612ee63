# SPDX-License-Identifier: Apache-2.0
"""Request-head limits: too many header fields, too many header bytes, or one over-long line get 431 in
OpenAI's error shape (never a silent reset), counted; heads within the limits are served."""
import json

import xpyd_testlib as t


def head(n_headers, value_len=10, path=b"/v1/completions"):
    body = b'{"prompt":"a","max_tokens":1}'
    h = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * value_len) for i in range(n_headers))
    return (b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
            + h + b"Content-Length: %d\r\n\r\n" % len(body) + body)


class HeaderLimits(t.TestCase):
    def setUp(self):
        super().setUp()
        p, d = self.start(t.sim("--role", "prefill")), self.start(t.sim("--role", "decode"))
        self.r = self.start(t.router([p.port], [d.port], "--max-headers", "20", "--max-header-bytes", "4096",
                                     "--max-header-line-bytes", "1024"))

    def rejected(self):
        return t.metric(self.r.port, 'xpyd_client_rejected_total{reason="headers_too_large"}')

    def test_within_limits_served(self):
        status, _, body = t.raw_exchange(self.r.port, head(15))
        self.assertEqual(status, 200, body)

    def test_too_many_fields(self):
        status, hdrs, body = t.raw_exchange(self.r.port, head(40))
        self.assertOpenAIError(status, json.loads(body), 431, "too many")
        self.assertEqual(hdrs.get("connection"), "close")
        self.assertEqual(self.rejected(), 1)

    def test_too_many_bytes(self):
        status, _, body = t.raw_exchange(self.r.port, head(10, value_len=900))
        self.assertOpenAIError(status, json.loads(body), 431, "too large")

    def test_line_too_long(self):
        status, _, body = t.raw_exchange(self.r.port, head(1, value_len=2000))
        self.assertOpenAIError(status, json.loads(body), 431, "too long")
        status, _, body = t.raw_exchange(self.r.port, head(0, path=b"/v1/" + b"x" * 3000))
        self.assertOpenAIError(status, json.loads(body), 431, "too long")

    def test_huge_head_streamed_without_end(self):
        # a client that keeps sending header bytes forever is cut off at the limit, not buffered
        import socket
        s = socket.create_connection(("127.0.0.1", self.r.port))
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        try:
            for i in range(200):
                s.sendall(b"X-A%d: %s\r\n" % (i, b"z" * 100))
        except OSError:
            pass
        status, _, body = t.raw_response(s)
        s.close()
        self.assertEqual(status, 431, body)
        t.wait_until(lambda: t.metric(self.r.port, "xpyd_client_connections") <= 1, what="connection closed")


if __name__ == "__main__":
    t.main()
