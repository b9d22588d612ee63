# SPDX-License-Identifier: Apache-2.0
"""Passive ejection: a rank that keeps failing (5xx, connect errors; never 4xx) is taken out after
--eject-after-failures in a row, so later requests stop paying a failed attempt plus a retry; it is logged,
counted, shown in /status, and comes back when the ejection time is over."""
import xpyd_testlib as t


class PassiveEjection(t.TestCase):
    def test_failing_decode_ejected_then_back(self):
        p = self.start(t.sim("--role", "prefill"))
        good = self.start(t.sim("--role", "decode"))
        bad = self.start(t.sim("--role", "decode", "--status-code", "503"))  # /health stays 200
        r = self.start(t.router([p.port], [bad.port, good.port], "--decode-policy", "rr",
                                "--eject-after-failures", "3", "--eject-base-ms", "60000"))
        for _ in range(12):
            st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 2})
            self.assertEqual(st, 200, out)  # the retry on the good rank saves every request
        self.assertEqual(t.metric(bad.port, 'xpyd_sim:faults_injected_total{kind="status_code"}'), 3)  # then out
        self.assertEqual(t.metric(r.port, 'xpyd_retries_total{role="decode"}'), 3)
        inst = t.status(r.port)["pools"]["decode"]["instances"]
        self.assertEqual([i["ejected"] for i in inst], [True, False])
        self.assertEqual([i["healthy"] for i in inst], [True, True])  # active checks still pass
        m = t.metrics(r.port)
        self.assertEqual(m['xpyd_instance_ejections_total{role="decode",engine="127.0.0.1:%d",dp_rank="0"}'
                           % bad.port], 1)
        self.assertEqual(m['xpyd_instance_healthy{role="decode",engine="127.0.0.1:%d",dp_rank="0"}' % bad.port], 0)
        self.assertIn("event=ejected", r.output())

    def test_comes_back_and_4xx_never_counts(self):
        p = self.start(t.sim("--role", "prefill"))
        d1 = self.start(t.sim("--role", "decode", "--max-model-len", "64"))
        d2 = self.start(t.sim("--role", "decode", "--max-model-len", "64"))
        r = self.start(t.router([p.port], [d1.port, d2.port], "--eject-after-failures", "2",
                                "--eject-base-ms", "100"))
        for _ in range(6):  # the engines reject these (400): the request's fault, not the rank's
            st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 2, "min_tokens": 5})
            self.assertEqual(st, 400, out)
        self.assertEqual([i["ejected"] for i in t.status(r.port)["pools"]["decode"]["instances"]], [False, False])
        d1.stop()
        for _ in range(4):
            st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 2})
            self.assertEqual(st, 200, out)
        t.wait_until(lambda: t.status(r.port)["pools"]["decode"]["instances"][0]["ejected"], what="ejected")
        # the ejection lapses after 100 ms: the rank is eligible again (and fails again: ejected twice)
        t.wait_until(lambda: not t.status(r.port)["pools"]["decode"]["instances"][0]["ejected"], what="lapsed")


if __name__ == "__main__":
    t.main()
