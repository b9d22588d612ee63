# SPDX-License-Identifier: Apache-2.0
"""TLS, with certificates this test generates (openssl CLI, a throwaway CA):
 - HTTPS for clients: streaming through curl and through Python's ssl; ALPN http/1.1; session resumption
   (records, read-ahead and a slow TLS client: test_tls_stream.py); --tls-min-version 1.3 refuses a TLS 1.2 client; plain HTTP sent to the TLS port gets a clear 400 and a
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
import threading
import time

import xpyd_testlib as t
from tlslib import BODY, Certs, TlsCase, https_get, https_post, tls_ctx


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

    def test_the_system_store_is_read_at_the_first_connection(self):
        """Without --upstream-ca the engines are verified against the system store, read when the router first
        connects over TLS (not at start: a router without https engines never reads it). OpenSSL's SSL_CERT_FILE
        names the store's file: the test CA put there after the router started is trusted; with the machine's
        store, the engine is refused."""
        e = self.start(tls_sim("--role", "both", "--tls-cert", self.cert, "--tls-key", self.key))
        engine = ["https://127.0.0.1:%d" % e.port]
        args = ("--handoff", "none", "--max-retries", "0", "--health-interval-ms", "0")
        store = os.path.join(t.tmpdir(), "store.pem")
        r = self.start(t.router([], engine, *args, env={"SSL_CERT_FILE": store}))
        shutil.copy(self.certs.ca, store)
        st, _, out = t.post_json(r.port, "/v1/completions", BODY)
        self.assertEqual(st, 200, out)
        self.idle(r)
        stranger = self.start(t.router([], engine, *args))  # the machine's store: the test CA is not in it
        st, _, out = t.post_json(stranger.port, "/v1/completions", BODY)
        self.assertOpenAIError(st, out, 502, "TLS handshake failed")
        self.idle(stranger)
        stranger.stop()
        self.assertIn("certificate verify failed", stranger.output())

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
