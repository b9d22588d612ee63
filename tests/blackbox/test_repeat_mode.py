# SPDX-License-Identifier: Apache-2.0
"""Benchmark repeat mode (--repeat-d-times N, store handoff): with each measured request the router fires N
decode-only clones, but only once the measured request's decode produced its first token (warm-up rule: its
KV is in the store, and the clones do not compete with the measured TTFT); clones are counted and their load
released."""
import shutil
import time

import xpyd_testlib as t


class RepeatMode(t.TestCase):
    def test_clones_wait_for_the_first_token(self):
        store = t.tmpdir(prefix="xpyd-store-")
        self.addCleanup(shutil.rmtree, store, True)
        p = self.start(t.sim("--role", "prefill", "--handoff", "store", "--store-dir", store))
        decodes = [self.start(t.sim("--role", "decode", "--handoff", "store", "--store-dir", store,
                                    "--store-wait-ms", "50", "--stall-ms", "600", "--decode-us-per-token", "1000"))
                   for _ in range(3)]
        r = self.start(t.router([p.port], [d.port for d in decodes], "--handoff", "store", "--repeat-d-times", "2"))

        def decode_requests():
            return sum(t.metric(d.port, "xpyd_sim:requests_total") for d in decodes)

        s = t.Stream(r.port, "/v1/completions", {"prompt": "measured", "max_tokens": 4, "stream": True}, lazy=True)
        t.wait_until(lambda: decode_requests() >= 1, what="the measured request at a decode")
        time.sleep(0.3)  # the decode holds it 600 ms before its first token: no clone may go out meanwhile
        self.assertEqual(decode_requests(), 1, "clones fired before the first token")
        self.assertEqual(t.metric(r.port, "xpyd_repeat_clones_total"), 0)
        payloads = s.read_all()
        self.assertEqual(payloads[-1], "[DONE]")
        t.wait_until(lambda: decode_requests() == 3, what="two clones after the first token")
        self.assertEqual(t.metric(r.port, "xpyd_repeat_clones_total"), 2)
        self.idle(r)

    def test_non_streamed_requests_get_their_clones_after_the_answer(self):
        # a non-streamed answer arrives whole: the clones go out once it did (its KV is in the store), and
        # every clone reads the KV from the store (no recompute)
        store = t.tmpdir(prefix="xpyd-store-")
        self.addCleanup(shutil.rmtree, store, True)
        p = self.start(t.sim("--role", "prefill", "--handoff", "store", "--store-dir", store))
        decodes = [self.start(t.sim("--role", "decode", "--handoff", "store", "--store-dir", store,
                                    "--store-wait-ms", "2000")) for _ in range(2)]
        r = self.start(t.router([p.port], [d.port for d in decodes], "--handoff", "store", "--repeat-d-times", "3"))
        st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "measured twice", "max_tokens": 4})
        self.assertEqual(st, 200, out)
        self.assertEqual(out["usage"]["completion_tokens"], 4)
        total = lambda key: sum(t.metric(d.port, key) for d in decodes)
        t.wait_until(lambda: total("xpyd_sim:requests_total") == 4, what="the answer and three clones")
        self.assertEqual(t.metric(r.port, "xpyd_repeat_clones_total"), 3)
        t.wait_until(lambda: total('xpyd_sim:handoffs_total{mode="store",result="done"}') == 4, what="store hits")
        self.assertEqual(total('xpyd_sim:handoffs_total{mode="store",result="recomputed"}'), 0)
        self.idle(r)


if __name__ == "__main__":
    t.main()
