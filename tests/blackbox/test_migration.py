# SPDX-License-Identifier: Apache-2.0
"""Streams that survive a decode's death (--migration-limit, default 1): when the decode leg fails after tokens
reached the client (connection cut, process killed, stream truncated, or the engine giving the request up with
stop_reason "recomputed"), the router continues the request at another decode — the prompt plus the text the
client already has, max_tokens reduced — and splices that stream into the client's. The client sees the very
stream an uninterrupted run gives: the same text (xpyd_sim continues deterministically), one role chunk, one
id, one [DONE], usage counted as one engine would. Past the limit, or with it at 0, the error event comes as
before. Everything returns to zero."""
import json
import signal
import time

import xpyd_testlib as t

CMPL = {"model": "sim-model", "prompt": "the quick brown fox", "max_tokens": 12, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True}}
CHAT = {"model": "sim-model", "messages": [{"role": "system", "content": "be brief"},
                                           {"role": "user", "content": "tell me a story"}],
        "max_tokens": 12, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


def summary(payloads):
    """(text, role chunks, ids, usage, [DONE] count, error events) of a stream as the client saw it."""
    text, roles, ids, usage, done, errors = "", 0, set(), None, 0, []
    for p in payloads:
        if p is None:
            continue
        if p == "[DONE]":
            done += 1
            continue
        j = json.loads(p)
        if "error" in j:
            errors.append(j["error"])
            continue
        ids.add(j.get("id"))
        for ch in j.get("choices") or []:
            delta = ch.get("delta") or {}
            if "role" in delta:
                roles += 1
            text += ch.get("text") or delta.get("content") or ""
        if j.get("usage"):
            usage = j["usage"]
    return text, roles, ids, usage, done, errors


class Migration(t.TestCase):
    def reference(self, path, body):
        """The stream an uninterrupted run gives (a healthy decode alone)."""
        p = self.start(t.sim("--role", "prefill"))
        d = self.start(t.sim("--role", "decode", "--decode-us-per-token", "200"))
        r = self.start(t.router([p.port], [d.port]))
        return summary(t.Stream(r.port, path, body).read_all())

    def cluster(self, bad_args, *router_args):
        p = self.start(t.sim("--role", "prefill"))
        bad = self.start(t.sim("--role", "decode", "--decode-us-per-token", "200", *bad_args))
        good = self.start(t.sim("--role", "decode", "--decode-us-per-token", "200"))
        # round robin from the bad one: every first attempt meets the fault
        r = self.start(t.router([p.port], [bad.port, good.port], "--decode-policy", "rr", "--retry-backoff-ms", "0",
                                "--eject-after-failures", "0", *router_args))
        return p, bad, good, r

    def test_cut_stream_continues_identically(self):
        for path, body in (("/v1/completions", CMPL), ("/v1/chat/completions", CHAT)):
            with self.subTest(path=path):
                ref = self.reference(path, body)
                p, bad, good, r = self.cluster(["--fail-after-tokens", "4"])
                for _ in range(2):  # the second goes to the bad decode first too (rr)
                    got = summary(t.Stream(r.port, path, body).read_all())
                    self.assertEqual(got[0], ref[0])                       # the same text, token for token
                    self.assertEqual(got[1], ref[1])                       # chat: exactly one role chunk
                    self.assertEqual(len(got[2]), 1)                       # one id throughout
                    self.assertEqual(got[3]["completion_tokens"], 12)      # usage as one engine counts it
                    self.assertEqual(got[3]["prompt_tokens"], ref[3]["prompt_tokens"])
                    self.assertEqual(got[3]["total_tokens"], ref[3]["total_tokens"])
                    self.assertEqual((got[4], got[5]), (1, []))            # one [DONE], no error
                m = t.metrics(r.port)
                self.assertEqual(m['xpyd_migrations_total{reason="decode_broken_stream"}'], 2)
                self.assertEqual(m['xpyd_requests_total{endpoint="%s",status="200"}' % path], 2)
                self.idle(r)
                t.wait_until(lambda: t.metric(p.port, "xpyd_sim:kv_leases_active") == 0, what="leases freed")

    def test_cut_stream_without_prefill_keeps_the_engines_id(self):
        # No prefill (--handoff none): the id the client sees is the decode's own, read from its first event (a
        # scan, not a parse, for the usual compact event), and the continuation carries it too.
        for path, body in (("/v1/completions", CMPL), ("/v1/chat/completions", CHAT)):
            with self.subTest(path=path):
                bad = self.start(t.sim("--role", "both", "--decode-us-per-token", "200", "--fail-after-tokens", "4"))
                good = self.start(t.sim("--role", "both", "--decode-us-per-token", "200"))
                r = self.start(t.router([], [bad.port, good.port], "--handoff", "none", "--decode-policy", "rr",
                                        "--retry-backoff-ms", "0", "--eject-after-failures", "0"))
                for _ in range(2):
                    s = t.Stream(r.port, path, body)
                    got = s.read_all()
                    ids = [json.loads(x)["id"] for x in got if x not in (None, "[DONE]")]
                    self.assertEqual(len(set(ids)), 1, ids)  # one id throughout
                    self.assertRegex(ids[0], r"^(cmpl|chatcmpl)-xpyd-[0-9a-f]{32}$")  # the engine's (for the router's request id), whole
                    g = summary(got)
                    self.assertEqual((g[3]["completion_tokens"], g[4], g[5]), (12, 1, []))
                self.assertEqual(t.metric(r.port, 'xpyd_migrations_total{reason="decode_broken_stream"}'), 2)
                self.idle(r)

    def test_repeated_key_continues_the_last(self):
        # The router frees its tree of the client's body once the request has started and parses the kept text
        # again for a continuation: as on the first attempt, the last of a repeated key is the one read.
        ref = self.reference("/v1/completions", CMPL)
        other = summary(t.Stream(self.start(t.router([], [self.start(t.sim("--role", "both")).port],
                                                     "--handoff", "none")).port,
                                 "/v1/completions", dict(CMPL, prompt="a different story")).read_all())
        self.assertNotEqual(other[0], ref[0])  # the prompts give different texts: the test can tell them apart
        raw = '{"prompt": "a different story", ' + json.dumps(CMPL)[1:]
        p, bad, good, r = self.cluster(["--fail-after-tokens", "4"])
        got = summary(t.Stream(r.port, "/v1/completions", raw).read_all())
        self.assertEqual(got[0], ref[0])
        self.assertEqual((got[4], got[5], len(got[2])), (1, [], 1))
        self.assertEqual(t.metric(r.port, 'xpyd_migrations_total{reason="decode_broken_stream"}'), 1)
        self.idle(r)

    def test_killed_decode_mid_stream(self):
        ref = self.reference("/v1/completions", dict(CMPL, max_tokens=40))
        p = self.start(t.sim("--role", "prefill"))
        victim = self.start(t.sim("--role", "decode", "--decode-us-per-token", "20000"))
        good = self.start(t.sim("--role", "decode", "--decode-us-per-token", "200"))
        r = self.start(t.router([p.port], [victim.port, good.port], "--decode-policy", "rr",
                                "--retry-backoff-ms", "0", "--eject-after-failures", "0", "--access-log", "json"))
        s = t.Stream(r.port, "/v1/completions", dict(CMPL, max_tokens=40))
        ev = s.events()
        first = [next(ev)[0] for _ in range(3)]  # three tokens arrived from the victim
        victim.p.send_signal(signal.SIGKILL)
        victim.p.wait(10)
        victim.stop(check=False)
        rest = [x for x, _ in ev]
        got = summary(first + rest)
        self.assertEqual(got[0], ref[0])
        self.assertEqual((got[4], got[5], len(got[2])), (1, [], 1))
        self.assertEqual(got[3]["completion_tokens"], 40)
        self.assertEqual(t.metric(r.port, 'xpyd_migrations_total{reason="decode_broken_stream"}'), 1)
        self.idle(r)
        r.stop()
        (line,) = [json.loads(l) for l in r.output().splitlines() if l.startswith("{")]
        self.assertEqual((line["migrations"], line["status"], line["decode"]), (1, 200, "127.0.0.1:%d" % good.port))

    def test_preempted_engine_is_migrated(self):
        # stop_reason "recomputed" (vllm-ascend's preemption signal): streamed, the rest comes from another
        # decode; not streamed, the whole request goes again (nothing reached the client)
        ref = self.reference("/v1/chat/completions", CHAT)
        p, bad, good, r = self.cluster(["--recompute-after-tokens", "5"])
        got = summary(t.Stream(r.port, "/v1/chat/completions", CHAT).read_all())
        self.assertEqual((got[0], got[1], got[4], got[5]), (ref[0], ref[1], 1, []))
        self.assertNotIn("recomputed", json.dumps(got[3]))
        self.assertEqual(t.metric(r.port, 'xpyd_migrations_total{reason="decode_preempted"}'), 1)
        st, _, out = t.post_json(r.port, "/v1/chat/completions", dict(CHAT, stream=False, stream_options=None))
        self.assertEqual(st, 200, out)
        self.assertEqual(out["choices"][0]["message"]["content"], ref[0])
        self.assertEqual(out["choices"][0]["finish_reason"], "length")
        self.idle(r)

    def test_long_continuation_goes_through_a_prefill(self):
        # the cost model: a continuation at least --migration-prefill-min-tokens long gets a prefill leg (its KV
        # handed to the next decode) instead of the decode computing it; the client's stream is the same
        for path, body in (("/v1/completions", CMPL), ("/v1/chat/completions", CHAT)):
            with self.subTest(path=path):
                ref = self.reference(path, body)
                p, bad, good, r = self.cluster(["--fail-after-tokens", "4"], "--migration-prefill-min-tokens", "1")
                got = summary(t.Stream(r.port, path, body).read_all())
                self.assertEqual((got[0], got[1], len(got[2]), got[4], got[5]), (ref[0], ref[1], 1, 1, []))
                self.assertEqual(got[3]["completion_tokens"], 12)
                self.assertEqual(got[3]["prompt_tokens"], ref[3]["prompt_tokens"])
                self.assertEqual(t.metric(p.port, "xpyd_sim:requests_total"), 2)  # the request's, the continuation's
                self.assertEqual(t.metric(good.port, 'xpyd_sim:handoffs_total{mode="kv-params",result="done"}'), 1)
                self.idle(r)
                t.wait_until(lambda: t.metric(p.port, "xpyd_sim:kv_leases_active") == 0, what="leases freed")

    def test_limit_reached_gives_the_error_event(self):
        # every decode cuts after 3 tokens: one continuation is allowed, then the error event as today
        p = self.start(t.sim("--role", "prefill"))
        ds = [self.start(t.sim("--role", "decode", "--fail-after-tokens", "3")) for _ in range(3)]
        r = self.start(t.router([p.port], [d.port for d in ds], "--retry-backoff-ms", "0",
                                "--eject-after-failures", "0"))
        got = summary(t.Stream(r.port, "/v1/completions", CMPL).read_all())
        self.assertEqual(len(got[5]), 1)          # one error event...
        self.assertEqual(got[4], 1)               # ...then [DONE]
        self.assertEqual(len(got[0].split()), 6)  # 3 tokens from each of the two decodes it reached
        self.assertEqual(t.metric(r.port, 'xpyd_migrations_total{reason="decode_broken_stream"}'), 1)
        self.assertEqual(t.metric(r.port, 'xpyd_request_errors_total{reason="decode_broken_stream"}'), 1)
        self.idle(r)
        off = self.start(t.router([p.port], [d.port for d in ds], "--migration-limit", "0"))
        got = summary(t.Stream(off.port, "/v1/completions", CMPL).read_all())
        self.assertEqual((len(got[5]), got[4], len(got[0].split())), (1, 1, 3))
        self.assertEqual(t.metric(off.port, 'xpyd_migrations_total{reason="decode_broken_stream"}'), 0)
        self.idle(off)

    def test_token_id_prompts_are_not_continued(self):
        p = self.start(t.sim("--role", "prefill"))
        ds = [self.start(t.sim("--role", "decode", "--fail-after-tokens", "3")),
              self.start(t.sim("--role", "decode"))]
        r = self.start(t.router([p.port], [d.port for d in ds], "--decode-policy", "rr"))
        got = summary(t.Stream(r.port, "/v1/completions", dict(CMPL, prompt=[11, 12, 13])).read_all())
        self.assertEqual((len(got[5]), got[4]), (1, 1))  # the error event: its text cannot be appended
        self.idle(r)


if __name__ == "__main__":
    t.main()
