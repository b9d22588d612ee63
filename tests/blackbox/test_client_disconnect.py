# SPDX-License-Identifier: Apache-2.0
"""Client disconnects at every stage: both upstream legs closed, load released, no KV lease stranded."""
import json
import socket

import xpyd_testlib as t


def raw_post(port, path, body):
    c = socket.create_connection(("127.0.0.1", port))
    data = json.dumps(body)
    c.sendall(("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
               % (path, len(data), data)).encode())
    return c


class ClientDisconnect(t.TestCase):
    def test_mid_stream(self):
        p = self.start(t.sim("--role", "prefill"))
        d = self.start(t.sim("--role", "decode", "--decode-us-per-token", "5000"))
        r = self.start(t.router([p.port], [d.port]))
        st = t.Stream(r.port, "/v1/completions", {"prompt": "a b", "max_tokens": 200, "stream": True})
        ev = st.events()
        next(ev)
        next(ev)
        st.close()
        t.wait_until(lambda: t.metric(d.port, "xpyd_sim:requests_aborted_total") == 1, what="decode aborted")
        t.wait_until(lambda: t.router_idle(r.port), what="router idle")
        self.assertEqual(t.metric(r.port, "xpyd_client_disconnects_total"), 1)
        self.assertEqual(t.metric(r.port, "xpyd_active_streams"), 0)
        self.assertEqual(t.metric(p.port, "xpyd_sim:kv_leases_active"), 0)

    def test_pipelined_bytes_held_then_hang_up(self):
        # The connection is read while its answer is in progress (pipelined requests wait in the router); past
        # --max-header-bytes + 64 KiB of them the router stops reading, and the client hanging up must still
        # be seen while nothing is written to it (the prefill stalls 10 s), not when the answer is
        p = self.start(t.sim("--role", "prefill", "--stall-ms", "10000"))
        d = self.start(t.sim("--role", "decode"))
        r = self.start(t.router([p.port], [d.port], "--max-header-bytes", "1024"))
        c = raw_post(r.port, "/v1/completions", {"prompt": "a b", "max_tokens": 5, "stream": True})
        c.settimeout(10)
        t.wait_until(lambda: t.metric(p.port, "xpyd_sim:requests_total") == 1, what="prefill got it")
        c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" * 4096)  # 140 KB of pipelined requests
        c.close()
        t.wait_until(lambda: t.metric(p.port, "xpyd_sim:requests_aborted_total") == 1, timeout=5,
                     what="prefill aborted before its answer")
        t.wait_until(lambda: t.router_idle(r.port), what="router idle")
        self.assertEqual(t.metric(r.port, "xpyd_client_disconnects_total"), 1)
        self.assertEqual(t.metric(p.port, "xpyd_sim:kv_leases_active"), 0)
        self.assertEqual(t.metric(d.port, "xpyd_sim:requests_total"), 0)

    def test_during_prefill(self):
        p = self.start(t.sim("--role", "prefill", "--stall-ms", "3000"))
        d = self.start(t.sim("--role", "decode"))
        r = self.start(t.router([p.port], [d.port]))
        c = raw_post(r.port, "/v1/completions", {"prompt": "a b", "max_tokens": 5, "stream": True})
        t.wait_until(lambda: t.metric(p.port, "xpyd_sim:requests_total") == 1, what="prefill got it")
        c.close()
        t.wait_until(lambda: t.metric(p.port, "xpyd_sim:requests_aborted_total") == 1, what="prefill aborted")
        t.wait_until(lambda: t.router_idle(r.port), what="router idle")
        self.assertEqual(t.metric(p.port, "xpyd_sim:kv_leases_active"), 0)
        self.assertEqual(t.metric(d.port, "xpyd_sim:requests_total"), 0)

    def test_after_prefill_before_decode_pulls(self):
        # decode batch of 1 kept busy: the next decode waits in the queue, holding prefill KV it never pulled
        p = self.start(t.sim("--role", "prefill"))
        d = self.start(t.sim("--role", "decode", "--max-batch", "1", "--decode-us-per-token", "5000"))
        r = self.start(t.router([p.port], [d.port]))
        busy = t.Stream(r.port, "/v1/completions", {"prompt": "x", "max_tokens": 100, "stream": True})
        next(busy.events())
        c = raw_post(r.port, "/v1/completions", {"prompt": "a b", "max_tokens": 5, "stream": True})
        t.wait_until(lambda: t.metric(d.port, "vllm:num_requests_waiting") == 1, what="decode queued")
        self.assertEqual(t.metric(p.port, "xpyd_sim:kv_leases_active"), 1)
        c.close()
        # the decode is told (its connection closes), aborts, and tells the prefill to free the KV
        t.wait_until(lambda: t.metric(p.port, "xpyd_sim:kv_leases_cancelled_total") == 1, what="KV released")
        self.assertEqual(t.metric(p.port, "xpyd_sim:kv_leases_active"), 0)
        busy.close()
        t.wait_until(lambda: t.router_idle(r.port), what="router idle")
        self.assertEqual(t.metric(p.port, "xpyd_sim:kv_leases_expired_total"), 0)


if __name__ == "__main__":
    t.main()
