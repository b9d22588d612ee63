# SPDX-License-Identifier: Apache-2.0
"""An engine answering an error status: passed through with its status and body (stream or not)."""
import json

import xpyd_testlib as t

CMPL, stream_body = t.CMPL, t.stream_body


class DecodeStatus(t.TestCase):
    def test_decode_error_status_passed_through(self):
        p = self.start(t.sim("--role", "prefill"))
        d = self.start(t.sim("--role", "decode", "--status-code", "503"))
        r = self.start(t.router([p.port], [d.port]))
        st, _, out = t.post_json(r.port, "/v1/completions", CMPL)
        self.assertOpenAIError(st, out, 503, "injected")
        st = t.Stream(r.port, "/v1/completions", stream_body())
        self.assertEqual(st.status, 503)
        self.idle(r)


if __name__ == "__main__":
    t.main()
