#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""--learn-max-model-len: ranks given by address alone (no max_model_len configured) take their engine's from its
GET /v1/models, so a router counting prompts exactly (--tokenizer) refuses one over the engines' context with 400
before any engine sees it; asked once each time the engine is seen up (a restart with another length is learned
again), with this router in X-Xpyd-Via and the --api-key as bearer key; a configured max_model_len wins; `off`,
and `auto` without --tokenizer, ask nothing (the engines judge, as before)."""
import json
import os
import threading

import xpyd_testlib as t
from test_tokenizer import model_dir, oracle

TEXT = "你好世界，这是一个测试。" * 12  # over 60 tokens with Llama 3.1


def completion(port, prompt, max_tokens=2, headers=None):
    st, _, out = t.request(port, "POST", "/v1/completions",
                           {"model": "sim-model", "prompt": prompt, "max_tokens": max_tokens}, headers=headers,
                           timeout=30)
    return st, json.loads(out)


def instances(port, headers=None):
    s = t.request_json_status(port, headers)
    return [i for role in ("prefill", "decode") for i in s["pools"][role]["instances"]]


def learned(port, headers=None):
    return [i["learned_max_model_len"] for i in instances(port, headers)]


class Engine:
    """A scripted engine: /health 200 (503 while down), /v1/models from `cards` (a list of model cards, or None
    for 404), completions answered; every request recorded with its headers."""

    def __init__(self, cards):
        self.cards, self.down, self.lock = cards, False, threading.Lock()
        self.fake = t.FakeEngine(self.handle)

    def handle(self, method, path, body):
        if path == "/health":
            return (503 if self.down else 200), "application/json", b"{}"
        if path == "/v1/models":
            if self.cards is None:
                return 404, "application/json", b'{"detail":"Not Found"}'
            return 200, "application/json", json.dumps({"object": "list", "data": self.cards}).encode()
        return 200, "application/json", json.dumps({"id": "x", "object": "text_completion", "choices": [
            {"index": 0, "text": "ok", "finish_reason": "length"}], "usage": {
            "prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()

    def asked(self, path):
        return [h for (m, p, _), h in zip(list(self.fake.requests), list(self.fake.headers)) if p == path]

    def stop(self):
        self.fake.stop()


def card(mml, name="sim-model"):
    return {"id": name, "object": "model", "owned_by": "vllm", "root": name, "parent": None, "max_model_len": mml}


class LearnMaxModelLen(t.TestCase):
    def sims(self, mml):
        tok = ("--tokenizer", model_dir("llama3_1"), "--max-model-len", str(mml))
        return self.start(t.sim("--role", "prefill", *tok)), self.start(t.sim("--role", "decode", *tok))

    def fakes(self, *cards):
        es = [Engine(c) for c in cards]
        for e in es:
            self.addCleanup(e.stop)
        return es

    def test_learned_then_refused_before_any_engine(self):
        p, d = self.sims(60)
        r = self.start(t.router([p], [d], "--tokenizer", model_dir("llama3_1")))
        t.wait_until(lambda: learned(r.port) == [60, 60], what="both engines' max_model_len learned")
        self.assertEqual([i["max_model_len"] for i in instances(r.port)], [0, 0])  # none configured
        n = len(oracle("llama3_1", [TEXT], special=True)[0])
        self.assertGreater(n, 60)
        st, out = completion(r.port, TEXT)
        self.assertEqual(st, 400, out)
        self.assertEqual(out["error"]["message"], "This model's maximum context length is 60 tokens. However, "
                         "your request has %d input tokens. Please reduce the length of the input." % n)
        self.assertEqual(out["error"]["type"], "BadRequestError")
        # one keep-alive connection: refused, served, refused (prompt + max_tokens over the learned length)
        c = t.RawConn(r.port)
        for prompt, mt, want in ((TEXT, 2, 400), ("Hello", 2, 200), ("Hello", 60, 400)):
            body = json.dumps({"model": "sim-model", "prompt": prompt, "max_tokens": mt}).encode()
            c.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            self.assertEqual(c.response()[0], want)
        c.close()
        for e in (p, d):  # the engines saw the one request that fits, nothing else
            self.assertEqual(t.metric(e.port, 'vllm:request_success_total{engine="0",model_name="sim-model"}'), 1)
        self.assertEqual(t.metric(r.port, 'xpyd_request_errors_total{reason="context_too_long"}'), 3)
        t.wait_until(lambda: t.router_idle(r.port), what="the router idle")

    def test_an_estimate_is_not_refused_by_a_learned_length(self):
        p, d = self.sims(60)
        r = self.start(t.router([p], [d], "--tokenizer", model_dir("llama3_1"), "--bytes-per-token", "1"))
        t.wait_until(lambda: learned(r.port) == [60, 60], what="both engines' max_model_len learned")
        # an image part: not counted here (reason "media"), the byte estimate (200 bytes, 1 a token: 200) says far
        # more than the engine counts (xpyd_sim: a word a token): the engine judges, as with no length known
        text = "word " * 40
        st, _, out = t.request(r.port, "POST", "/v1/chat/completions", {
            "model": "sim-model", "max_tokens": 2, "messages": [{"role": "user", "content": [
                {"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]})
        self.assertEqual(st, 200, out)
        self.assertEqual(t.metric(r.port, 'xpyd_tokenizer_fallbacks_total{reason="media"}'), 1)
        st, out = completion(r.port, TEXT)  # counted exactly: over the learned 60, refused
        self.assertEqual(st, 400, out)

    def test_a_configured_length_wins(self):
        p, d = self.sims(60)
        topo = os.path.join(t.tmpdir(), "topology.json")
        with open(topo, "w") as f:
            json.dump({role: {"hosts": [{"host": "127.0.0.1", "port": e.port, "max_model_len": 1000}]}
                       for role, e in (("prefill", p), ("decode", d))}, f)
        r = self.start(t.Proc("xpyd_router", ["--port", "0", "--log-level", "warn", "--config", topo,
                                              "--tokenizer", model_dir("llama3_1")]))
        t.wait_until(lambda: learned(r.port) == [60, 60], what="both engines' max_model_len learned")
        self.assertEqual([i["max_model_len"] for i in instances(r.port)], [1000, 1000])
        st, out = completion(r.port, TEXT)  # within the configured 1000: the router lets the engine judge
        self.assertEqual(st, 400, out)
        self.assertIn("you requested", out["error"]["message"])  # the sim's own wording, not the router's
        self.assertEqual(t.metric(r.port, 'xpyd_request_errors_total{reason="context_too_long"}', 0), 0)

    def test_asked_once_per_time_up_with_via_and_key(self):
        pe, de = self.fakes([card(4096), card(4096, "sql-lora")], [card(2048)])
        key = {"Authorization": "Bearer sekrit"}
        r = self.start(t.router([pe.fake.port], [de.fake.port], "--tokenizer", model_dir("llama3_1"),
                                "--api-key", "sekrit", "--health-interval-ms", "50", "--health-fall", "1",
                                "--health-rise", "1"))
        t.wait_until(lambda: learned(r.port, key) == [4096, 2048], what="the fakes' lengths learned")
        t.wait_until(lambda: len(pe.asked("/health")) >= 6, what="more health checks")
        self.assertEqual(len(pe.asked("/v1/models")), 1)  # once, not every round
        self.assertEqual(len(de.asked("/v1/models")), 1)
        h = pe.asked("/v1/models")[0]
        self.assertEqual(h.get("Authorization"), "Bearer sekrit")
        self.assertRegex(h.get("X-Xpyd-Via", ""), r"^xpyd-[0-9a-f]{16}$")
        # the prefill goes down and comes back as another process, with another length: learned again
        pe.down = True
        t.wait_until(lambda: not instances(r.port, key)[0]["healthy"], what="the prefill down")
        pe.cards = [card(8192)]
        pe.down = False
        t.wait_until(lambda: learned(r.port, key) == [8192, 2048], what="the new length learned")
        self.assertEqual(len(pe.asked("/v1/models")), 2)
        # a model list without a length (or none at all): nothing learned, and not asked again each round
        pe.down = True
        t.wait_until(lambda: not instances(r.port, key)[0]["healthy"], what="the prefill down")
        pe.cards = None
        pe.down = False
        t.wait_until(lambda: learned(r.port, key) == [0, 2048], what="the length forgotten")
        seen = len(pe.asked("/health"))
        t.wait_until(lambda: len(pe.asked("/health")) >= seen + 5, what="more health checks")
        self.assertEqual(len(pe.asked("/v1/models")), 3)
        st, _, _ = t.request(r.port, "POST", "/v1/completions", {"model": "m", "prompt": TEXT, "max_tokens": 2},
                             headers=key)
        self.assertEqual(st, 200)  # one rank's length unknown: no refusal, the engines judge

    def test_a_rank_added_later_on_the_engine_takes_its_length(self):
        pe, de = self.fakes([card(4096)], [card(2048)])
        r = self.start(t.router([pe.fake.port], [de.fake.port], "--tokenizer", model_dir("llama3_1"),
                                "--dp-mode", "internal", "--admin-key", "adm", "--health-interval-ms", "50"))
        t.wait_until(lambda: learned(r.port) == [4096, 2048], what="the fakes' lengths learned")
        # the admin API gives the prefill a second DP rank on the same engine: it takes the engine's length
        st, _, out = t.request(r.port, "POST", "/admin/instances", {"role": "prefill", "host": "127.0.0.1",
                                                                      "port": pe.fake.port, "dp": 2},
                               headers={"Authorization": "Bearer adm"})
        self.assertEqual(st, 201, out)
        t.wait_until(lambda: learned(r.port) == [4096, 4096, 2048], what="the new rank's length")
        self.assertEqual(len(pe.asked("/v1/models")), 1)  # the engine was not asked again

    def test_off_and_auto_without_tokenizer_ask_nothing(self):
        for args in (("--tokenizer", model_dir("llama3_1"), "--learn-max-model-len", "off"), ()):
            pe, de = self.fakes([card(60)], [card(60)])
            r = self.start(t.router([pe.fake.port], [de.fake.port], "--health-interval-ms", "50", *args))
            t.wait_until(lambda: min(len(pe.asked("/health")), len(de.asked("/health"))) >= 4,
                         what="health checks")
            self.assertEqual(len(pe.asked("/v1/models")) + len(de.asked("/v1/models")), 0, args)
            self.assertEqual(learned(r.port), [0, 0])
            st, _, _ = t.request(r.port, "POST", "/v1/completions", {"model": "m", "prompt": TEXT, "max_tokens": 2})
            self.assertEqual(st, 200, args)  # the engine judged
            r.stop()


if __name__ == "__main__":
    t.main()
