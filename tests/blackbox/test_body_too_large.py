# SPDX-License-Identifier: Apache-2.0
"""Request bodies over --max-body-bytes: 413 in OpenAI's error shape, read and discarded (never buffered),
never dispatched, whether announced by Content-Length or sent chunked; the router's internal marker cannot be
forged by a client; a body at the limit is served."""
import json
import os

import xpyd_testlib as t

LIMIT = 2048


def body_of_size(n):
    base = '{"prompt": "", "max_tokens": 1}'
    return base.replace('""', '"' + "x" * (n - len(base)) + '"')


class BodyTooLarge(t.TestCase):
    def setUp(self):
        super().setUp()
        self.p, self.d = self.start(t.sim("--role", "prefill")), self.start(t.sim("--role", "decode"))
        self.r = self.start(t.router([self.p.port], [self.d.port], "--max-body-bytes", str(LIMIT)))

    def test_content_length_over(self):
        st, h, out = t.request(self.r.port, "POST", "/v1/completions", body_of_size(LIMIT + 1))
        self.assertOpenAIError(st, json.loads(out), 413, "--max-body-bytes")
        self.assertEqual(h["content-type"], "application/json")
        self.assertEqual(t.metric(self.r.port, 'xpyd_request_errors_total{reason="body_too_large"}'), 1)
        self.assertEqual(t.metric(self.p.port, "xpyd_sim:requests_total"), 0)

    def test_chunked_over(self):
        big = body_of_size(LIMIT * 50).encode()
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(big[i:i + 1000]), big[i:i + 1000]) for i in range(0, len(big), 1000))
        status, _, out = t.raw_exchange(self.r.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
                                        b"Connection: close\r\n\r\n" + chunks + b"0\r\n\r\n")
        self.assertOpenAIError(status, json.loads(out), 413, "--max-body-bytes")
        self.assertEqual(t.metric(self.p.port, "xpyd_sim:requests_total"), 0)

    def test_huge_chunked_body_is_not_buffered(self):
        """48 MiB sent chunked to a 2 KiB limit: read and discarded as it arrives, so the router's memory
        does not grow with it (a buffered body would add its whole size)."""
        import socket
        before = t.rss_kib(self.r.p.pid)
        s = socket.create_connection(("127.0.0.1", self.r.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
        piece = b"%x\r\n%s\r\n" % (65536, b"x" * 65536)
        for _ in range(768):
            s.sendall(piece)
        s.sendall(b"0\r\n\r\n")
        status, _, out = t.raw_response(s)
        s.close()
        self.assertOpenAIError(status, json.loads(out), 413, "--max-body-bytes")
        grown = t.rss_kib(self.r.p.pid) - before
        if os.environ.get("XPYD_SANITIZED") != "ON":  # ASan keeps freed memory in quarantine: RSS says nothing
            self.assertLess(grown, 16 * 1024, "router RSS grew by %d KiB for a discarded body" % grown)

    def test_at_limit_served_and_marker_not_forgeable(self):
        st, _, out = t.request(self.r.port, "POST", "/v1/completions", body_of_size(LIMIT),
                               headers={"X-Xpyd-Body-Too-Large": "1"})
        self.assertEqual(st, 200, out)
        t.wait_until(lambda: t.router_idle(self.r.port), what="router load back to zero")


if __name__ == "__main__":
    t.main()
