# SPDX-License-Identifier: Apache-2.0
"""Backpressure: a client that stops reading pauses the decode leg instead of making the router buffer the
whole stream; when it reads again, every byte arrives, in order."""
import json
import os
import socket

import xpyd_testlib as t




class SlowClient(t.TestCase):
    def test_router_memory_bounded_then_complete(self):
        n = 200000  # ~45 MB of SSE at zero delay: far more than loopback socket buffers (~16 MB) can hold
        p = self.start(t.sim("--role", "prefill"))
        d = self.start(t.sim("--role", "decode", "--decode-us-per-token", "0", "--max-model-len", "1000000"))
        r = self.start(t.router([p.port], [d.port], "--client-buffer-bytes", "65536"))
        before = t.rss_kib(r.p.pid)
        c = socket.create_connection(("127.0.0.1", r.port))
        body = json.dumps({"prompt": "a", "max_tokens": n, "stream": True, "ignore_eos": True})
        c.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   "Content-Length: %d\r\n\r\n%s" % (len(body), body)).encode())
        # the engine holds its stream back once its reader (the router) stops taking it (xpyd_sim: as a real
        # server's send waits on its socket): had the router kept reading, the whole answer (about 45 MB) would
        # have been generated and would sit in the router
        t.wait_until(lambda: t.metric(d.port, "xpyd_sim:stream_backpressure_waits_total") > 200, timeout=30,
                     what="the decode held back by its reader")
        self.assertLess(t.metric(d.port, "vllm:generation_tokens_total"), n // 2, "the router kept reading")
        if "ASAN_OPTIONS" not in os.environ:  # sanitizer quarantine makes RSS meaningless
            grown = t.rss_kib(r.p.pid) - before
            self.assertLess(grown, 4 * 1024, "router RSS grew by %d KiB while the client did not read" % grown)
        # now read everything: complete and in order
        c.settimeout(20)
        data = bytearray()
        while not data.endswith(b"0\r\n\r\n"):
            chunk = c.recv(1 << 20)
            if not chunk:
                break
            data += chunk
        c.close()
        data = bytes(data)
        self.assertEqual(data.count(b'"text":" '), n)
        self.assertIn(b"data: [DONE]", data)
        t.wait_until(lambda: t.router_idle(r.port), what="idle")


class Forwarding(t.TestCase):
    def test_headers_reach_both_legs(self):
        seen = []

        def prefill(method, path, body):
            return 200, "application/json", json.dumps(
                {"id": "cmpl-x", "object": "text_completion", "choices": [{"index": 0, "text": " zz"}],
                 "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
                 "kv_transfer_params": None}).encode()

        fake = t.FakeEngine(prefill)
        self.addCleanup(fake.stop)
        fake_d = t.FakeEngine(lambda m, path, b: (200, "application/json", json.dumps(
            {"id": "cmpl-x", "object": "text_completion", "choices": [{"index": 0, "text": " zz yy"}],
             "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4,
                       "prompt_tokens_details": {"cached_tokens": 2}}}).encode()))
        self.addCleanup(fake_d.stop)
        r = self.start(t.router([fake.port], [fake_d.port], "--health-interval-ms", "0"))
        st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "a b", "max_tokens": 2, "stream": False,
                                                              "stream_options": None, "min_tokens": 1},
                                 headers={"Authorization": "Bearer sk-1", "X-Request-Id": "rid-9",
                                          "X-Custom": "kept", "Connection": "keep-alive",
                                          "Content-Type": "application/json; charset=utf-8"})
        self.assertEqual(st, 200, out)
        # the prefill reported no cached_tokens: the decode's (wrong) number is dropped, not shown
        self.assertNotIn("prompt_tokens_details", out["usage"])
        for eng in (fake, fake_d):
            self.assertEqual(len(eng.requests), 1)
        ph, dh = fake.headers[0], fake_d.headers[0]
        for h in (ph, dh):
            self.assertEqual(h.get("Authorization"), "Bearer sk-1")
            self.assertEqual(h.get("X-Request-Id"), "rid-9")
            self.assertEqual(h.get("X-Custom"), "kept")
            self.assertEqual(h.get("Content-Type"), "application/json")
        pb = json.loads(fake.requests[0][2])
        self.assertEqual((pb["max_tokens"], pb["stream"]), (1, False))
        self.assertNotIn("min_tokens", pb)
        self.assertTrue(pb["kv_transfer_params"]["do_remote_decode"])
        db = json.loads(fake_d.requests[0][2])
        self.assertEqual((db["max_tokens"], db["min_tokens"]), (2, 1))  # the client's body, restored
        self.assertNotIn("kv_transfer_params", db)  # the prefill returned none: none sent


if __name__ == "__main__":
    t.main()
