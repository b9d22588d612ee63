"""xpyd_router failure paths, one class per failure mode: never a 200 with an empty or truncated body;
errors in OpenAI's shape naming the failing leg; load back to zero afterwards."""
import json
import socket

import xpyd_testlib as t

CMPL = {"prompt": "a b c", "max_tokens": 4}


def stream_body(n=4):
    return {"prompt": "a b c", "max_tokens": n, "stream": True, "stream_options": {"include_usage": True}}


class Base(t.TestCase):
    def idle(self, r):
        t.wait_until(lambda: t.router_idle(r.port), what="router load back to zero")


class BadInput(Base):
    def test_rejected_with_openai_errors(self):
        p, d = self.start(t.sim("--role", "prefill")), self.start(t.sim("--role", "decode"))
        r = self.start(t.router([p.port], [d.port], "--max-body-bytes", "2048"))
        cases = [('{"prompt": "a",', 400, "malformed JSON"), ('[1]', 400, "JSON object"),
                 ('{"max_tokens": 3}', 400, "'prompt' is required"),
                 ('{"prompt": "a", "stream": "yes"}', 400, "'stream' must be a boolean"),
                 ('{"prompt": "a", "max_tokens": "x"}', 400, "'max_tokens' must be a positive integer")]
        for raw, status, needle in cases:
            st, h, out = t.request(r.port, "POST", "/v1/completions", raw)
            self.assertOpenAIError(st, json.loads(out), status, needle)
            self.assertEqual(h["content-type"], "application/json")
        st, _, out = t.request(r.port, "POST", "/v1/chat/completions", '{"messages": []}')
        self.assertOpenAIError(st, json.loads(out), 400, "'messages'")
        st, _, out = t.request(r.port, "POST", "/v1/completions", json.dumps({"prompt": "x " * 3000}))
        self.assertOpenAIError(st, json.loads(out), 413, "--max-body-bytes")
        st, _, out = t.request(r.port, "GET", "/v1/completions")
        self.assertEqual(st, 405)
        st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 1},
                                 headers={"Content-Type": "application/json; charset=utf-8"})
        self.assertEqual(st, 200, out)
        # nothing was dispatched for the rejected ones
        self.assertEqual(t.metric(p.port, "xpyd_sim:requests_total"), 1)
        self.assertEqual(t.metric(r.port, 'xpyd_request_errors_total{reason="bad_request"}'), 7)  # incl. the 405
        self.idle(r)

    def test_engine_rejection_passed_through(self):
        p = self.start(t.sim("--role", "prefill", "--max-model-len", "16"))
        d = self.start(t.sim("--role", "decode", "--max-model-len", "16"))
        r = self.start(t.router([p.port], [d.port]))
        st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "a b c", "min_tokens": 5, "max_tokens": 2})
        # the prefill leg gets max_tokens 1 without min_tokens; the decode judges the original body
        self.assertOpenAIError(st, out, 400, "min_tokens must be less than or equal")
        st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "a b c", "model": "other"})
        self.assertOpenAIError(st, out, 404, "does not exist")
        self.idle(r)
        self.assertEqual(t.metric(p.port, "xpyd_sim:kv_leases_active"), 1)  # min_tokens case: prefill ran


class UpstreamDown(Base):
    def test_prefill_down(self):
        d = self.start(t.sim("--role", "decode"))
        dead = t.free_port()
        r = self.start(t.router([dead], [d.port]))
        st, _, out = t.post_json(r.port, "/v1/completions", CMPL)
        self.assertOpenAIError(st, out, 502, "prefill 127.0.0.1:%d failed" % dead)
        st = t.Stream(r.port, "/v1/completions", stream_body())
        self.assertEqual(st.status, 502)
        self.assertEqual(json.loads(st.r.read())["error"]["code"], 502)
        self.assertEqual(t.metric(r.port, 'xpyd_request_errors_total{reason="prefill_connect"}'), 2)
        self.idle(r)

    def test_decode_down(self):
        p = self.start(t.sim("--role", "prefill"))
        dead = t.free_port()
        r = self.start(t.router([p.port], [dead]))
        st, _, out = t.post_json(r.port, "/v1/completions", CMPL)
        self.assertOpenAIError(st, out, 502, "decode 127.0.0.1:%d failed" % dead)
        self.idle(r)


class RetryOtherInstance(Base):
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


class DecodeStatus(Base):
    def test_decode_error_status_passed_through(self):
        p = self.start(t.sim("--role", "prefill"))
        d = self.start(t.sim("--role", "decode", "--status-code", "503"))
        r = self.start(t.router([p.port], [d.port]))
        st, _, out = t.post_json(r.port, "/v1/completions", CMPL)
        self.assertOpenAIError(st, out, 503, "injected")
        st = t.Stream(r.port, "/v1/completions", stream_body())
        self.assertEqual(st.status, 503)
        self.idle(r)


class MidStreamFailure(Base):
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
        self.idle(r)
        r.stop()  # errors are logged as one structured line even at --log-level error
        lines = [l for l in r.output().splitlines() if "event=request_failed" in l]
        self.assertEqual(len(lines), 2, r.output())
        self.assertIn("reason=decode_broken_stream", lines[0])


class Timeouts(Base):
    def test_first_token_timeout(self):
        p = self.start(t.sim("--role", "prefill"))
        d = self.start(t.sim("--role", "decode", "--stall-ms", "5000"))
        r = self.start(t.router([p.port], [d.port], "--first-token-timeout-ms", "300"))
        st, _, out = t.post_json(r.port, "/v1/completions", CMPL)
        self.assertOpenAIError(st, out, 504, "no answer within the timeout")
        self.assertEqual(t.metric(r.port, 'xpyd_request_errors_total{reason="decode_timeout"}'), 1)
        self.idle(r)


if __name__ == "__main__":
    t.main()
