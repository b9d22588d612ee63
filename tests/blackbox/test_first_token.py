# SPDX-License-Identifier: Apache-2.0
"""--first-token prefill: streamed requests get the prefill's token first (covered in test_router_paths);
non-streamed requests always take the whole answer from the decode, so their text, id and usage are exactly
what the same request gets with --first-token decode."""
import json

import xpyd_testlib as t


class FirstTokenNonStream(t.TestCase):
    def test_non_streamed_answer_is_the_decode_s(self):
        p, d = self.start(t.sim("--role", "prefill")), self.start(t.sim("--role", "decode"))
        rp = self.start(t.router([p.port], [d.port], "--first-token", "prefill"))
        rd = self.start(t.router([p.port], [d.port], "--first-token", "decode"))
        body = {"prompt": "the same prompt for both", "max_tokens": 6, "seed": 3}
        st1, _, a = t.post_json(rp.port, "/v1/completions", body)
        st2, _, b = t.post_json(rd.port, "/v1/completions", body)
        self.assertEqual((st1, st2), (200, 200))
        self.assertEqual(a["choices"][0]["text"], b["choices"][0]["text"])
        self.assertEqual(a["usage"]["completion_tokens"], 6)
        self.assertEqual(a["usage"], b["usage"])
        self.assertEqual(t.metric(rp.port, "xpyd_first_token_mismatch_total"), 0)
        chat = {"messages": [{"role": "user", "content": "hi there"}], "max_tokens": 5, "seed": 3}
        st1, _, a = t.post_json(rp.port, "/v1/chat/completions", chat)
        st2, _, b = t.post_json(rd.port, "/v1/chat/completions", chat)
        self.assertEqual((st1, st2), (200, 200))
        self.assertEqual(a["choices"][0]["message"], b["choices"][0]["message"])
        self.idle(rp)
        self.idle(rd)


class FirstTokenModel(t.TestCase):
    def test_prefill_token_event_names_the_model(self):
        # the prefill's token goes out in an event the router writes: it names the client's model as the
        # decode's events do (the router keeps the name when it frees its parse of the body at the start)
        p, d = self.start(t.sim("--role", "prefill")), self.start(t.sim("--role", "decode"))
        r = self.start(t.router([p.port], [d.port], "--first-token", "prefill"))
        for path, body in (("/v1/completions", {"prompt": "a b c", "max_tokens": 4}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a b"}],
                                                     "max_tokens": 4})):
            evs = t.Stream(r.port, path, dict(body, model="sim-model", stream=True, ignore_eos=True)).read_all()
            self.assertEqual(evs[-1], "[DONE]")
            objs = [json.loads(e) for e in evs if e and e != "[DONE]"]
            self.assertGreaterEqual(len(objs), 4)
            self.assertEqual([o.get("model") for o in objs], ["sim-model"] * len(objs), evs)
        self.idle(r)


class FirstTokenConcurrentModes(t.TestCase):
    def test_bootstrap_stream_loses_no_token(self):
        # SGLang bootstrap sends both legs at once and never splices the prefill's token: with --first-token
        # prefill the client must still get every decode token (the first one used to be dropped as if the
        # prefill's had stood in for it)
        p = self.start(t.sim("--role", "prefill", "--handoff", "bootstrap"))
        d = self.start(t.sim("--role", "decode", "--handoff", "bootstrap"))
        r = self.start(t.router([p], [d.port], "--handoff", "bootstrap", "--first-token", "prefill"))
        for path, body in (("/v1/completions", {"prompt": "a b c", "max_tokens": 5}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a b"}],
                                                     "max_tokens": 5})):
            b = dict(body, stream=True, ignore_eos=True)
            evs = t.Stream(r.port, path, b).read_all()
            self.assertEqual(evs[-1], "[DONE]")
            self.assertEqual(len(t.content_events(evs)), 5, evs)
        self.idle(r)


if __name__ == "__main__":
    t.main()
