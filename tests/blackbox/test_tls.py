# SPDX-License-Identifier: Apache-2.0
"""TLS, with certificates this test generates (openssl CLI, a throwaway CA):
 - HTTPS for clients: streaming through curl and through Python's ssl; ALPN http/1.1; session resumption;
   what the router read from an engine at once reaches the client as one TLS record (counted on raw bytes);
   a TLS client that stops reading pauses the decode, then gets every byte framed and in order;
   --tls-min-version 1.3 refuses a TLS 1.2 client; plain HTTP sent to the TLS port gets a clear 400 and a
   close; a client that never handshakes is closed by --header-timeout-ms; a plain second listener
   (--plain-port) serves /metrics next to the TLS one;
 - mutual TLS: a client with a certificate from the CA is served, one without (or from another CA) is refused
   in the handshake and counted (xpyd_tls_handshake_failures_total{side="client"});
 - HTTPS engines: prefill and decode sims serving TLS, the decode pulling its KV from the prefill over TLS;
   an engine whose certificate is expired, for another host or from an unknown CA gets 502 like a connect
   failure, counted and logged once with the reason; mutual TLS to the engines;
 - SIGHUP rotation under load: new connections get the new certificate, no request fails; a bad pair is
   refused and the old one stays;
 - the OpenAI Node SDK streams over HTTPS (NODE_EXTRA_CA_CERTS), when node and the package are installed."""
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time

import xpyd_testlib as t

BODY = {"prompt": "hello tls", "max_tokens": 5, "ignore_eos": True}


class Certs:
    """A CA and certificates it signs, in a temporary directory."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="xpyd-tls-")
        self.ca, self.ca_key = self.path("ca.pem"), self.path("ca.key")
        self.run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
                 self.ca_key, "-out", self.ca, "-days", "2", "-subj", "/CN=xpyd test CA %s" % os.path.basename(self.dir))

    def path(self, name):
        return os.path.join(self.dir, name)

    def run(self, *args):
        subprocess.run(["openssl"] + list(args), check=True, capture_output=True)

    def issue(self, name, sans="DNS:localhost,IP:127.0.0.1", days=2, client=False):
        """Returns (cert, key) paths for a certificate with these subject alternative names."""
        key, csr, cert, ext = (self.path(name + x) for x in (".key", ".csr", ".pem", ".ext"))
        self.run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", csr,
                 "-subj", "/CN=%s" % name)
        with open(ext, "w") as f:
            f.write("subjectAltName=%s\n" % sans if sans else "")
            f.write("extendedKeyUsage=%s\n" % ("clientAuth" if client else "serverAuth"))
        self.run("x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", self.ca_key, "-CAcreateserial", "-out", cert,
                 "-days", str(days), "-extfile", ext)
        return cert, key

    def intermediate(self, name="inter"):
        """A CA certificate the root signs (an intermediate): (cert, key)."""
        key, csr, cert, ext = (self.path(name + x) for x in (".key", ".csr", ".pem", ".ext"))
        self.run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", csr,
                 "-subj", "/CN=xpyd test intermediate %s" % name)
        with open(ext, "w") as f:
            f.write("basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n")
        self.run("x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", self.ca_key, "-CAcreateserial", "-out", cert,
                 "-days", "2", "-extfile", ext)
        return cert, key

    def issue_under(self, issuer, name, sans="DNS:localhost,IP:127.0.0.1"):
        """A server certificate signed by issuer (cert, key): returns (cert, key)."""
        key, csr, cert, ext = (self.path(name + x) for x in (".key", ".csr", ".pem", ".ext"))
        self.run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", csr,
                 "-subj", "/CN=%s" % name)
        with open(ext, "w") as f:
            f.write("subjectAltName=%s\nextendedKeyUsage=serverAuth\n" % sans)
        self.run("x509", "-req", "-in", csr, "-CA", issuer[0], "-CAkey", issuer[1], "-CAcreateserial", "-out", cert,
                 "-days", "2", "-extfile", ext)
        return cert, key

    def cleanup(self):
        shutil.rmtree(self.dir, ignore_errors=True)


def https_get(port, path, ctx, host="localhost"):
    s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10), server_hostname=host)
    s.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path.encode())
    got = b""
    while True:
        c = s.recv(65536)
        if not c:
            break
        got += c
    s.close()
    return got.partition(b"\r\n\r\n")[2]


def tls_ctx(ca, cert=None, key=None, maxv=None):
    c = ssl.create_default_context(cafile=ca)
    if cert:
        c.load_cert_chain(cert, key)
    if maxv:
        c.maximum_version = maxv
    return c


def https_post(port, body, ctx, host="localhost", path="/v1/completions", session=None):
    """One request on a new TLS connection; returns (status, body bytes, sslsock facts)."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    s = ctx.wrap_socket(raw, server_hostname=host, session=session)
    data = json.dumps(body).encode()
    s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(data), data))
    got = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ssl.SSLError:
            break
        if not chunk:
            break
        got += chunk
    facts = {"alpn": s.selected_alpn_protocol(), "reused": s.session_reused, "session": s.session,
             "version": s.version(), "cert": s.getpeercert()}
    s.close()
    head, _, rest = got.partition(b"\r\n\r\n")
    return int(head.split()[1]), rest, facts


class TlsCase(t.TestCase):
    def setUp(self):
        super().setUp()
        self.certs = Certs()
        self.addCleanup(self.certs.cleanup)
        self.cert, self.key = self.certs.issue("server")

    def engine(self, *args):
        return self.start(t.sim("--role", "both", "--decode-us-per-token", "200", *args))

    def tls_router(self, engines, *args):
        return self.start(t.Proc("xpyd_router", ["--port", "0", "--log-level", "warn", "--handoff", "none", "-d"] +
                                 engines + ["--tls-cert", self.cert, "--tls-key", self.key] + list(args),
                                 ready_path=None))


class ClientSide(TlsCase):
    def test_https_streaming_curl_and_python(self):
        e = self.engine()
        r = self.tls_router(["127.0.0.1:%d" % e.port])
        out = subprocess.run(["curl", "-sN", "--cacert", self.certs.ca, "https://localhost:%d/v1/completions" % r.port,
                              "-d", json.dumps(dict(BODY, stream=True))], capture_output=True, timeout=20)
        events = [l for l in out.stdout.decode().split("\n\n") if l.startswith("data: ")]
        self.assertEqual(events[-1], "data: [DONE]", out)
        self.assertEqual(len(events), 6)
        ctx = tls_ctx(self.certs.ca)
        ctx.set_alpn_protocols(["h2", "http/1.1"])
        st, body, facts = https_post(r.port, BODY, ctx)
        self.assertEqual(st, 200, body)
        self.assertEqual(json.loads(body)["usage"]["completion_tokens"], 5)
        self.assertEqual(facts["alpn"], "http/1.1")
        # resumption: the session of one connection resumes on the next (TLS 1.3 tickets)
        st, _, f2 = https_post(r.port, BODY, ctx, session=facts["session"])
        self.assertEqual(st, 200)
        self.assertTrue(f2["reused"])
        # the router's own state, read over TLS: every load back to zero
        t.wait_until(lambda: all(i["inflight"] == 0 and i["outstanding_tokens"] == 0
                                 for p in json.loads(https_get(r.port, "/status", ctx))["pools"].values()
                                 for i in p["instances"]), what="idle")

    def test_keep_alive_every_kind_of_request(self):
        # one TLS connection, requests of every kind in turn (streamed, not, chat, an error, GETs): each answered
        # (the second request on a TLS keep-alive connection once hung: the guard froze the input of the
        # OpenSSL bufferevent), then the connection's limits still hold: an oversized head gets 431
        e = self.engine()
        r = self.tls_router(["127.0.0.1:%d" % e.port], "--max-header-bytes", "4096")
        ctx = tls_ctx(self.certs.ca)
        s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", r.port), timeout=10), server_hostname="localhost")
        conn = t.RawConn.__new__(t.RawConn)
        conn.s, conn.buf = s, b""
        reqs = [("POST", "/v1/completions", dict(BODY, stream=True), 200),
                ("POST", "/v1/completions", BODY, 200),
                ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}, 200),
                ("POST", "/v1/completions", {"prompt": "x", "max_tokens": -1}, 400),
                ("GET", "/health", None, 200), ("GET", "/v1/models", None, 200), ("GET", "/nope", None, 404)]
        for method, path, body, want in reqs * 2:
            data = json.dumps(body).encode() if body is not None else b""
            s.sendall(b"%s %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                      % (method.encode(), path.encode(), len(data), data))
            st = conn.response()[0]
            self.assertEqual(st, want, (method, path))
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 5000 + b"\r\n\r\n")
        self.assertEqual(conn.response()[0], 431)
        s.close()

    def test_hang_up_mid_stream_and_while_waiting(self):
        # A TLS client that goes away is seen at once, both while its stream is written (the decode is told)
        # and while nothing is (the engine holds the request 10 s): the connection is read while an answer is
        # in progress, as between requests
        streaming = self.start(t.sim("--role", "both", "--decode-us-per-token", "5000"))
        stalled = self.start(t.sim("--role", "both", "--stall-ms", "10000"))
        ctx = tls_ctx(self.certs.ca)
        for e, tokens in ((streaming, 2000), (stalled, 5)):  # 2,000 tokens at 5 ms: ten seconds of stream
            with self.subTest(stalled=e is stalled):
                r = self.tls_router(["127.0.0.1:%d" % e.port])
                s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", r.port), timeout=10),
                                    server_hostname="localhost")
                body = json.dumps({"prompt": "a b", "max_tokens": tokens, "stream": True, "ignore_eos": True}).encode()
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                          % (len(body), body))
                if e is streaming:
                    self.assertIn(b" 200 ", s.recv(65536))
                    t.wait_until(lambda: t.metric(e.port, "vllm:generation_tokens_total") >= 10, what="streaming")
                else:
                    t.wait_until(lambda: t.metric(e.port, "xpyd_sim:requests_total") == 1, what="engine got it")
                s.close()
                t.wait_until(lambda: t.metric(e.port, "xpyd_sim:requests_aborted_total") == 1, timeout=5,
                             what="the engine told, long before the answer's end")
                t.wait_until(lambda: json.loads(https_get(r.port, "/status", ctx))["active_requests"] == 0,
                             what="idle")
                self.assertIn(b"\nxpyd_client_disconnects_total 1\n", https_get(r.port, "/metrics", ctx))

    def test_plain_http_to_tls_port_and_plain_listener(self):
        e = self.engine()
        r = self.tls_router(["127.0.0.1:%d" % e.port], "--plain-port", "0")
        with open(r.port_file) as f:
            plain_port = int(f.read().split()[1])
        st, _, body = t.request(r.port, "GET", "/health")  # plain HTTP to the TLS port
        self.assertEqual(st, 400)
        self.assertIn(b"this port speaks HTTPS", body)
        self.assertEqual(t.request(plain_port, "GET", "/health")[0], 200)
        self.assertEqual(t.metric(plain_port, 'xpyd_tls_handshake_failures_total{side="client"}'), 1)
        st, _, out = t.post_json(plain_port, "/v1/completions", BODY)  # every endpoint, plain
        self.assertEqual(st, 200, out)
        # a second plain request from the same address: counted, logged once
        t.request(r.port, "GET", "/health")
        self.assertEqual(t.metric(plain_port, 'xpyd_tls_handshake_failures_total{side="client"}'), 2)
        r.stop()
        self.assertEqual(r.output().count("event=tls_handshake_failed side=client"), 1, r.output())

    def test_handshake_must_complete_within_the_header_timeout(self):
        e = self.engine()
        r = self.tls_router(["127.0.0.1:%d" % e.port], "--header-timeout-ms", "300")
        s = socket.create_connection(("127.0.0.1", r.port), timeout=5)
        t0 = time.monotonic()
        s.settimeout(5)
        self.assertEqual(s.recv(100), b"")  # closed by the router, nothing said
        self.assertLess(time.monotonic() - t0, 3)
        s.close()
        # and after a completed request, an idle keep-alive TLS connection is closed by its own timeout
        r2 = self.tls_router(["127.0.0.1:%d" % e.port], "--keepalive-timeout-ms", "300")
        ctx = tls_ctx(self.certs.ca)
        k = ctx.wrap_socket(socket.create_connection(("127.0.0.1", r2.port), timeout=5), server_hostname="localhost")
        data = json.dumps(BODY).encode()
        k.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
        got = b""
        while b'"usage"' not in got:
            got += k.recv(65536)
        t0 = time.monotonic()
        while True:
            try:
                if not k.recv(65536):
                    break
            except (ssl.SSLError, OSError):
                break
        self.assertLess(time.monotonic() - t0, 3)
        k.close()

    def test_min_version_13(self):
        e = self.engine()
        r = self.tls_router(["127.0.0.1:%d" % e.port], "--tls-min-version", "1.3")
        with self.assertRaises(ssl.SSLError):
            https_post(r.port, BODY, tls_ctx(self.certs.ca, maxv=ssl.TLSVersion.TLSv1_2))
        st, _, facts = https_post(r.port, BODY, tls_ctx(self.certs.ca))
        self.assertEqual((st, facts["version"]), (200, "TLSv1.3"))

    def test_mutual_tls(self):
        e = self.engine()
        ccert, ckey = self.certs.issue("client", sans=None, client=True)
        other = Certs()
        self.addCleanup(other.cleanup)
        ocert, okey = other.issue("intruder", sans=None, client=True)
        r = self.tls_router(["127.0.0.1:%d" % e.port], "--tls-client-ca", self.certs.ca, "--plain-port", "0")
        with open(r.port_file) as f:
            plain_port = int(f.read().split()[1])
        st, _, _ = https_post(r.port, BODY, tls_ctx(self.certs.ca, ccert, ckey))
        self.assertEqual(st, 200)
        for ctx in (tls_ctx(self.certs.ca), tls_ctx(self.certs.ca, ocert, okey)):
            with self.assertRaises((ssl.SSLError, ConnectionResetError, BrokenPipeError, ValueError)):
                st, body, _ = https_post(r.port, BODY, ctx)
                if st == 200:
                    raise AssertionError("served without a valid client certificate")
                raise ValueError(body)
        t.wait_until(lambda: t.metric(plain_port, 'xpyd_tls_handshake_failures_total{side="client"}') == 2,
                     what="two refused handshakes counted")

    def test_bad_settings_refused(self):
        cases = [(["--tls-cert", self.cert], "go together"),
                 (["--tls-cert", self.cert, "--tls-key", self.certs.ca_key], "does not match"),
                 (["--tls-cert", "/nonexistent.pem", "--tls-key", self.key], "cannot open"),
                 (["--tls-min-version", "1.1"], "tls-min-version")]
        for args, needle in cases:
            p = t.Proc("xpyd_router", ["--port", "0", "-d", "127.0.0.1:1", "--handoff", "none"] + args, port_flag=False)
            self.assertNotEqual(p.p.wait(10), 0)
            self.assertIn(needle, p.output())
            p.stop(check=False)

    def test_events_larger_than_a_record(self):
        # events of 40 KB and 20 KB (more than a TLS record holds, beyond what is written through at once) between
        # small ones, from an engine that sends its whole stream in one answer: every event arrives byte for byte,
        # twice on one keep-alive connection, and a JSON answer after them
        big = "x" * 40000

        def ev(text):
            return ("data: " + json.dumps({"id": "cmpl-1", "object": "text_completion", "model": "m",
                                           "choices": [{"index": 0, "text": text, "finish_reason": None}]}) + "\n\n")

        texts = ["a", big, "b", big[:20000], "c"]
        stream = ("".join(ev(x) for x in texts) + "data: [DONE]\n\n").encode()

        def handler(method, path, body):
            if json.loads(body or b"{}").get("stream"):
                return 200, "text/event-stream", stream
            return 200, "application/json", json.dumps({"id": "cmpl-2", "object": "text_completion", "choices": [
                {"index": 0, "text": big, "finish_reason": "length"}], "usage": {"prompt_tokens": 1,
                "completion_tokens": 5, "total_tokens": 6}}).encode()

        e = t.FakeEngine(handler)
        self.addCleanup(e.stop)
        r = self.tls_router(["127.0.0.1:%d" % e.port])
        ctx = tls_ctx(self.certs.ca)
        s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", r.port), timeout=10), server_hostname="localhost")
        conn = t.RawConn.__new__(t.RawConn)
        conn.s, conn.buf = s, b""
        for body in (dict(BODY, stream=True), dict(BODY, stream=True), BODY):
            data = json.dumps(body).encode()
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
            st, _, _, got = conn.response()
            self.assertEqual(st, 200)
            if body.get("stream"):
                self.assertEqual(got, stream)
            else:
                self.assertEqual(json.loads(got)["choices"][0]["text"], big)
        s.close()
        t.wait_until(lambda: all(i["inflight"] == 0 and i["outstanding_tokens"] == 0
                                 for p in json.loads(https_get(r.port, "/status", ctx))["pools"].values()
                                 for i in p["instances"]), what="idle")


def stream_answer(n):
    """A streamed completion as an engine sends it: a chunked head, each SSE event an HTTP chunk of its own."""
    out = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    for i in range(n + 1):
        ev = {"id": "cmpl-rec", "object": "text_completion", "created": 1, "model": "m",
              "choices": [{"index": 0, "text": "" if i == n else "t%d" % i, "logprobs": None,
                           "finish_reason": "length" if i == n else None}]}
        data = b"data: " + json.dumps(ev).encode() + b"\n\n"
        out += b"%x\r\n%s\r\n" % (len(data), data)
    done = b"data: [DONE]\n\n"
    return out + b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done)


class Records(TlsCase):
    def test_one_engine_read_is_one_tls_record(self):
        # An engine writes its whole streamed answer (head, 17 events as 17 HTTP chunks, [DONE], the end) at
        # once. What the router read at once reaches the client as one TLS record: an OpenSSL bufferevent makes
        # a record (and a write) of every piece of its output, which was 19 records for this answer. The
        # client reads the raw bytes itself (ssl.MemoryBIO) to count the records.
        answer = stream_answer(16)

        def serve(c, n):
            buf = b""
            with c:
                while True:
                    req = t.recv_request(c, buf)
                    if req is None:
                        return
                    head, _, buf = req
                    if head.startswith(b"GET"):
                        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
                    else:
                        c.sendall(answer)  # one write: the router reads it at once

        eng = t.RawServer(serve)
        self.addCleanup(eng.stop)
        r = self.tls_router(["127.0.0.1:%d" % eng.port])
        sock = socket.create_connection(("127.0.0.1", r.port), timeout=10)
        self.addCleanup(sock.close)
        inc, outg = ssl.MemoryBIO(), ssl.MemoryBIO()
        obj = tls_ctx(self.certs.ca).wrap_bio(inc, outg, server_hostname="localhost")
        raw = b""

        def pump():
            nonlocal raw
            d = sock.recv(65536)
            self.assertTrue(d, "the router closed the connection")
            raw += d

        while True:
            try:
                obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                sock.sendall(outg.read())
                pump()
                inc.write(raw)
                raw = b""
        sock.sendall(outg.read())
        body = json.dumps(dict(BODY, stream=True, max_tokens=16)).encode()
        req = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

        def exchange():
            """Sends one request; returns (the answer's plaintext, application-data records it came in)."""
            nonlocal raw
            obj.write(req)
            sock.sendall(outg.read())
            text, records = b"", 0
            while not text.endswith(b"0\r\n\r\n"):
                while len(raw) < 5 or len(raw) < 5 + int.from_bytes(raw[3:5], "big"):
                    pump()
                n = 5 + int.from_bytes(raw[3:5], "big")
                rec, raw = raw[:n], raw[n:]
                records += rec[0] == 23
                inc.write(rec)
                try:
                    while True:
                        text += obj.read(65536)
                except ssl.SSLWantReadError:
                    pass
            return text, records

        exchange()  # the first answer on the connection also carries the session tickets
        text, records = exchange()
        self.assertIn(b"200 OK", text.split(b"\r\n")[0])
        self.assertEqual(text.count(b"data: "), 18, text)  # 17 events and [DONE], all relayed
        self.assertEqual(records, 1, "the answer came in %d TLS records" % records)


class BioConn:
    """A TLS client connection whose records the test puts on the wire itself (ssl.MemoryBIO): queue() makes
    records, flush() sends every queued record in one write; recv() is what RawConn reads through."""

    def __init__(self, port, ca):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.inc, self.outg = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj = tls_ctx(ca).wrap_bio(self.inc, self.outg, server_hostname="localhost")
        while True:
            try:
                self.obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                self.sock.sendall(self.outg.read())
                self._pump()
        # the client's last handshake flight is still in outg: it goes out with the first flush

    def _pump(self):
        d = self.sock.recv(65536)
        if not d:
            raise EOFError("connection closed by the router")
        self.inc.write(d)

    def queue(self, *pieces):
        for p in pieces:
            self.obj.write(p)  # one TLS record each

    def flush(self):
        self.sock.sendall(self.outg.read())

    def recv(self, n):
        while True:
            try:
                return self.obj.read(n)
            except ssl.SSLWantReadError:
                self._pump()

    def close(self):
        self.sock.close()


def post_records(body):
    """A request as two TLS records' worth: its head, then its body."""
    data = json.dumps(body).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"\r\n" % len(data), data)


class ReadAhead(TlsCase):
    """The router reads TLS clients with OpenSSL's read-ahead (one read per request, not one for a record's
    header and one for its body): a read takes everything the socket holds, so whole records can wait inside
    OpenSSL with nothing more coming on the socket to wake the router. Several records sent in one TCP write
    must all be answered; a stall shows as the socket timeout."""

    def conn(self, port):
        c = BioConn(port, self.certs.ca)
        self.addCleanup(c.close)
        raw = t.RawConn.__new__(t.RawConn)
        raw.s, raw.buf = c, b""
        return c, raw

    def idle(self, port):
        ctx = tls_ctx(self.certs.ca)
        t.wait_until(lambda: all(i["inflight"] == 0 and i["outstanding_tokens"] == 0
                                 for p in json.loads(https_get(port, "/status", ctx))["pools"].values()
                                 for i in p["instances"]), what="idle")

    def test_records_sent_together_are_all_read(self):
        e = self.engine()
        r = self.tls_router(["127.0.0.1:%d" % e.port])
        c, raw = self.conn(r.port)
        # the first request (head and body: two records) in the same write as the handshake's last flight
        c.queue(*post_records(BODY))
        c.flush()
        st, _, _, got = raw.response()
        self.assertEqual(st, 200, got)
        self.assertEqual(json.loads(got)["usage"]["completion_tokens"], 5)
        # two pipelined requests, four records, one write; then a stream and a request the same way
        for bodies in ((BODY, BODY), (dict(BODY, stream=True), BODY)):
            for b in bodies:
                c.queue(*post_records(b))
            c.flush()
            for b in bodies:
                st, _, hdrs, got = raw.response()
                self.assertEqual(st, 200, got)
                if b.get("stream"):
                    self.assertTrue(got.endswith(b"data: [DONE]\n\n"), got[-200:])
                    self.assertEqual(got.count(b"data: "), 6, got)  # 5 tokens (the last with the finish), [DONE]
                else:
                    self.assertEqual(json.loads(got)["usage"]["completion_tokens"], 5)
        self.idle(r.port)

    def test_reading_held_back_then_resumed(self):
        # a stream in progress while 80 KB of pipelined requests arrive in one write, past the hold bound
        # (--max-header-bytes + 64 KiB): the router stops reading, and what OpenSSL had already taken off the
        # socket (the rest of the write: nothing more comes on the socket to wake the router) is read once the
        # answers before it are done. The requests are ones the router answers itself at once (GET /v1/models),
        # so that nothing but the resumed reading brings in the last of them.
        e = self.start(t.sim("--role", "both", "--decode-us-per-token", "3000"))
        r = self.tls_router(["127.0.0.1:%d" % e.port], "--max-header-bytes", "1024")
        c, raw = self.conn(r.port)
        c.queue(*post_records(dict(BODY, stream=True, max_tokens=40)))
        n = 80
        for i in range(n):
            c.queue(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Pad: %d-%s\r\n\r\n" % (i, b"p" * 900))
        c.flush()
        st, _, _, got = raw.response()
        self.assertEqual(st, 200)
        self.assertEqual(got.count(b"data: "), 41, got[-300:])  # 40 tokens, [DONE]
        for _ in range(n):
            st, _, _, got = raw.response()
            self.assertEqual(st, 200, got)
            self.assertEqual(json.loads(got)["object"], "list")
        self.idle(r.port)


def dechunk(data):
    """The body of a chunked answer, checking every chunk's framing (a byte out of order breaks it)."""
    out, i = [], 0
    while True:
        j = data.index(b"\r\n", i)
        n = int(data[i:j], 16)
        if n == 0:
            assert data[j + 2:] == b"\r\n", data[j:j + 40]
            return b"".join(out)
        out.append(data[j + 2:j + 2 + n])
        assert data[j + 2 + n:j + 4 + n] == b"\r\n", data[j + n - 20:j + n + 20]
        i = j + 4 + n


class SlowTlsClient(TlsCase):
    sock = None

    def tearDown(self):
        if self.sock:  # before the router is stopped (cleanups run after tearDown): an open stream holds its drain
            self.sock.close()
        super().tearDown()

    def test_backpressure_then_every_byte_in_order(self):
        self.backpressure(65536)

    def test_backpressure_with_a_large_client_buffer(self):
        # 8 MiB held for the client: once it reads again, the OpenSSL bufferevent writes megabytes at a time
        # into a socket that fills under them (writes told to try again, not errors)
        self.backpressure(8 << 20)

    def backpressure(self, buffer_bytes):
        # The router writes a TLS stream's bytes from the relay itself while the socket takes them, and leaves
        # them to the OpenSSL bufferevent once it does not: a client that stops reading fills the socket, the
        # decode leg is paused, and when the client reads again everything arrives, framed and in order, with
        # the same connection then serving a second stream.
        n = 200000  # ≈ 45 MB of SSE at zero delay: far more than the loopback socket buffers (~16 MB) hold, as
        # test_slow_client (at 40,000 tokens everything sometimes fitted in them and nothing waited at the engine)
        d = self.start(t.sim("--role", "both", "--decode-us-per-token", "0", "--max-model-len", "1000000"))
        r = self.tls_router(["127.0.0.1:%d" % d.port], "--client-buffer-bytes", str(buffer_bytes))
        s = tls_ctx(self.certs.ca).wrap_socket(socket.create_connection(("127.0.0.1", r.port), timeout=20),
                                               server_hostname="localhost")
        self.sock = s

        def ask(tokens):
            body = json.dumps({"prompt": "a", "max_tokens": tokens, "stream": True, "ignore_eos": True}).encode()
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

        def read_answer():
            data, deadline = bytearray(), time.monotonic() + 60
            while not data.endswith(b"\r\n0\r\n\r\n"):
                c = s.recv(1 << 20)
                self.assertTrue(c, "the router closed the connection")
                data += c
                self.assertLess(len(data), 64 << 20, "far more bytes than the stream has")
                self.assertLess(time.monotonic(), deadline, "the answer did not end")
            data = bytes(data)
            head, _, body = data.partition(b"\r\n\r\n")
            self.assertIn(b" 200 ", head.split(b"\r\n")[0])
            events = dechunk(body).split(b"\n\n")
            self.assertEqual(events[-2:], [b"data: [DONE]", b""])
            return [json.loads(e[6:]) for e in events[:-2] if e.startswith(b"data: {")]

        ask(n)
        # the decode holds its stream back once the router stops taking it (had the router kept reading, all
        # of it would have been generated and would sit in the router)
        t.wait_until(lambda: t.metric(d.port, "xpyd_sim:stream_backpressure_waits_total") > 200, timeout=30,
                     what="the decode held back by its reader")
        self.assertLess(t.metric(d.port, "vllm:generation_tokens_total"), n // 2, "the router kept reading")
        texts = [e["choices"][0]["text"] for e in read_answer() if e.get("choices")]
        self.assertEqual(len([x for x in texts if x]), n)
        ask(16)  # the same connection, after the backlog: written through again
        self.assertEqual(len([e for e in read_answer() if e.get("choices") and e["choices"][0]["text"]]), 16)
        t.wait_until(lambda: json.loads(https_get(r.port, "/status", tls_ctx(self.certs.ca)))["active_requests"] == 0,
                     what="idle")


class Rotation(TlsCase):
    def test_sighup_rotation_under_load(self):
        e = self.engine()
        live_cert, live_key = self.certs.path("live.pem"), self.certs.path("live.key")
        shutil.copy(self.cert, live_cert)
        shutil.copy(self.key, live_key)
        r = self.start(t.Proc("xpyd_router", ["--port", "0", "--log-level", "info", "--handoff", "none", "-d",
                                              "127.0.0.1:%d" % e.port, "--tls-cert", live_cert, "--tls-key", live_key,
                                              "--plain-port", "0"], ready_path=None))
        with open(r.port_file) as f:
            plain_port = int(f.read().split()[1])
        ctx = tls_ctx(self.certs.ca)
        first_serial = https_post(r.port, BODY, ctx)[2]["cert"]["serialNumber"]
        results, stop = [], threading.Event()

        def load():
            while not stop.is_set():
                try:  # a new connection (a new handshake) every time
                    st, _, facts = https_post(r.port, BODY, ctx)
                    results.append((st, facts["cert"]["serialNumber"]))
                except Exception as ex:  # any failure fails the test below
                    results.append((repr(ex), None))

        ths = [threading.Thread(target=load) for _ in range(4)]
        for th in ths:
            th.start()
        t.wait_until(lambda: len(results) >= 20, what="load running")
        new_cert, new_key = self.certs.issue("server2")
        shutil.copy(new_cert, live_cert + ".tmp")
        shutil.copy(new_key, live_key + ".tmp")
        os.rename(live_cert + ".tmp", live_cert)
        os.rename(live_key + ".tmp", live_key)
        r.signal(signal.SIGHUP)
        t.wait_until(lambda: t.metric(plain_port, "xpyd_tls_certificate_reloads_total") == 1, what="reloaded")
        n = len(results)
        t.wait_until(lambda: len(results) >= n + 20, what="load after the reload")
        stop.set()
        for th in ths:
            th.join()
        self.assertTrue(all(st == 200 for st, _ in results), [x for x in results if x[0] != 200][:3])
        serials = [s for _, s in results]
        self.assertEqual(serials[0], first_serial)
        self.assertNotEqual(serials[-1], first_serial)  # new handshakes got the new certificate
        # a bad pair (key of another certificate) is refused; the current one stays
        shutil.copy(self.key, live_key)
        r.signal(signal.SIGHUP)
        t.wait_until(lambda: "event=tls_reload_failed" in r.output(), what="reload refused")
        self.assertEqual(https_post(r.port, BODY, ctx)[0], 200)
        self.assertEqual(t.metric(plain_port, "xpyd_tls_certificate_reloads_total"), 1)


def tls_sim(*args):
    """An xpyd_sim serving TLS, ready once it answers /health over TLS (certificate not checked here)."""
    p = t.Proc("xpyd_sim", ["--port", "0"] + list(args), ready_path=None)
    unverified = ssl._create_unverified_context()
    t.wait_until(lambda: https_get(p.port, "/health", unverified) is not None, what="TLS sim ready")
    return p


class Chain(TlsCase):
    def test_intermediates_served_at_start_and_after_reload_and_a_torn_chain_refused(self):
        """root -> intermediate -> leaf, the leaf and its intermediate in --tls-cert: clients that trust only the
        root verify the router at start and after a SIGHUP renewal (the intermediate is sent with the leaf); a
        renewal whose chain file is half written (a truncated intermediate) is refused and the pair in use
        stays, chain included."""
        e = self.engine()
        inter = self.certs.intermediate()
        live_cert, live_key = self.certs.path("live.pem"), self.certs.path("live.key")

        def install(leaf):
            with open(live_cert + ".tmp", "w") as f:
                f.write(open(leaf[0]).read() + open(inter[0]).read())
            shutil.copy(leaf[1], live_key + ".tmp")
            os.rename(live_cert + ".tmp", live_cert)
            os.rename(live_key + ".tmp", live_key)

        leaf1 = self.certs.issue_under(inter, "leaf1")
        install(leaf1)
        r = self.start(t.Proc("xpyd_router", ["--port", "0", "--log-level", "info", "--handoff", "none", "-d",
                                              "127.0.0.1:%d" % e.port, "--tls-cert", live_cert, "--tls-key", live_key,
                                              "--plain-port", "0"], ready_path=None))
        with open(r.port_file) as f:
            plain_port = int(f.read().split()[1])
        ctx = tls_ctx(self.certs.ca)  # the root only
        st, _, facts = https_post(r.port, BODY, ctx)
        self.assertEqual(st, 200)
        self.assertEqual(dict(x[0] for x in facts["cert"]["subject"])["commonName"], "leaf1")
        leaf2 = self.certs.issue_under(inter, "leaf2")
        install(leaf2)
        r.signal(signal.SIGHUP)
        t.wait_until(lambda: t.metric(plain_port, "xpyd_tls_certificate_reloads_total") == 1, what="reloaded")
        st, _, facts = https_post(r.port, BODY, ctx)
        self.assertEqual(st, 200)
        self.assertEqual(dict(x[0] for x in facts["cert"]["subject"])["commonName"], "leaf2")
        # a renewal caught half written: the intermediate cut short
        leaf3 = self.certs.issue_under(inter, "leaf3")
        whole = open(leaf3[0]).read() + open(inter[0]).read()
        with open(live_cert, "w") as f:
            f.write(whole[:len(open(leaf3[0]).read()) + 200])
        shutil.copy(leaf3[1], live_key)
        r.signal(signal.SIGHUP)
        t.wait_until(lambda: "event=tls_reload_failed" in r.output(), what="the torn chain refused")
        self.assertIn("not whole", r.output())
        self.assertEqual(t.metric(plain_port, "xpyd_tls_certificate_reloads_total"), 1)
        st, _, facts = https_post(r.port, BODY, ctx)  # the pair in use, with its chain, is still served
        self.assertEqual(st, 200)
        self.assertEqual(dict(x[0] for x in facts["cert"]["subject"])["commonName"], "leaf2")

    def test_a_torn_chain_is_refused_at_start(self):
        inter = self.certs.intermediate()
        leaf = self.certs.issue_under(inter, "leaf")
        torn = self.certs.path("torn.pem")
        whole = open(leaf[0]).read() + open(inter[0]).read()
        with open(torn, "w") as f:
            f.write(whole[:len(open(leaf[0]).read()) + 120])
        p = t.Proc("xpyd_router", ["--port", "0", "--handoff", "none", "-d", "127.0.0.1:1", "--tls-cert", torn,
                                   "--tls-key", leaf[1]], port_flag=False)
        self.assertEqual(p.p.wait(10), 2)
        p.stop(check=False)
        self.assertIn("not whole", p.output())


class Upstream(TlsCase):
    def test_pd_over_https_engines(self):
        tls = ["--tls-cert", self.cert, "--tls-key", self.key]
        p = self.start(tls_sim("--role", "prefill", *tls))
        d = self.start(tls_sim("--role", "decode", "--decode-us-per-token", "200", "--upstream-ca", self.certs.ca, *tls))
        r = self.start(t.router(["https://127.0.0.1:%d" % p.port], ["https://localhost:%d" % d.port],
                                "--upstream-ca", self.certs.ca))
        st, _, out = t.post_json(r.port, "/v1/completions", BODY)
        self.assertEqual(st, 200, out)
        evs = t.Stream(r.port, "/v1/completions", dict(BODY, stream=True)).read_all()
        self.assertEqual(evs[-1], "[DONE]")
        self.assertEqual(len(t.content_events(evs)), 5)
        # the decode pulled the KV from the prefill over TLS (its own /metrics, read over TLS)
        page = https_get(d.port, "/metrics", tls_ctx(self.certs.ca)).decode()
        self.assertIn('xpyd_sim:handoffs_total{mode="kv-params",result="done"} 2', page)
        self.assertEqual(t.metric(r.port, 'xpyd_tls_handshake_failures_total{side="upstream"}'), 0)
        self.idle(r)

    def check_refused(self, engine_cert, engine_key, host, needle):
        e = self.start(tls_sim("--role", "both", "--tls-cert", engine_cert, "--tls-key", engine_key))
        r = self.start(t.router([], ["https://%s:%d" % (host, e.port)], "--handoff", "none", "--upstream-ca",
                                self.certs.ca, "--max-retries", "0"))
        for _ in range(2):
            st, _, out = t.post_json(r.port, "/v1/completions", BODY)
            self.assertOpenAIError(st, out, 502, "TLS handshake failed")
        # both requests' handshakes failed (the health checks' count too)
        self.assertGreaterEqual(t.metric(r.port, 'xpyd_tls_handshake_failures_total{side="upstream"}'), 2)
        self.assertEqual(t.metric(r.port, 'xpyd_request_errors_total{reason="decode_connect"}'), 2)
        self.idle(r)
        r.stop()
        self.assertEqual(r.output().count("event=tls_handshake_failed side=upstream"), 1, r.output())
        self.assertIn(needle, r.output())

    def test_expired_engine_certificate(self):
        cert, key = self.certs.issue("expired", days=-1)
        self.check_refused(cert, key, "127.0.0.1", "certificate verify failed")

    def test_wrong_host(self):
        cert, key = self.certs.issue("elsewhere", sans="DNS:elsewhere.example")
        self.check_refused(cert, key, "127.0.0.1", "certificate verify failed")

    def test_unknown_ca(self):
        other = Certs()
        self.addCleanup(other.cleanup)
        cert, key = other.issue("stranger")
        self.check_refused(cert, key, "localhost", "certificate verify failed")

    def test_mutual_tls_to_engines(self):
        ccert, ckey = self.certs.issue("router-client", sans=None, client=True)
        e = self.start(t.Proc("xpyd_sim", ["--port", "0", "--role", "both", "--tls-cert", self.cert, "--tls-key",
                                           self.key, "--tls-client-ca", self.certs.ca], ready_path=None))
        with_cert = tls_ctx(self.certs.ca, ccert, ckey)
        t.wait_until(lambda: https_get(e.port, "/health", with_cert) is not None, what="mutual-TLS engine ready")
        bare = self.start(t.router([], ["https://127.0.0.1:%d" % e.port], "--handoff", "none", "--upstream-ca",
                                   self.certs.ca, "--max-retries", "0"))
        st, _, out = t.post_json(bare.port, "/v1/completions", BODY)
        self.assertEqual(st, 502, out)  # no client certificate: the engine refuses
        r = self.start(t.router([], ["https://127.0.0.1:%d" % e.port], "--handoff", "none", "--upstream-ca",
                                self.certs.ca, "--upstream-cert", ccert, "--upstream-key", ckey))
        st, _, out = t.post_json(r.port, "/v1/completions", BODY)
        self.assertEqual(st, 200, out)
        self.idle(r)


class NodeSdk(TlsCase):
    def test_openai_node_sdk_streams_over_https(self):
        npm_dir = t.NPM_DIR
        t.npm_package("openai")  # installed if missing (skipped, saying why, only when it cannot be)
        e = self.engine()
        r = self.tls_router(["127.0.0.1:%d" % e.port])
        script = """
const OpenAI = require('openai');
(async () => {
  const client = new OpenAI({baseURL: 'https://localhost:%d/v1', apiKey: 'none'});
  const stream = await client.completions.create({model: 'sim-model', prompt: 'hello node', max_tokens: 6,
                                                  stream: true, ignore_eos: true});
  let n = 0; for await (const ev of stream) { if (ev.choices.length && ev.choices[0].text) n++; }
  console.log(JSON.stringify({chunks: n}));
})().catch(e => { console.error(e); process.exit(1); });
""" % r.port
        out = subprocess.run(["node", "-e", script], capture_output=True, timeout=60, cwd=npm_dir,
                             env=dict(os.environ, NODE_EXTRA_CA_CERTS=self.certs.ca,
                                      NODE_PATH=os.path.join(npm_dir, "node_modules")))
        self.assertEqual(out.returncode, 0, out.stderr.decode()[-2000:])
        self.assertEqual(json.loads(out.stdout.decode().strip().splitlines()[-1]), {"chunks": 6})


if __name__ == "__main__":
    t.main()
