# SPDX-License-Identifier: Apache-2.0
"""A pooled keep-alive connection the engine closes just as the router reuses it (no answer byte came back)
is retried once on a fresh connection, transparently (even with --max-retries 0): the client never sees it."""
import json
import time

import xpyd_testlib as t

ANSWER = (b'{"id":"c","object":"text_completion","model":"m","choices":[{"index":0,"text":" ok",'
          b'"finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}')


def json_answer(c, body):
    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


def sse_head(events):
    """A streamed answer's head and its first chunk, holding events."""
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: keep-alive\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(events), events))


class ClosingEngine:
    """Answers the first request on each connection with keep-alive and keeps the connection open; a second
    request on the same connection is read and then the connection is closed without a byte of answer. That
    is what the router sees when an engine's keep-alive timeout fires just as a pooled connection is reused
    (the close cannot be noticed while the connection sits idle, so only the retry-once path can save it)."""

    keep = False  # KeepingEngine: answer every request of a connection

    def __init__(self):
        self.requests = 0  # requests answered
        self.dropped = 0   # requests read on a reused connection and dropped
        self.raw = t.RawServer(lambda c, n: self.serve(c))
        self.port = self.raw.port

    timeout = 5

    def serve(self, c):
        """Reads the connection's requests one by one and hands each to answer(c, body, served), until the
        peer closes or answer returns False (the connection is then closed)."""
        try:
            c.settimeout(self.timeout)
            got, served = b"", 0
            while True:
                req = t.recv_request(c, got)
                if req is None:
                    return
                got = req[2]
                if not self.answer(c, req[1], served):
                    return
                served += 1
        except (OSError, RuntimeError):  # RuntimeError: a broken barrier (PairedEngine)
            pass
        finally:
            c.close()

    def answer(self, c, body, served):
        if served and not self.keep:
            self.dropped += 1
            return False  # closed under the router's feet
        self.requests += 1
        json_answer(c, ANSWER)
        return True

    def stop(self):
        self.raw.stop()


class StaleConnection(t.TestCase):
    def test_stale_pooled_connection_retried_once(self):
        e = ClosingEngine()
        self.addCleanup(e.stop)
        p = self.start(t.sim("--role", "prefill"))
        r = self.start(t.router([p.port], ["127.0.0.1:%d" % e.port], "--handoff", "none", "--max-retries", "0",
                                "--health-interval-ms", "0", "--threads", "1"))
        for i in range(4):
            st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 1})
            self.assertEqual(st, 200, out)
        self.assertEqual(e.requests, 4)
        self.assertEqual(e.dropped, 3)  # requests 2-4 each found the pooled connection stale first
        self.assertEqual(t.metric(r.port, 'xpyd_retries_total{role="decode"}'), 0)  # not the retry path
        self.idle(r)


class KeepingEngine(ClosingEngine):
    """Answers every request of a connection with keep-alive; raw.n counts the connections it accepted."""
    keep = True


class PooledConnectionOutlivesRequestTimeouts(t.TestCase):
    def test_idle_pooled_connection_is_reused_after_the_stream_idle_timeout(self):
        """The per-request read timeouts (first byte, stream idle) end with the request: a connection parked
        in the pool longer than them is still there and reused, not closed by a leftover timer."""
        e = KeepingEngine()
        self.addCleanup(e.stop)
        p = self.start(t.sim("--role", "prefill"))
        r = self.start(t.router([p.port], ["127.0.0.1:%d" % e.port], "--handoff", "none", "--threads", "1",
                                "--health-interval-ms", "0", "--stream-idle-timeout-ms", "150",
                                "--first-token-timeout-ms", "150"))
        for i in range(3):
            st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 1})
            self.assertEqual(st, 200, out)
            time.sleep(0.5)  # parked for more than both timeouts
        self.assertEqual(e.requests, 3)
        self.assertEqual(e.raw.n, 1, "the pooled connection was closed while idle")
        self.idle(r)


KV = (b'"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1],'
      b'"remote_engine_id":"e","remote_host":"127.0.0.1","remote_port":1}')


class PairedEngine(KeepingEngine):
    """A KeepingEngine that holds each request until `together` requests are in at once (a barrier), so the
    router has that many connections to it in use at the same time; as a prefill it adds kv_transfer_params."""

    def __init__(self, together, prefill=False):
        import threading
        self.barrier = threading.Barrier(together, timeout=10)
        self.prefill = prefill
        super().__init__()

    timeout = 15

    def answer(self, c, body, served):
        self.barrier.wait()
        self.requests += 1
        json_answer(c, ANSWER[:-1] + b"," + KV + b"}" if self.prefill else ANSWER)
        return True


class IdleCapPerEngine(t.TestCase):
    """--upstream-idle-max counts idle connections per engine: P->D requests hold a connection to a prefill
    and one to a decode, and at N streams per thread with a cap of N neither pool closes and reopens one (a
    cap shared by the engines closed the decode's every round). Beyond the cap, a finished connection is
    closed: the engine sees a new one for every request over it."""

    ROUNDS = 5

    def rounds(self, cap):
        import threading
        p, d = PairedEngine(2, prefill=True), PairedEngine(2)
        self.addCleanup(p.stop)
        self.addCleanup(d.stop)
        r = self.start(t.router(["127.0.0.1:%d" % p.port], ["127.0.0.1:%d" % d.port], "--threads", "1",
                                "--health-interval-ms", "0", "--upstream-idle-max", str(cap)))
        for _ in range(self.ROUNDS):
            got = []
            ths = [threading.Thread(target=lambda: got.append(
                t.post_json(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 1})[0])) for _ in range(2)]
            for th in ths:
                th.start()
            for th in ths:
                th.join(30)
            self.assertEqual(got, [200, 200])
        self.assertEqual((p.requests, d.requests), (2 * self.ROUNDS, 2 * self.ROUNDS))
        self.idle(r)
        return p.raw.n, d.raw.n

    def test_two_streams_keep_two_connections_to_each_engine(self):
        self.assertEqual(self.rounds(2), (2, 2))

    def test_beyond_the_cap_a_connection_is_closed(self):
        # each round: one connection reused, the second request's opened anew (and closed after)
        self.assertEqual(self.rounds(1), (1 + self.ROUNDS, 1 + self.ROUNDS))


def token_event(text):
    return (b'data: {"id":"c","object":"text_completion","created":1,"model":"m","choices":'
            b'[{"index":0,"text":"%s","logprobs":null,"finish_reason":null}]}\n\n' % text)


class BurstEngine(KeepingEngine):
    """Answers every request of a connection with its whole answer in one write, far larger than one read of
    the router's: a non-streamed answer of 100 KB of text, or a stream of 400 events (≈ 80 KB) with usage and
    [DONE]. On a reused connection the router's read event is edge-triggered: the kernel says once that the
    socket has bytes, so the router must read on until a read comes back short."""

    EVENTS, TEXT = 400, b"0123456789" * 10000

    timeout = 15

    def answer(self, c, body, served):
        self.requests += 1
        if b'"stream": true' in body or b'"stream":true' in body:
            ev = b"".join(token_event(b"t%05d " % i + b"x" * 100) for i in range(self.EVENTS))
            ev += (b'data: {"id":"c","object":"text_completion","created":1,"model":"m","choices":[],'
                   b'"usage":{"prompt_tokens":1,"completion_tokens":%d,"total_tokens":%d}}\n\n'
                   b"data: [DONE]\n\n" % (self.EVENTS, self.EVENTS + 1))
            c.sendall(sse_head(ev) + b"0\r\n\r\n")
        else:
            json_answer(c, b'{"id":"c","object":"text_completion","model":"m","choices":[{"index":0,"text":"%s",'
                           b'"finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1,'
                           b'"total_tokens":2}}' % self.TEXT)
        return True


class BurstOnReusedConnection(t.TestCase):
    def test_answers_larger_than_a_read_arrive_whole_on_a_reused_connection(self):
        e = BurstEngine()
        self.addCleanup(e.stop)
        p = self.start(t.sim("--role", "prefill"))
        r = self.start(t.router([p.port], ["127.0.0.1:%d" % e.port], "--handoff", "none", "--threads", "1",
                                "--health-interval-ms", "0", "--stream-idle-timeout-ms", "2000",
                                "--first-token-timeout-ms", "2000"))
        for i in range(6):
            if i % 2:
                s = t.Stream(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 1000, "stream": True})
                self.assertEqual(s.status, 200)
                got = s.read_all()
                texts = [c["choices"][0]["text"] for c in t.content_events(got)]
                self.assertEqual(len(texts), BurstEngine.EVENTS, "request %d: a stream stopped short" % i)
                self.assertEqual(texts[-1], "t%05d " % (BurstEngine.EVENTS - 1) + "x" * 100)
                self.assertEqual(got[-1], "[DONE]")
            else:
                st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 1})
                self.assertEqual(st, 200, str(out)[:200])
                self.assertEqual(out["choices"][0]["text"], BurstEngine.TEXT.decode(), "request %d" % i)
        self.assertEqual(e.requests, 6)
        self.assertEqual(e.raw.n, 1, "the connection was not reused")
        self.idle(r)


class CutEngine(KeepingEngine):
    """Streams the first request of a connection whole; on the second (the router's reused connection) sends
    the head and two events, then closes, corked: the bytes and the FIN go out in one segment, so the router
    is told of both at once, once (its read event on a reused connection is edge-triggered)."""

    timeout = 15

    def answer(self, c, body, served):
        import socket
        self.requests += 1
        head = sse_head(token_event(b"w0") + token_event(b"w1"))
        if self.requests == 1:
            done = b"data: [DONE]\n\n"
            c.sendall(head + b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
            return True
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
        c.sendall(head)
        return False  # closed: the FIN joins the corked bytes


class CutOnReusedConnection(t.TestCase):
    def test_bytes_and_the_end_together_end_the_stream(self):
        e = CutEngine()
        self.addCleanup(e.stop)
        p = self.start(t.sim("--role", "prefill"))
        r = self.start(t.router([p.port], ["127.0.0.1:%d" % e.port], "--handoff", "none", "--threads", "1",
                                "--health-interval-ms", "0", "--max-retries", "0", "--log-level", "error"))
        body = {"prompt": "a", "max_tokens": 10, "stream": True}
        got = t.Stream(r.port, "/v1/completions", body).read_all()
        self.assertEqual([c["choices"][0]["text"] for c in t.content_events(got)], ["w0", "w1"])
        self.assertEqual(got[-1], "[DONE]")
        s = t.Stream(r.port, "/v1/completions", body, timeout=10)
        self.assertEqual(s.status, 200)
        got = s.read_all()  # the router's stream idle timeout is 120 s: a missed end shows as this read's timeout
        self.assertEqual([c["choices"][0]["text"] for c in t.content_events(got)], ["w0", "w1"])
        self.assertEqual(got[-1], "[DONE]")
        self.assertIn("error", json.loads(got[-2]))
        self.assertEqual(e.raw.n, 1, "the second request did not reuse the connection")
        self.assertEqual(t.metric(r.port, 'xpyd_request_errors_total{reason="decode_broken_stream"}'), 1)
        self.idle(r)


class SlowReader(KeepingEngine):
    """Waits before reading each request after the first of its connection, so that a large one fills the
    socket and the router's first send is partial: the rest must follow on the write event."""

    def serve(self, c):
        c.settimeout(self.timeout)
        buf, served = bytearray(), 0
        try:
            while True:
                if served:
                    time.sleep(0.3)
                while b"\r\n\r\n" not in buf:
                    d = c.recv(1 << 20)
                    if not d:
                        return
                    buf += d
                i = buf.index(b"\r\n\r\n")
                n = 0
                for line in bytes(buf[:i]).split(b"\r\n")[1:]:
                    k, _, v = line.partition(b":")
                    if k.strip().lower() == b"content-length":
                        n = int(v)
                body = buf[i + 4:]
                while len(body) < n:
                    d = c.recv(1 << 20)
                    if not d:
                        return
                    body += d
                buf = body[n:]
                self.sizes.append(n)
                json_answer(c, ANSWER)
                served += 1
        except OSError:
            pass
        finally:
            c.close()


class LargeRequestOnReusedConnection(t.TestCase):
    def test_a_request_larger_than_the_socket_buffer_goes_out_whole(self):
        """A 16 MiB prompt sent on a pooled connection: the first send() takes what the socket has room for,
        and the rest goes out on the write event (once, with an edge-triggered read event on the same socket,
        the rest was never written and the request hung until the engine gave up)."""
        e = SlowReader()
        e.sizes = []
        e.timeout = 20
        self.addCleanup(e.stop)
        r = self.start(t.router([], ["127.0.0.1:%d" % e.port], "--handoff", "none", "--threads", "1",
                                "--health-interval-ms", "0", "--max-retries", "0", "--max-body-bytes", str(17 << 20)))
        st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 1})
        self.assertEqual(st, 200, out)
        big = json.dumps({"prompt": "x" * (16 << 20), "max_tokens": 1})
        for _ in range(3):  # each on the connection the previous one left idle
            st, _, out = t.request(r.port, "POST", "/v1/completions", big, timeout=20)
            self.assertEqual(st, 200, out)
        self.assertEqual(e.raw.n, 1, "the requests did not reuse the connection")
        self.assertEqual(e.sizes[1:], [len(big) + len(b'')] * 3)
        self.idle(r)


if __name__ == "__main__":
    t.main()
