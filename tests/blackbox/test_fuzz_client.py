# SPDX-License-Identifier: Apache-2.0
"""Client-side fuzzer: mutated raw bytes from a client, over real loopback connections, into the real router
(connection guard, request reader, routing, auth, body rewrite, relay) in front of real sims. Run by ctest in
both passes, so in CI also against the ASan+UBSan build with leak checks at exit.

Seeded with the client-side hardening cases and valid requests of every kind; each input is sent on a fresh
connection or pipelined after a valid request on a keep-alive one, in random fragments. Checks: every byte the
router sends back is a well-formed HTTP/1.x answer; the router stays up; at the end every connection, load
counter and KV lease is back to zero and the router exits 0 (no sanitizer report, no leak). The time budget is
XPYD_FUZZ_CLIENT_SECONDS (default 20); XPYD_FUZZ_SEED replays a run. A failing input is printed as base64 and
kept in the build folder."""
import base64
import os
import random
import re
import socket
import time

import xpyd_testlib as t

BODY = b'{"prompt":"a b","max_tokens":2}'
SEEDS = [
    b"GET /health\r\n\r\n", b"GET /\r\n\r\n", b"HEAD /health\r\n\r\n", b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n",
    b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n", b"GET /status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n\r\n",
    b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\nContent-Length: 31\r\n\r\n" + BODY,
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\nContent-Length: 46\r\n\r\n"
    b'{"prompt":"a","max_tokens":3,"stream":true}  ',
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\nContent-Length: 60\r\n\r\n"
    b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}',
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"1f;e=1\r\n" + BODY + b"\r\n0\r\nX-T: 1\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nAuthorization: Bearer k\r\n"
    b"Content-Length: 31\r\n\r\n" + BODY,
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\nContent-Length: 38\r\n\r\n"
    b'{"prompt":"a","max_tokens":2,"x":1e400}',
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\nContent-Length: 24\r\n\r\n"
    b'{"prompt":[1,2,3]}{"a":1',
    b"PUT /metadata?key=a%2Fb HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer m\r\nContent-Length: 2\r\n\r\n{}",
    b"POST /admin/instances HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer a\r\nContent-Length: 2\r\n\r\n{}",
    b"GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
]
TOKENS = [b"\r\n", b"\n", b"\r", b"\x00", b" ", b"\t", b":", b",", b";", b"chunked", b"Content-Length: ",
          b"Transfer-Encoding: ", b"Host: x\r\n", b"0\r\n\r\n", b"ffffffff", b"-1", b"99999999999999999999",
          b"HTTP/1.1", b"HTTP/1.0", b'"', b"\\u0000", b"{", b"}", b"[", b"]", b"1e999", b"\xff", b"\xc3\xa9",
          b"Connection: close\r\n", b"Expect: 100-continue\r\n", b"\r\n\r\n"]
STATUS = re.compile(rb"^HTTP/1\.[01] [1-5][0-9][0-9] [^\r\n]*\r\n")


def mutate(rng, data):
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        pos = rng.randint(0, len(data))
        if op == 0 and data:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif op == 1:
            data[pos:pos] = rng.choice(TOKENS)
        elif op == 2 and data:
            del data[pos:pos + rng.randint(1, 8)]
        elif op == 3 and data:
            a = rng.randrange(len(data))
            data[pos:pos] = data[a:a + rng.randint(1, 32)]
        elif op == 4:
            data[pos:] = rng.choice(SEEDS)[rng.randint(0, 20):]
        elif op == 5:
            data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
        else:
            m = re.search(rb"[0-9]+", bytes(data[pos:]))
            if m:
                a = pos + m.start()
                data[a:a + len(m.group())] = str(rng.choice([0, 1, 2, 7, 31, 65536, 2**31, 2**63, 10**20])).encode()
    return bytes(data)


def read_answers(sock, deadline):
    """Reads what the router sends until it closes or goes quiet; returns the bytes."""
    got = b""
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, min(0.15, deadline - time.monotonic())))
        try:
            c = sock.recv(65536)
        except socket.timeout:
            break
        except OSError:
            break
        if not c:
            break
        got += c
    return got


class ClientFuzz(t.TestCase):
    def test_fuzz(self):
        seconds = float(os.environ.get("XPYD_FUZZ_CLIENT_SECONDS", "20"))
        seed = int(os.environ.get("XPYD_FUZZ_SEED", str(int(time.time()))))
        rng = random.Random(seed)
        p = self.start(t.sim("--role", "prefill"))  # 30 s leases: only a release frees them in time
        d = self.start(t.sim("--role", "decode"))
        r = self.start(t.router([p.port], [d.port], "--api-key", "k", "--admin-key", "a", "--metadata-write-key", "m",
                                "--header-timeout-ms", "500", "--body-idle-timeout-ms", "500", "--linger-ms", "100",
                                "--max-headers", "30", "--max-header-bytes", "8192", "--max-body-bytes", "65536",
                                "--keepalive-timeout-ms", "1000", "--max-connections", "4096"))
        auth = {"Authorization": "Bearer k"}
        end = time.monotonic() + seconds
        n = answered = 0
        while time.monotonic() < end:
            data = mutate(rng, rng.choice(SEEDS))
            prefix = rng.choice(SEEDS) if rng.random() < 0.3 else b""
            try:
                s = socket.create_connection(("127.0.0.1", r.port), timeout=2)
            except OSError as e:
                self.fail("router refused a connection (seed %d): %s" % (seed, e))
            try:
                msg = prefix + data
                i = 0
                while i < len(msg):
                    k = rng.choice([1, 3, 17, 256, len(msg)])
                    s.sendall(msg[i:i + k])
                    i += k
                out = read_answers(s, time.monotonic() + 0.4)
            except OSError:
                out = b""
            finally:
                s.close()
            n += 1
            if out:
                answered += 1
                if not STATUS.match(out):
                    self.record_failure(seed, msg, "not an HTTP/1.x answer: %r" % out[:200])
            if not r.alive():
                self.record_failure(seed, msg, "router died:\n" + r.output()[-3000:])
            if n % 200 == 0:
                self.assertEqual(t.request(r.port, "GET", "/health")[0], 200)
        print("client fuzz: seed %d, %d inputs, %d answered" % (seed, n, answered))
        self.assertGreater(n, 50)
        t.wait_until(lambda: t.router_idle(r.port, auth), timeout=30, what="router load back to zero")
        t.wait_until(lambda: t.metric(r.port, "xpyd_client_connections") <= 1, timeout=30,
                     what="client connections closed")
        t.wait_until(lambda: t.metric(p.port, "xpyd_sim:kv_leases_active") == 0, timeout=10, what="KV leases released")

    def test_fuzz_tls_listener(self):
        """The HTTPS listener: mutated handshakes (real ClientHellos, cut, flipped, followed by junk) and mutated
        requests inside real TLS connections. The router stays up, every TLS answer is HTTP/1.x, and at the end
        every connection and load is back to zero (the plain listener tells)."""
        import ssl
        from test_tls import Certs
        seconds = float(os.environ.get("XPYD_FUZZ_CLIENT_TLS_SECONDS", "10"))
        seed = int(os.environ.get("XPYD_FUZZ_SEED", str(int(time.time()))))
        rng = random.Random(seed)
        certs = Certs()
        self.addCleanup(certs.cleanup)
        cert, key = certs.issue("server")
        hellos = []
        for alpn in (None, ["h2", "http/1.1"]):
            c = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            c.check_hostname, c.verify_mode = False, ssl.CERT_NONE
            if alpn:
                c.set_alpn_protocols(alpn)
            inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
            try:
                c.wrap_bio(inc, out, server_hostname="localhost").do_handshake()
            except ssl.SSLWantReadError:
                pass
            hellos.append(out.read())
        d = self.start(t.sim("--role", "both", "--decode-us-per-token", "100"))
        r = self.start(t.Proc("xpyd_router", ["--port", "0", "--log-level", "error", "--handoff", "none", "-d",
                                              "127.0.0.1:%d" % d.port, "--tls-cert", cert, "--tls-key", key,
                                              "--plain-port", "0", "--api-key", "k", "--header-timeout-ms", "500",
                                              "--body-idle-timeout-ms", "500", "--linger-ms", "100",
                                              "--keepalive-timeout-ms", "1000"], ready_path=None))
        with open(r.port_file) as f:
            plain = int(f.read().split()[1])
        ctx = ssl.create_default_context(cafile=certs.ca)
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            n += 1
            if rng.random() < 0.5:  # a mutated handshake on raw TCP
                msg = mutate(rng, rng.choice(hellos)) + (rng.choice(SEEDS) if rng.random() < 0.3 else b"")
                try:
                    s = socket.create_connection(("127.0.0.1", r.port), timeout=2)
                    s.sendall(msg)
                    read_answers(s, time.monotonic() + 0.2)
                    s.close()
                except OSError:
                    pass
            else:  # a mutated request inside a real TLS connection
                msg = mutate(rng, rng.choice(SEEDS))
                try:
                    s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", r.port), timeout=2),
                                        server_hostname="localhost")
                    s.sendall(msg)
                    out = read_answers(s, time.monotonic() + 0.4)
                    s.close()
                except (OSError, ssl.SSLError):
                    out = b""
                if out and not STATUS.match(out):
                    self.record_failure(seed, msg, "not an HTTP/1.x answer over TLS: %r" % out[:200])
            if not r.alive():
                self.record_failure(seed, msg, "router died:\n" + r.output()[-3000:])
        print("TLS fuzz: seed %d, %d inputs" % (seed, n))
        self.assertGreater(n, 20)
        self.assertGreater(t.metric(plain, 'xpyd_tls_handshake_failures_total{side="client"}'), 0)
        t.wait_until(lambda: t.router_idle(plain, {"Authorization": "Bearer k"}), timeout=30, what="load back to zero")
        t.wait_until(lambda: t.metric(plain, "xpyd_client_connections") <= 1, timeout=30, what="connections closed")

    def record_failure(self, seed, data, why):
        path = os.path.join(t.BIN, "..", "fuzz_client_failure_%d.bin" % seed)
        try:
            with open(path, "wb") as f:
                f.write(data)
        except OSError:
            path = "(not written)"
        self.fail("%s\nseed %d; input kept in %s; base64: %s" % (why, seed, path, base64.b64encode(data).decode()))


if __name__ == "__main__":
    t.main()
