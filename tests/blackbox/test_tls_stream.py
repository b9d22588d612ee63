# SPDX-License-Identifier: Apache-2.0
"""A TLS client's stream, byte by byte: what the router read from an engine at once reaches the client as one
TLS record (counted on raw bytes); requests that arrive with the handshake or behind each other in one read
(OpenSSL's read-ahead) are served; a TLS client that stops reading pauses the decode, then gets every byte
framed and in order. Certificates and helpers: tlslib.py."""
import json
import socket
import ssl
import time

import xpyd_testlib as t
from tlslib import BODY, TlsCase, https_get, tls_ctx


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


if __name__ == "__main__":
    t.main()
