# SPDX-License-Identifier: Apache-2.0
"""Retries wait with jittered exponential backoff: attempt k waits min(--retry-backoff-ms x 2^(k-1), 1 s) x a
random factor in [0.5, 1.5]; the waits differ from request to request (jitter)."""
import json
import time

import xpyd_testlib as t

ERR = json.dumps({"error": {"message": "boom", "type": "InternalServerError", "code": 500}}).encode()


class Backoff(t.TestCase):
    def test_exponential_with_jitter(self):
        arrivals = []

        def failing(method, path, body):
            if path == "/health":
                return 200, "application/json", b"{}"
            arrivals.append(time.monotonic())
            return 500, "application/json", ERR
        engines = [t.FakeEngine(failing) for _ in range(4)]
        for e in engines:
            self.addCleanup(e.stop)
        p = self.start(t.sim("--role", "prefill"))
        r = self.start(t.router([p.port], ["127.0.0.1:%d" % e.port for e in engines], "--handoff", "none",
                                "--decode-policy", "rr", "--max-retries", "3", "--retry-backoff-ms", "200",
                                "--eject-after-failures", "0", "--health-interval-ms", "0"))
        firsts = []
        for _ in range(4):
            del arrivals[:]
            st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 1})
            self.assertEqual(st, 500, out)  # every attempt failed: the last engine's answer is passed through
            self.assertEqual(len(arrivals), 4)
            gaps = [(b - a) * 1000 for a, b in zip(arrivals, arrivals[1:])]
            for k, g in enumerate(gaps):  # min(200 x 2^k, 1000) x [0.5, 1.5]; +400 ms scheduling slack (CI load)
                base = min(200 * 2 ** k, 1000)
                self.assertGreaterEqual(g, base * 0.5 - 5, gaps)
                self.assertLessEqual(g, base * 1.5 + 400, gaps)
            firsts.append(gaps[0])
        self.assertGreater(max(firsts) - min(firsts), 5, "no jitter: %s" % firsts)
        self.idle(r)


if __name__ == "__main__":
    t.main()
