# SPDX-License-Identifier: Apache-2.0
"""An engine that is down (connection refused): 502 in OpenAI's shape naming the leg and instance, never
a 200 with an empty body; load back to zero."""
import json

import xpyd_testlib as t

CMPL, stream_body = t.CMPL, t.stream_body


class UpstreamDown(t.TestCase):
    def test_prefill_down(self):
        d = self.start(t.sim("--role", "decode"))
        dead = t.free_port()
        r = self.start(t.router([dead], [d.port], "--prefill-fallback", "off"))  # test_prefill_fallback: on
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


if __name__ == "__main__":
    t.main()
