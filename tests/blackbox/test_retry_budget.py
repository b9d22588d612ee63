# SPDX-License-Identifier: Apache-2.0
"""The retry budget refuses retries beyond its share (counted), so an outage is not amplified, while the
default budget lets retries save requests."""
import xpyd_testlib as t


class RetryBudget(t.TestCase):
    def test_zero_budget_refuses_retries(self):
        p = self.start(t.sim("--role", "prefill"))
        good = self.start(t.sim("--role", "decode"))
        dead = t.free_port()
        r = self.start(t.router([p.port], [dead, good.port], "--decode-policy", "rr", "--retry-budget-percent",
                                "0", "--retry-budget-min", "0", "--eject-after-failures", "0"))
        codes = [t.post_json(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 1})[0] for _ in range(4)]
        self.assertEqual(sorted(codes), [200, 200, 502, 502])
        self.assertEqual(t.metric(r.port, "xpyd_retries_denied_total"), 2)
        self.assertEqual(t.metric(r.port, 'xpyd_retries_total{role="decode"}'), 0)

    def test_default_budget_saves_requests_with_backoff(self):
        p = self.start(t.sim("--role", "prefill"))
        good = self.start(t.sim("--role", "decode"))
        dead = t.free_port()
        r = self.start(t.router([p.port], [dead, good.port], "--decode-policy", "rr", "--eject-after-failures", "0",
                                "--retry-backoff-ms", "50"))
        for _ in range(4):
            st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 1})
            self.assertEqual(st, 200, out)
        self.assertGreaterEqual(t.metric(r.port, 'xpyd_retries_total{role="decode"}'), 2)
        self.assertEqual(t.metric(r.port, "xpyd_retries_denied_total"), 0)
        t.wait_until(lambda: t.router_idle(r.port), what="idle")
        self.assertEqual(t.metric(r.port, "xpyd_retries_active"), 0)  # every place in the budget given back


if __name__ == "__main__":
    t.main()
