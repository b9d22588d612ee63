# SPDX-License-Identifier: Apache-2.0
"""Retries go to a different instance, only while nothing reached the client; the client sees a normal
answer and the prefill's KV is not stranded."""
import json

import xpyd_testlib as t

CMPL, stream_body = t.CMPL, t.stream_body


class RetryOtherInstance(t.TestCase):
    def test_dead_decode_is_skipped(self):
        p = self.start(t.sim("--role", "prefill"))
        d = self.start(t.sim("--role", "decode"))
        dead = t.free_port()
        r = self.start(t.router([p.port], [dead, d.port], "--decode-policy", "rr"))
        for _ in range(4):
            payloads = t.Stream(r.port, "/v1/completions", stream_body()).read_all()
            self.assertEqual(len(t.content_events(payloads)), 4)
            self.assertEqual(payloads[-1], "[DONE]")
        self.assertGreaterEqual(t.metric(r.port, 'xpyd_retries_total{role="decode"}'), 2)
        self.assertEqual(t.metric(p.port, "xpyd_sim:kv_leases_active"), 0)
        self.idle(r)

    def test_lot_never_retries_the_instance_that_failed(self):
        """With least outstanding tokens a dead decode (no load) always looks best; a retry must go to the
        untried healthy one even though it is busy, not back to the one that just failed."""
        p = self.start(t.sim("--role", "prefill"))
        d = self.start(t.sim("--role", "decode", "--decode-us-per-token", "20000"))
        dead = t.free_port()
        r = self.start(t.router([p.port], [dead, d.port], "--decode-policy", "lot", "--health-interval-ms", "0",
                                "--eject-after-failures", "0", "--max-retries", "3", "--retry-backoff-ms", "0"))
        busy = t.Stream(r.port, "/v1/completions", stream_body(400))  # keeps the healthy decode loaded
        next(busy.events())
        before = t.metric(r.port, 'xpyd_retries_total{role="decode"}')
        for _ in range(3):
            st, _, out = t.post_json(r.port, "/v1/completions", CMPL)
            self.assertEqual(st, 200, out)
            self.assertEqual(out["object"], "text_completion")
        tried = t.metric(r.port, 'xpyd_retries_total{role="decode"}') - before
        self.assertEqual(tried, 3)  # exactly one retry each: the dead one first, then the healthy one
        busy.close()
        self.idle(r)

    def test_failing_prefill_is_retried(self):
        bad = self.start(t.sim("--role", "prefill", "--status-code", "500"))
        good = self.start(t.sim("--role", "prefill"))
        d = self.start(t.sim("--role", "decode"))
        r = self.start(t.router([bad.port, good.port], [d.port], "--prefill-policy", "rr"))
        for _ in range(4):
            st, _, out = t.post_json(r.port, "/v1/completions", CMPL)
            self.assertEqual(st, 200, out)
        self.assertGreaterEqual(t.metric(r.port, 'xpyd_retries_total{role="prefill"}'), 2)
        self.idle(r)


class RetryBothLegsAtOnce(t.TestCase):
    """Modes that send both legs at once: when one leg fails, its partner did not, so the retry may use the
    partner's instance again (with a single decode, a failed prefill must not leave 'no decode' behind)."""

    def test_bootstrap_prefill_failure_reuses_the_only_decode(self):
        bad = self.start(t.sim("--role", "prefill", "--handoff", "bootstrap", "--status-code", "500"))
        good = self.start(t.sim("--role", "prefill", "--handoff", "bootstrap"))
        d = self.start(t.sim("--role", "decode", "--handoff", "bootstrap"))
        r = self.start(t.router([bad, good], [d.port], "--handoff", "bootstrap", "--prefill-policy", "rr",
                                "--max-retries", "1", "--retry-backoff-ms", "0", "--eject-after-failures", "0"))
        for _ in range(4):
            st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "a b", "max_tokens": 3})
            self.assertEqual(st, 200, out)
        # every attempt on the failing prefill was retried, and no request failed for want of a decode
        failed = t.metric_sum(r.port, 'xpyd_instance_errors_total{role="prefill",engine="127.0.0.1:%d",dp_rank="0"}' % bad.port)
        self.assertGreater(failed, 0)
        self.assertEqual(t.metric(r.port, 'xpyd_retries_total{role="prefill"}'), failed)
        self.idle(r)

    def test_bootstrap_decode_failure_reuses_the_only_prefill(self):
        p = self.start(t.sim("--role", "prefill", "--handoff", "bootstrap"))
        bad = self.start(t.sim("--role", "decode", "--handoff", "bootstrap", "--status-code", "503"))
        good = self.start(t.sim("--role", "decode", "--handoff", "bootstrap"))
        r = self.start(t.router([p], [bad.port, good.port], "--handoff", "bootstrap", "--decode-policy", "rr",
                                "--max-retries", "1", "--retry-backoff-ms", "0", "--eject-after-failures", "0"))
        for _ in range(4):
            st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "a b", "max_tokens": 3})
            self.assertEqual(st, 200, out)
        failed = t.metric_sum(r.port, 'xpyd_instance_errors_total{role="decode",engine="127.0.0.1:%d",dp_rank="0"}' % bad.port)
        self.assertGreater(failed, 0)
        self.assertEqual(t.metric(r.port, 'xpyd_retries_total{role="decode"}'), failed)
        self.idle(r)


if __name__ == "__main__":
    t.main()
