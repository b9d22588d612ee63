# SPDX-License-Identifier: Apache-2.0
"""The decode's load falls token by token: a rank's outstanding tokens are its requests' prompt plus the tokens
still to come, so each streamed token lowers them by one (down to the KV it still holds), and placement sees
a half-finished long answer as the lighter load it is. Back to zero at the end."""
import xpyd_testlib as t


def decode_outstanding(port):
    s = t.status(port)
    return s["pools"]["decode"]["instances"][0]["outstanding_tokens"]


class DecodeLoad(t.TestCase):
    def test_outstanding_tokens_fall_per_token(self):
        p = self.start(t.sim("--role", "prefill"))
        d = self.start(t.sim("--role", "decode", "--decode-us-per-token", "30000"))
        r = self.start(t.router([p.port], [d.port]))
        body = {"prompt": [1, 2, 3, 4, 5, 6, 7, 8], "max_tokens": 60, "stream": True, "ignore_eos": True}
        st = t.Stream(r.port, "/v1/completions", body)
        events = st.events()
        next(events)
        first = decode_outstanding(r.port)
        self.assertGreater(first, 40)
        self.assertLessEqual(first, 8 + 60)
        seen = 1
        for payload, _ in events:
            if payload and payload != "[DONE]" and '"text"' in payload:
                seen += 1
            if seen >= 31:
                break
        later = decode_outstanding(r.port)
        self.assertLessEqual(later, first - 25, "outstanding tokens did not fall while tokens streamed")
        self.assertGreaterEqual(later, 8)  # the prompt's KV is still held
        st.read_all()
        self.idle(r)


if __name__ == "__main__":
    t.main()
