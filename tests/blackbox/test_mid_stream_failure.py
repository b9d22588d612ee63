# SPDX-License-Identifier: Apache-2.0
"""A decode that dies mid-stream: the client gets one error event then [DONE] (stream) or a clear 502
(non-stream), never a truncated 200; the failure is one structured log line."""
import json

import xpyd_testlib as t

CMPL, stream_body = t.CMPL, t.stream_body


class MidStreamFailure(t.TestCase):
    def test_error_event_then_done(self):
        p = self.start(t.sim("--role", "prefill"))
        d = self.start(t.sim("--role", "decode", "--fail-after-tokens", "2", "--decode-us-per-token", "100"))
        r = self.start(t.router([p.port], [d.port], "--log-level", "error"))
        st = t.Stream(r.port, "/v1/completions", stream_body(10))
        self.assertEqual(st.status, 200)
        payloads = st.read_all()
        self.assertEqual(len(t.content_events(payloads)), 2)
        self.assertEqual(payloads[-1], "[DONE]")
        err = json.loads(payloads[-2])["error"]
        self.assertIn("decode 127.0.0.1:%d failed" % d.port, err["message"])
        self.assertEqual(t.metric(r.port, 'xpyd_request_errors_total{reason="decode_broken_stream"}'), 1)
        # non-streamed: a clear error, never a 200 with a truncated body
        st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 10})
        self.assertOpenAIError(st, out, 502, "decode")
        errs = 'xpyd_instance_errors_total{role="decode",engine="127.0.0.1:%d",dp_rank="0"' % d.port
        self.assertEqual(t.metric_sum(r.port, errs + "}"), 2)  # both failures count against the decode that died
        self.assertEqual(t.metric(r.port, errs + ',cause="broken_stream"}'), 1)  # the stream: cut after its head
        self.assertEqual(t.metric(r.port, errs + ',cause="connect"}'), 1)  # the JSON answer: gone before its head
        # the status says 200 for the stream, its outcome says error
        self.assertEqual(t.metric(r.port, 'xpyd_request_outcomes_total{endpoint="/v1/completions",outcome="error"}'), 2)
        self.assertEqual(t.metric(r.port, 'xpyd_request_outcomes_total{endpoint="/v1/completions",outcome="ok"}'), 0)
        self.idle(r)
        r.stop()  # errors are logged as one structured line even at --log-level error
        lines = [l for l in r.output().splitlines() if "event=request_failed" in l]
        self.assertEqual(len(lines), 2, r.output())
        self.assertIn("reason=decode_broken_stream", lines[0])

    def test_a_migrated_stream_counts_against_the_decode_that_died(self):
        """The stream goes on at the other decode (--migration-limit 1, the default): the client sees every token
        and no error, and the failure counts against the decode that died, not the one that finished."""
        p = self.start(t.sim("--role", "prefill"))
        bad = self.start(t.sim("--role", "decode", "--fail-after-tokens", "2", "--decode-us-per-token", "100"))
        good = self.start(t.sim("--role", "decode", "--decode-us-per-token", "100"))
        r = self.start(t.router([p.port], [bad.port, good.port], "--decode-policy", "rr", "--log-level", "error"))
        payloads = t.Stream(r.port, "/v1/completions", stream_body(10)).read_all()
        self.assertEqual(payloads[-1], "[DONE]")
        self.assertFalse(any("error" in x for x in payloads[:-1] if x and x.startswith("{")), payloads)
        self.assertEqual(t.metric(r.port, 'xpyd_migrations_total{reason="decode_broken_stream"}'), 1)
        errs = 'xpyd_instance_errors_total{role="decode",engine="127.0.0.1:%d",dp_rank="0"}'
        self.assertEqual(t.metric_sum(r.port, errs % bad.port), 1)
        self.assertEqual(t.metric_sum(r.port, errs % good.port), 0)
        self.assertEqual(t.metric(r.port, 'xpyd_request_outcomes_total{endpoint="/v1/completions",outcome="ok"}'), 1)
        self.idle(r)


if __name__ == "__main__":
    t.main()
