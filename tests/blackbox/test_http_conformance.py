# SPDX-License-Identifier: Apache-2.0
"""HTTP conformance of the router's client side, byte-exact, as a hostile client would test it: RFC 9112
framing (request line, fields, Content-Length / Transfer-Encoding, chunked bodies with extensions and
trailers, pipelining) and RFC 9110 method rules, plus a regression test for every finding of the client-side
hardening issue (the HTTP/0.9 request line that crashed libevhtp, protections lost after the first forwarded
request, smuggling-prone framing, lost pipelined requests, bodies re-serialised on their way to engines,
colliding request ids, HEAD/405/Host/version/header-byte rules, 100-continue before 401/413), and the framing of
streamed answers per HTTP version (chunked for 1.1; never for 1.0, whose stream ends with the connection)."""
import json
import re
import time

import xpyd_testlib as t

BODY = b'{"prompt":"a b","max_tokens":2}'
HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
HEALTH_CLOSE = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


def post(path, body, extra=b"", version=b"1.1"):
    return (b"POST " + path + b" HTTP/" + version + b"\r\nHost: x\r\nContent-Type: application/json\r\n" + extra +
            b"Content-Length: %d\r\n\r\n" % len(body) + body)


def chunked(body, size=7, ext=b""):
    out = b""
    for i in range(0, len(body), size):
        piece = body[i:i + size]
        out += b"%x%s\r\n%s\r\n" % (len(piece), ext, piece)
    return out


class Base(t.TestCase):
    ROUTER_ARGS = ()

    def setUp(self):
        super().setUp()
        self.p, self.d = self.start(t.sim("--role", "prefill")), self.start(t.sim("--role", "decode"))
        self.r = self.start(t.router([self.p.port], [self.d.port], *self.ROUTER_ARGS))

    def conn(self):
        c = t.RawConn(self.r.port)
        self.addCleanup(c.close)
        return c

    def assertRefused(self, data, status, needle=""):
        """A fresh connection sending data gets status in OpenAI's shape, then the router closes it."""
        c = self.conn().send(data)
        st, _, h, body = c.response()
        self.assertOpenAIError(st, json.loads(body), status, needle)
        self.assertEqual(h.get("connection"), "close")
        self.assertTrue(c.closed(), "connection left open after %d" % status)

    def assertAlive(self):
        self.assertEqual(t.request(self.r.port, "GET", "/health")[0], 200)
        self.assertTrue(self.r.alive())


class CrashFinding(Base):
    ROUTER_ARGS = ("--api-key", "k")

    def test_request_lines_without_a_version(self):
        for data in (b"GET /health\r\n\r\n", b"GET /\r\n\r\n", b"HEAD /health\r\n\r\n", b"GET /health\r\nX: 1\r\n\r\n",
                     b"POST /v1/completions\r\nContent-Length: 2\r\n\r\n{}", b"GET /health HTTP\r\n\r\n",
                     b"GET /health HTTP/1\r\n\r\n", b"GET  /health HTTP/1.1\r\nHost: x\r\n\r\n"):
            with self.subTest(data=data):
                self.assertRefused(data, 400)
                self.assertAlive()

    def test_pipelined_after_a_forwarded_request(self):
        c = self.conn().send(post(b"/v1/completions", BODY, b"Authorization: Bearer k\r\n") + b"GET /health\r\n\r\n")
        self.assertEqual(c.response()[0], 200)
        st, _, _, body = c.response()
        self.assertOpenAIError(st, json.loads(body), 400, "version")
        self.assertTrue(c.closed())
        self.assertAlive()
        self.assertEqual(t.metric(self.r.port, 'xpyd_client_rejected_total{reason="malformed"}'), 1)


class ProtectionsOnEveryRequest(Base):
    """Every limit and timeout holds on a keep-alive connection after each kind of request."""
    ROUTER_ARGS = ("--header-timeout-ms", "600", "--body-idle-timeout-ms", "600", "--keepalive-timeout-ms", "900",
                   "--max-headers", "20", "--max-header-bytes", "4096", "--linger-ms", "200")
    KINDS = {
        "completion": (post(b"/v1/completions", BODY), 200),
        "stream": (post(b"/v1/completions", b'{"prompt":"a","max_tokens":3,"stream":true}'), 200),
        "chat": (post(b"/v1/chat/completions", b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}'), 200),
        "models": (b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", 200),
        "health": (HEALTH, 200),
        "status": (b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n", 200),
        "bad_json": (post(b"/v1/completions", b"{oops"), 400),
        "head": (b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n", 200),
    }

    def after(self, kind):
        data, want = self.KINDS[kind]
        c = self.conn().send(data)
        self.assertEqual(c.response(head=kind == "head")[0], want)
        return c

    def test_header_timeout(self):
        for kind in self.KINDS:
            with self.subTest(kind=kind):
                c = self.after(kind).send(b"GET /health HTTP/1.1\r\nX: ")
                st, _, _, body = c.response()
                self.assertOpenAIError(st, json.loads(body), 408, "headers")
                self.assertTrue(c.closed())

    def test_body_idle_timeout(self):
        for kind in self.KINDS:
            with self.subTest(kind=kind):
                c = self.after(kind).send(post(b"/v1/completions", b"x" * 10)[:-8])
                st, _, _, body = c.response()
                self.assertOpenAIError(st, json.loads(body), 408, "body")

    def test_header_limits(self):
        many = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(30)) + b"\r\n"
        for kind in self.KINDS:
            with self.subTest(kind=kind):
                st, _, _, body = self.after(kind).send(many).response()
                self.assertOpenAIError(st, json.loads(body), 431, "too many")
                c = self.after(kind)
                try:  # a head that never ends: cut at the limit, never buffered
                    c.send(b"GET /health HTTP/1.1\r\n" + b"X-Big: " + b"y" * 3000 + b"\r\n" + b"X-Big2: " + b"y" * 3000)
                except OSError:
                    pass
                st, _, _, body = c.response()
                self.assertOpenAIError(st, json.loads(body), 431, "too large")

    def test_keepalive_idle_close(self):
        # every kind's connection left idle at once, each closed within --keepalive-timeout-ms of its answer
        idle = [(kind, self.after(kind), time.monotonic()) for kind in self.KINDS]
        for kind, c, since in idle:
            with self.subTest(kind=kind):
                self.assertTrue(c.closed(timeout=max(0.1, since + 5 - time.monotonic())),
                                "idle keep-alive connection not closed")
                self.assertLess(time.monotonic() - since, 4)
        t.wait_until(lambda: t.metric(self.r.port, "xpyd_client_connections") <= 1, what="connections closed")

    def test_memory_held_by_unterminated_heads_is_bounded(self):
        conns = []
        for _ in range(5):
            c = self.after("completion")
            try:
                c.send(b"GET /health HTTP/1.1\r\n" + b"X: " + b"z" * 200000)
            except OSError:
                pass
            conns.append(c)
        for c in conns:
            self.assertEqual(c.response()[0], 431)
        self.assertLess(t.rss_kib(self.r.p.pid), 200 * 1024)


class Framing(Base):
    def test_content_length_with_transfer_encoding(self):
        self.assertRefused(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                           b"Transfer-Encoding: chunked\r\n\r\n" + chunked(BODY) + b"0\r\n\r\n", 400, "Content-Length")

    def test_differing_content_lengths(self):
        self.assertRefused(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 31\r\nContent-Length: 5\r\n\r\n"
                           + BODY, 400, "differing")
        self.assertRefused(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 31, 5\r\n\r\n" + BODY, 400)

    def test_equal_content_lengths_accepted(self):
        c = self.conn().send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 31\r\nContent-Length: 31"
                             b"\r\n\r\n" + BODY)
        self.assertEqual(c.response()[0], 200)

    def test_transfer_coding_names_are_case_insensitive(self):
        for te in (b"CHUNKED", b"Chunked", b"\tchunked", b"chunked "):
            with self.subTest(te=te):
                c = self.conn().send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:" + te +
                                     b"\r\n\r\n" + chunked(BODY) + b"0\r\n\r\n" + HEALTH_CLOSE)
                self.assertEqual(c.response()[0], 200)
                self.assertEqual(c.response()[3], b'{"status":"ok"}')  # the chunks were not read as a request

    def test_bad_transfer_encodings(self):
        base = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n%s\r\n\r\n" + chunked(BODY) + b"0\r\n\r\n"
        for te, status in ((b"Transfer-Encoding : chunked", 400), (b"Transfer-Encoding: xchunked", 400),
                           (b"Transfer-Encoding: chunked, gzip", 400), (b"Transfer-Encoding: gzip", 400),
                           (b"Transfer-Encoding: gzip, chunked", 501), (b"Transfer-Encoding: chunked, chunked", 400),
                           (b"Transfer-Encoding: ", 400)):
            with self.subTest(te=te):
                self.assertRefused(base % te, status)
        self.assertRefused(b"POST /v1/completions HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(BODY) +
                           b"0\r\n\r\n", 400, "HTTP/1.0")

    def test_malformed_heads_get_400(self):
        for data in (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
                     b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
                     b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n",
                     b"GET /health HTTP/1.1\nHost: x\n\n", b"GET /health HTTP/1.1\r\nHost: x\nX: 1\r\n\r\n",
                     b"GET /health HTTP/1.1\r\nHost: x\r\nX: 1\r\n  continued\r\n\r\n",
                     b"GET /health HTTP/1.1\r\n Host: x\r\n\r\n", b"get /health HTTP/1.1\r\nHost: x\r\n\r\n",
                     b"GET /health HTTP/1.1\r\nHost: x\r\nX\rY: 1\r\n\r\n", b"GET /he alth HTTP/1.1\r\nHost: x\r\n\r\n",
                     b"GET health HTTP/1.1\r\nHost: x\r\n\r\n", b"GET /health#frag HTTP/1.1\r\nHost: x\r\n\r\n"):
            with self.subTest(data=data):
                self.assertRefused(data, 400)

    def test_unknown_method_and_version(self):
        self.assertRefused(b"BREW /health HTTP/1.1\r\nHost: x\r\n\r\n", 501, "method")
        for v in (b"HTTP/9.9", b"HTTP/2.0", b"HTTP/1.2", b"HTTP/0.9"):
            with self.subTest(v=v):
                c = self.conn().send(b"GET /health " + v + b"\r\nHost: x\r\n\r\n")
                line = c._line()
                self.assertTrue(line.startswith(b"HTTP/1.1 505 "), line)


class Pipelining(Base):
    def test_answers_in_order(self):
        reqs = [post(b"/v1/completions", b'{"prompt":"a","max_tokens":3,"stream":true}'), HEALTH,
                post(b"/v1/completions", b"{bad"), b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n",
                post(b"/v1/completions", BODY), b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", HEALTH_CLOSE]
        c = self.conn().send(b"".join(reqs))
        got = [c.response() for _ in reqs]
        self.assertEqual([g[0] for g in got], [200, 200, 400, 200, 200, 404, 200])
        self.assertIn(b"[DONE]", got[0][3])
        self.assertEqual(got[1][3], b'{"status":"ok"}')
        self.assertIn(b'"pools"', got[3][3])
        self.assertIn(b'"text_completion"', got[4][3])
        self.assertTrue(c.closed())

    def test_chunked_with_trailer_then_next_request(self):
        c = self.conn().send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
                             chunked(BODY) + b"0\r\nX-T: 1\r\nX-U: 2\r\n\r\n" + HEALTH_CLOSE)
        self.assertEqual(c.response()[0], 200)
        self.assertEqual(c.response()[3], b'{"status":"ok"}')

    def test_chunk_extensions(self):
        c = self.conn().send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
                             chunked(BODY, ext=b';name="va;l\\"ue"; x=1') + b"0;last\r\n\r\n" + HEALTH_CLOSE)
        self.assertEqual(c.response()[0], 200)
        self.assertEqual(c.response()[0], 200)

    def test_chunk_sizes_with_leading_zeros(self):
        # RFC 9112 7.1: chunk-size = 1*HEXDIG; zeros before the digits that count are any in number
        body = b"0" * 40 + b"%x\r\n%s\r\n" % (len(BODY), BODY) + b"0" * 30 + b"\r\n\r\n"
        c = self.conn().send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
                             body + HEALTH_CLOSE)
        st, _, _, out = c.response()
        self.assertEqual(st, 200, out)
        self.assertIn(b'"text_completion"', out)
        self.assertEqual(c.response()[3], b'{"status":"ok"}')
        # sixteen digits that count are still too large, zeros or not
        self.assertRefused(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
                           b"000" + b"1" * 16 + b"\r\n", 400, "chunk size too large")

    def test_options_asterisk_then_the_next_request(self):
        # what HAProxy's "option httpchk OPTIONS *" sends: answered, and the request behind it is kept
        for version, close in ((b"1.1", False), (b"1.0", True)):
            with self.subTest(version=version):
                c = self.conn().send(b"OPTIONS * HTTP/" + version + b"\r\nHost: x\r\n" +
                                     (b"" if close else b"Content-Length: 0\r\n") + b"\r\n" + HEALTH_CLOSE)
                st, _, h, out = c.response()
                self.assertEqual((st, out), (200, b""))
                self.assertEqual(h.get("allow"), "GET, HEAD, POST, PUT, DELETE")
                self.assertEqual(h.get("content-length"), "0")
                if close:  # HTTP/1.0 without keep-alive: the answer is the connection's last
                    self.assertEqual(h.get("connection"), "close")
                    self.assertTrue(c.closed())
                else:
                    self.assertEqual(c.response()[3], b'{"status":"ok"}')
                    self.assertTrue(c.closed())
        self.assertRefused(b"GET * HTTP/1.1\r\nHost: x\r\n\r\n", 400, "malformed request target")
        self.assertAlive()

    def test_bad_chunked_bodies(self):
        head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        for body in (b"zz\r\n", b"5\r\nabcdefg\r\n", b"5\nabcde\r\n0\r\n\r\n", b"0\r\nBad Trailer\r\n\r\n",
                     b"0\r\n: v\r\n\r\n", b"ffffffffffffffffff\r\n", b"5;\x01\r\nabcde\r\n0\r\n\r\n"):
            with self.subTest(body=body):
                self.assertRefused(head + body, 400)

    def test_byte_at_a_time(self):
        data = post(b"/v1/completions", BODY) + HEALTH_CLOSE
        c = self.conn()
        for i in range(len(data)):
            c.send(data[i:i + 1])
        self.assertEqual(c.response()[0], 200)
        self.assertEqual(c.response()[0], 200)


class AnswerShapes(Base):
    ROUTER_ARGS = ("--api-key", "k")
    AUTH = b"Authorization: Bearer k\r\n"

    def test_head_has_no_body(self):
        c = self.conn().send(b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n" + HEALTH_CLOSE)
        st, _, h, _ = c.response(head=True)
        self.assertEqual((st, h.get("content-length")), (200, "15"))
        self.assertEqual(c.response(), (200, "OK", {"content-type": "application/json", "content-length": "15",
                                                    "connection": "close"}, b'{"status":"ok"}'))
        c = self.conn().send(b"HEAD /status HTTP/1.1\r\nHost: x\r\n" + self.AUTH + b"\r\n" + HEALTH_CLOSE)
        st, _, h, _ = c.response(head=True)
        self.assertEqual(st, 200)
        self.assertGreater(int(h["content-length"]), 20)
        self.assertEqual(c.response()[0], 200)

    def test_stream_framing_by_version(self):
        # HTTP/1.1: chunked, the connection kept (or closed after the last chunk when asked); HTTP/1.0 clients
        # do not know the chunked coding (RFC 9112 section 6.1): the events as they are, ended by the close
        sbody = b'{"prompt":"a b","max_tokens":3,"stream":true}'
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
        c = self.conn().send(post(b"/v1/completions", sbody, self.AUTH))
        st, _, h, body = c.response()
        self.assertEqual((st, h.get("transfer-encoding")), (200, "chunked"))
        self.assertTrue(body.endswith(b"data: [DONE]\n\n"), body)
        self.assertEqual(body.count(b"data: "), 4, body)  # 3 tokens (the last with its finish reason), [DONE]
        c.send(HEALTH_CLOSE)
        self.assertEqual(c.response()[0], 200)  # the same connection, after the stream
        for version, extra in ((b"1.1", b"Connection: close\r\n"), (b"1.0", b""), (b"1.0", b"Connection: keep-alive\r\n")):
            with self.subTest(version=version, extra=extra):
                c = self.conn().send(post(b"/v1/completions", sbody, self.AUTH + extra, version))
                raw = b""
                while True:
                    got = c.s.recv(65536)
                    if not got:
                        break
                    raw += got
                if version == b"1.1":
                    self.assertTrue(raw.startswith(head + b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"),
                                    raw[:200])
                    rest, body = raw.partition(b"\r\n\r\n")[2], b""
                    while True:  # strictly chunked, to the last chunk, nothing after it
                        size, _, rest = rest.partition(b"\r\n")
                        self.assertRegex(size, rb"^[0-9a-f]+$")
                        n = int(size, 16)
                        self.assertEqual(rest[n:n + 2], b"\r\n")
                        body, rest = body + rest[:n], rest[n + 2:]
                        if n == 0:
                            break
                    self.assertEqual(rest, b"")
                    self.assertEqual(body.count(b"data: "), 4, body)
                    self.assertTrue(body.endswith(b"data: [DONE]\n\n"), body[-60:])
                else:
                    want = (b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                            b"Connection: close\r\n\r\ndata: {")
                    self.assertTrue(raw.startswith(want), raw[:200])
                    body = raw.partition(b"\r\n\r\n")[2]
                    self.assertEqual(body.count(b"data: "), 4, body)
                    self.assertTrue(body.endswith(b"data: [DONE]\n\n"), body[-60:])
        self.assertAlive()

    def test_405_with_allow(self):
        for method, path, allow in ((b"GET", b"/v1/completions", "POST"), (b"POST", b"/status", "GET, HEAD"),
                                    (b"POST", b"/health", "GET, HEAD"), (b"PUT", b"/metrics", "GET, HEAD"),
                                    (b"DELETE", b"/v1/models", "GET, HEAD"), (b"PATCH", b"/v1/chat/completions", "POST")):
            with self.subTest(method=method, path=path):
                c = self.conn().send(method + b" " + path + b" HTTP/1.1\r\nHost: x\r\n" + self.AUTH +
                                     b"Content-Length: 0\r\n\r\n")
                st, reason, h, body = c.response()
                self.assertEqual((st, reason, h.get("allow")), (405, "Method Not Allowed", allow))
                self.assertOpenAIError(st, json.loads(body), 405, allow)

    def test_host_rules(self):
        self.assertRefused(b"GET /health HTTP/1.1\r\n\r\n", 400, "Host")
        self.assertRefused(b"GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "Host")
        c = self.conn().send(b"GET /health HTTP/1.0\r\n\r\n")  # HTTP/1.0 may omit Host; it closes after
        st, _, h, body = c.response()
        self.assertEqual((st, body), (200, b'{"status":"ok"}'))
        self.assertTrue(c.closed())
        c = self.conn().send(b"GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" + HEALTH_CLOSE)
        self.assertEqual(c.response()[2].get("connection"), "keep-alive")
        self.assertEqual(c.response()[0], 200)

    def test_absolute_form_target(self):
        c = self.conn().send(b"GET http://router.example/health HTTP/1.1\r\nHost: router.example\r\n"
                             b"Connection: close\r\n\r\n")
        self.assertEqual(c.response()[3], b'{"status":"ok"}')

    def test_bad_header_bytes(self):
        for line in (b"X Y: 1", b"X-A: a\x01b", b"X-A: a\x00b", b"X-A: a\x7fb", b"(X): 1", b": v"):
            with self.subTest(line=line):
                self.assertRefused(b"GET /health HTTP/1.1\r\nHost: x\r\n" + line + b"\r\n\r\n", 400)

    def test_duplicate_authorization(self):
        self.assertRefused(b"GET /status HTTP/1.1\r\nHost: x\r\n" + self.AUTH + b"Authorization: Bearer z\r\n\r\n",
                           400, "Authorization")

    def test_expect_continue(self):
        # no key: 401 at once, never a 100 first
        c = self.conn().send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                             b"Content-Length: 31\r\n\r\n")
        st, _, h, body = c.response()
        self.assertOpenAIError(st, json.loads(body), 401, "API key")
        self.assertTrue(c.closed())
        # with the key: 100 Continue, then the answer once the body is sent
        c = self.conn().send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n" + self.AUTH +
                             b"Content-Length: 31\r\n\r\n")
        self.assertEqual(c.response()[:2], (100, "Continue"))
        c.send(BODY)
        self.assertEqual(c.response()[0], 200)
        self.assertRefused(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: something\r\n\r\n", 417)

    def test_expect_continue_too_large(self):
        c = self.conn().send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n" + self.AUTH +
                             b"Content-Length: 99999999999\r\n\r\n")
        st, _, _, body = c.response()
        self.assertOpenAIError(st, json.loads(body), 413, "--max-body-bytes")
        self.assertTrue(c.closed())


def ask(port, data):
    """One request on a fresh connection: its answer (status, reason, headers, body)."""
    c = t.RawConn(port)
    try:
        return c.send(data).response()
    finally:
        c.close()


def fake_engine(status=200, extra=None, body=None):
    answer = body or json.dumps({"id": "cmpl-1", "object": "text_completion", "model": "m", "choices": [
        {"index": 0, "text": " ok", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}}).encode()

    def handler(method, path, data):
        if path == "/health":
            return 200, "application/json", b"{}"
        return (status, "application/json", answer, extra or {})
    return t.FakeEngine(handler)


class EngineFacing(t.TestCase):
    """What engines receive: the client's bytes, hop-by-hop fields stripped, unique request ids."""

    def router_to(self, engine, *args):
        p = self.start(t.sim("--role", "prefill"))
        return self.start(t.router([p.port], [engine.port], "--handoff", "none", *args))

    def engine(self, **kw):
        e = fake_engine(**kw)
        self.addCleanup(e.stop)
        return e

    def gen_requests(self, e):
        return [(rq, h) for rq, h in zip(e.requests, e.headers) if rq[1] != "/health"]

    def test_body_bytes_reach_the_engine_unchanged(self):
        e = self.engine()
        r = self.router_to(e)
        body = (b'{"prompt": "hi \\u0000 there", "max_tokens" : 2, "seed": 9007199254740993, "x": 1e400,\n'
                b' "ids": [100000000000000001], "t": 1.0e-7, "s": "\\ud83d\\ude00 \xc3\xa9"}')
        st, _, _, out = ask(r.port, post(b"/v1/completions", body))
        self.assertEqual(st, 200, out)
        self.assertEqual(self.gen_requests(e)[-1][0][2], body)

    def test_kv_params_legs_keep_exact_numbers(self):
        kv = {"do_remote_decode": False, "do_remote_prefill": True, "remote_engine_id": "e", "remote_block_ids": [1],
              "remote_host": "h", "remote_port": 1}
        pe = self.engine(body=json.dumps({"id": "p", "choices": [{"text": "x"}], "kv_transfer_params": kv,
                                          "usage": {"prompt_tokens": 2}}).encode())
        de = self.engine()
        r = self.start(t.router([pe.port], [de.port]))
        body = b'{"prompt":"p","max_tokens":5,"seed":9007199254740993,"w":[1e400,0.1000000000000000055511151231257827]}'
        st, _, _, out = ask(r.port, post(b"/v1/completions", body))
        self.assertEqual(st, 200, out)
        pb, db = self.gen_requests(pe)[-1][0][2], self.gen_requests(de)[-1][0][2]
        for b in (pb, db):
            self.assertIn(b'"seed":9007199254740993', b)
            self.assertIn(b'"w":[1e400,0.1000000000000000055511151231257827]', b)
        self.assertEqual(json.loads(pb)["max_tokens"], 1)
        self.assertIs(json.loads(pb)["stream"], False)
        self.assertEqual(json.loads(db)["max_tokens"], 5)
        self.assertEqual(json.loads(db)["kv_transfer_params"], kv)

    def test_invalid_json_is_400(self):
        e = self.engine()
        r = self.router_to(e)
        for body in (b'{"prompt":"a","max_tokens":2} xyz', b'{"prompt":"a"}{"prompt":"b"}', b'{"prompt":NaN}',
                     b'{"prompt":"a","max_tokens":Infinity}', b'{"prompt":"\xff"}', b'{"prompt":"a",}',
                     b'{"prompt":"\\x"}', b'{"prompt":"a\x01"}', b'{"prompt":01}', b'[' * 600 + b']' * 600,
                     b'{"prompt":"a","\\u0000max_tokens":1}',
                     # UTF-8 that is not: overlong (3 and 2 bytes), cut short, a bad byte inside a run of Chinese
                     b'{"prompt":"\xe0\x80\x80"}', b'{"prompt":"\xc0\xaf"}', b'{"prompt":"\xe4\xb8"}',
                     b'{"prompt":"\xe4\xb8\xad\xe4\x28\xad"}', b'{"prompt":"\xf4\x90\x80\x80"}'):
            with self.subTest(body=body[:40]):
                st, _, _, out = ask(r.port, post(b"/v1/completions", body))
                self.assertOpenAIError(st, json.loads(out), 400)
        self.assertEqual(self.gen_requests(e), [])

    def test_duplicate_keys_last_wins(self):
        e = self.engine()
        r = self.router_to(e)
        st = ask(r.port, post(b"/v1/completions", b'{"max_tokens":1,"prompt":"a","max_tokens":3}'))[0]
        self.assertEqual(st, 200)
        self.assertEqual(self.gen_requests(e)[-1][0][2], b'{"prompt":"a","max_tokens":3}')

    def test_hop_by_hop_fields_not_forwarded(self):
        e = self.engine()
        r = self.router_to(e)
        st = ask(r.port, post(b"/v1/completions", BODY, b"Connection: X-Secret, keep-alive\r\n"
                              b"X-Secret: s\r\nX-Other: o\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\n"
                              b"Upgrade: h2c\r\nX-data-parallel-rank: 7\r\n"))[0]
        self.assertEqual(st, 200)
        h = {k.lower(): v for k, v in self.gen_requests(e)[-1][1].items()}
        self.assertEqual(h.get("x-other"), "o")
        for k in ("x-secret", "keep-alive", "te", "upgrade", "x-data-parallel-rank"):
            self.assertNotIn(k, h)

    def test_engine_429_passed_through_with_retry_after(self):
        err = json.dumps({"error": {"message": "busy", "type": "RateLimitError", "code": 429}}).encode()
        e = self.engine(status=429, extra={"Retry-After": "7"}, body=err)
        r = self.router_to(e)
        st, reason, h, out = ask(r.port, post(b"/v1/completions", BODY))
        self.assertEqual((st, reason, h.get("retry-after")), (429, "Too Many Requests", "7"))
        self.assertEqual(json.loads(out)["error"]["message"], "busy")

    def test_request_ids_unique_across_routers(self):
        e = self.engine()
        p = self.start(t.sim("--role", "prefill"))
        routers = [self.start(t.router([p.port], [e.port], "--handoff", "none")) for _ in range(2)]
        for r in routers:
            for _ in range(3):
                self.assertEqual(ask(r.port, post(b"/v1/completions", BODY))[0], 200)
        ids = [{k.lower(): v for k, v in h.items()}["x-request-id"] for _, h in self.gen_requests(e)]
        self.assertEqual(len(ids), 6)
        self.assertEqual(len(set(ids)), 6, ids)
        for i in ids:
            self.assertRegex(i, r"-[0-9a-f]{32}$")
        ask(routers[0].port, post(b"/v1/completions", BODY, b"X-Request-Id: client-id-1\r\n"))
        self.assertEqual({k.lower(): v for k, v in self.gen_requests(e)[-1][1].items()}["x-request-id"], "client-id-1")


if __name__ == "__main__":
    t.main()
