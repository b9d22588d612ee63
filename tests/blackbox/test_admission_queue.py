# SPDX-License-Identifier: Apache-2.0
"""Per-instance max in-flight with a bounded admission queue: when every rank is at max_inflight a request
waits (FIFO) for a free slot; a full queue gets 429 + Retry-After at once; a wait longer than
--queue-timeout-ms gets 503; a client that leaves while waiting leaves nothing behind. No rank ever runs
more than its max_inflight."""
import json
import socket
import threading
import time

import xpyd_testlib as t

SLOW = {"prompt": "a b", "max_tokens": 8}


class AdmissionQueue(t.TestCase):
    def cluster(self, *router_args, us_per_token="60000"):
        p = self.start(t.sim("--role", "prefill"))
        d = self.start(t.sim("--role", "decode", "--decode-us-per-token", us_per_token))
        r = self.start(t.router([p.port], [d.port], "--decode-max-inflight", "1", *router_args))
        return p, d, r

    def decode_inflight(self, r):
        return t.status(r.port)["pools"]["decode"]["inflight"]

    def test_queue_then_429_when_full(self):
        _, _, r = self.cluster("--admission-queue", "2", "--queue-timeout-ms", "20000")
        results, peak = [None] * 4, [0]

        def run(i):
            results[i] = t.post_json(r.port, "/v1/completions", SLOW, timeout=30)

        threads = []
        for i in range(3):
            threads.append(threading.Thread(target=run, args=(i,)))
            threads[-1].start()
            if i == 0:
                t.wait_until(lambda: self.decode_inflight(r) == 1, what="first request running")
        t.wait_until(lambda: t.metric(r.port, 'xpyd_admission_queue_depth{role="decode"}') == 2, what="two queued")
        st, h, out = t.post_json(r.port, "/v1/completions", SLOW)  # the queue is full
        self.assertOpenAIError(st, out, 429, "--admission-queue")
        self.assertEqual(h.get("retry-after"), "1")
        while any(th.is_alive() for th in threads):
            peak[0] = max(peak[0], self.decode_inflight(r))
            time.sleep(0.02)
        for th in threads:
            th.join()
        self.assertEqual([x[0] for x in results[:3]], [200, 200, 200], results)
        self.assertLessEqual(peak[0], 1, "a rank ran more than its max_inflight")
        self.assertEqual(t.metric(r.port, 'xpyd_admission_queue_admitted_total{role="decode"}'), 2)
        self.assertEqual(t.metric(r.port, 'xpyd_request_errors_total{reason="queue_full"}'), 1)
        self.assertEqual(t.metric(r.port, 'xpyd_admission_queue_depth{role="decode"}'), 0)
        t.wait_until(lambda: t.router_idle(r.port), what="router load back to zero")

    def test_prefill_queue_is_fifo(self):
        """The prefill pool has its own admission queue: with one slot, requests wait and are admitted in the
        order they arrived (one router thread: one FIFO)."""
        p = self.start(t.sim("--role", "prefill", "--stall-ms", "250"))
        d = self.start(t.sim("--role", "decode"))
        r = self.start(t.router([p.port], [d.port], "--prefill-max-inflight", "1", "--threads", "1"))
        done, lock = [], threading.Lock()

        def run(i):
            st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "req %d" % i, "max_tokens": 1}, timeout=30)
            with lock:
                done.append((i, st))

        threads = []
        for i in range(4):
            threads.append(threading.Thread(target=run, args=(i,)))
            threads[-1].start()
            # the next one arrives only once this one is running or queued
            t.wait_until(lambda: t.status(r.port)["pools"]["prefill"]["inflight"] +
                         t.metric(r.port, 'xpyd_admission_queue_depth{role="prefill"}') >= i + 1,
                         what="request %d admitted or queued" % i)
        self.assertGreaterEqual(t.metric(r.port, 'xpyd_admission_queue_depth{role="prefill"}'), 2)
        for th in threads:
            th.join()
        self.assertEqual(done, [(0, 200), (1, 200), (2, 200), (3, 200)])  # FIFO
        self.assertEqual(t.metric(r.port, 'xpyd_admission_queue_admitted_total{role="prefill"}'), 3)
        t.wait_until(lambda: t.router_idle(r.port), what="router load back to zero")

    def test_queue_timeout_503(self):
        _, _, r = self.cluster("--queue-timeout-ms", "300", us_per_token="300000")
        first = threading.Thread(target=lambda: t.post_json(r.port, "/v1/completions", SLOW, timeout=30))
        first.start()
        t.wait_until(lambda: self.decode_inflight(r) == 1, what="first request running")
        t0 = time.monotonic()
        st, _, out = t.post_json(r.port, "/v1/completions", SLOW)
        self.assertOpenAIError(st, out, 503, "--queue-timeout-ms")
        self.assertLess(time.monotonic() - t0, 2.0)
        self.assertEqual(t.metric(r.port, 'xpyd_request_errors_total{reason="queue_timeout"}'), 1)
        first.join()
        t.wait_until(lambda: t.router_idle(r.port), what="router load back to zero")

    def test_client_leaves_while_queued(self):
        p, _, r = self.cluster("--queue-timeout-ms", "20000")
        first = threading.Thread(target=lambda: t.post_json(r.port, "/v1/completions", SLOW, timeout=30))
        first.start()
        t.wait_until(lambda: self.decode_inflight(r) == 1, what="first request running")
        body = json.dumps(SLOW).encode()
        s = socket.create_connection(("127.0.0.1", r.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        t.wait_until(lambda: t.metric(r.port, 'xpyd_admission_queue_depth{role="decode"}') == 1, what="queued")
        s.close()
        t.wait_until(lambda: t.metric(r.port, 'xpyd_admission_queue_depth{role="decode"}') == 0, what="dequeued")
        first.join()
        t.wait_until(lambda: t.router_idle(r.port), what="router load back to zero")
        # the prefill it had finished holds no KV for it
        t.wait_until(lambda: t.metric(p.port, "xpyd_sim:kv_leases_active") == 0, timeout=5, what="KV freed")
        st, _, _ = t.post_json(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 1})
        self.assertEqual(st, 200)

    def test_queue_off_keeps_soft_cap(self):
        _, _, r = self.cluster("--admission-queue", "0", us_per_token="20000")
        results = []
        ths = [threading.Thread(target=lambda: results.append(
            t.post_json(r.port, "/v1/completions", SLOW, timeout=30)[0])) for _ in range(3)]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        self.assertEqual(results, [200, 200, 200])
        self.assertEqual(t.metric(r.port, 'xpyd_admission_queue_admitted_total{role="decode"}'), 0)


if __name__ == "__main__":
    t.main()
