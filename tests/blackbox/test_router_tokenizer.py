#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""xpyd_router --tokenizer DIR: completion prompts counted exactly with the model's tokenizer before any engine
is picked, checked against Hugging Face's own tokenizer (npm `tokenizers`, tests/blackbox/tok_oracle.js) and
against sims that tokenize with the model too (xpyd_sim --tokenizer): the charge on the rank, the access log,
the prefill's usage (xpyd_tokenizer_mismatch_total stays 0, and counts a router whose model is not the
engines'), a prompt over every rank's max_model_len refused with 400 before any engine sees it (fresh and
keep-alive connections), prefix blocks of token ids that predict exactly what the engine reports cached, chat
requests rendered as vLLM renders them (a request's own chat_template only where the engines trust it, as vLLM's
--trust-request-chat-template), and every counter back to zero."""
import concurrent.futures
import json
import os
import socket
import subprocess
import threading

import oracle_cache
import xpyd_testlib as t
from test_chat_template import specials, template_of, theirs
from test_tokenizer import model_dir, oracle

CACHE = ("--prefix-caching", "on", "--block-size", "16")
MIXED = ("Routers place requests by their tokens. 路由器按令牌放置请求，中文比英文每个字节的令牌更多。"
         "def f(x): return [i * i for i in range(x)]  # code has many short tokens\n")


def access_lines(proc):
    return [json.loads(l) for l in proc.output().splitlines() if l.startswith("{")]


def completion(port, body, headers=None, timeout=30):
    st, _, out = t.request(port, "POST", "/v1/completions", dict({"model": "sim-model", "max_tokens": 2}, **body),
                           headers=headers, timeout=timeout)
    return st, json.loads(out)


def llama_router_of_60(case, p, d):
    """A router with Llama 3.1's tokenizer whose topology gives prefill p and decode d a max_model_len of 60."""
    topo = os.path.join(t.tmpdir(), "topology.json")
    with open(topo, "w") as f:
        json.dump({role: {"hosts": [{"host": "127.0.0.1", "port": e.port, "max_model_len": 60}]}
                   for role, e in (("prefill", p), ("decode", d))}, f)
    return case.start(t.Proc("xpyd_router", ["--port", "0", "--log-level", "warn", "--config", topo,
                                             "--tokenizer", model_dir("llama3_1")]))


class RouterTokenizer(t.TestCase):
    def engines(self, name, *flags):
        p = self.start(t.sim("--role", "prefill", "--tokenizer", model_dir(name), *flags))
        d = self.start(t.sim("--role", "decode", "--tokenizer", model_dir(name), *flags))
        return p, d

    def test_exact_charge_access_log_and_usage(self):
        p = self.start(t.sim("--role", "prefill", "--tokenizer", model_dir("llama3_1"), "--stall-ms", "1500"))
        d = self.start(t.sim("--role", "decode", "--tokenizer", model_dir("llama3_1")))
        r = self.start(t.router([p], [d], "--tokenizer", model_dir("llama3_1"), "--access-log", "json",
                                "--tokenizer-max-batch-prompts", "2"))
        want = oracle("llama3_1", [MIXED, "second prompt", "a" * 3000], special=True)
        self.assertNotEqual(len(want[0]), len(MIXED.encode()) // 4 + 1)  # the byte estimate would be wrong
        # while the prefill holds the request, its rank is charged the exact prompt (lot: nothing cached)
        s = t.Stream(r.port, "/v1/completions", {"model": "sim-model", "prompt": MIXED, "max_tokens": 2,
                                                  "stream": True}, timeout=30, lazy=True)
        rank = lambda: t.status(r.port)["pools"]["prefill"]["instances"][0]["outstanding_tokens"]
        t.wait_until(lambda: rank() > 0, what="the prefill charged")
        self.assertEqual(rank(), len(want[0]))
        self.assertEqual(s.read_all()[-1], "[DONE]")
        # a batch: counted as the sum of its prompts (xpyd_sim refuses batches: the engine's 400 passes through)
        st, out = completion(r.port, {"prompt": ["second prompt", "a" * 3000]})
        self.assertEqual(st, 400, out)
        self.assertIn("batched prompts", out["error"]["message"])
        t.wait_until(lambda: len(access_lines(r)) == 2, what="two access lines")
        lines = access_lines(r)
        self.assertEqual([l["prompt_tokens"] for l in lines], [len(want[0]), len(want[1]) + len(want[2])])
        self.assertEqual([l["prompt_src"] for l in lines], ["tokenizer", "tokenizer"])
        self.assertEqual(t.metric(r.port, "xpyd_tokenizer_prompts_total"), 2)
        self.assertEqual(t.metric(r.port, "xpyd_tokenizer_mismatch_total"), 0)  # the prefill counted the same
        # add_special_tokens false: no BOS, as vLLM does
        st, out = completion(r.port, {"prompt": "second prompt", "add_special_tokens": False})
        self.assertEqual(st, 200, out)
        t.wait_until(lambda: len(access_lines(r)) == 3, what="three access lines")
        self.assertEqual(access_lines(r)[2]["prompt_tokens"], len(want[1]) - 1)
        # token ids are counted as they are (40: past the sixteen bytes counted at a time); chat: its template
        st, out = completion(r.port, {"prompt": list(range(1000, 1040))})
        self.assertEqual(st, 200, out)
        st, _, body = t.request(r.port, "POST", "/v1/chat/completions",
                                {"model": "sim-model", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})
        self.assertEqual(st, 200, body)
        t.wait_until(lambda: len(access_lines(r)) == 5, what="five access lines")
        self.assertEqual([l["prompt_src"] for l in access_lines(r)[3:]], ["ids", "tokenizer"])
        self.assertEqual(access_lines(r)[3]["prompt_tokens"], 40)
        self.assertEqual(t.metric(r.port, 'xpyd_tokenizer_fallbacks_total{reason="template"}'), 0)
        self.assertEqual(t.metric(r.port, "xpyd_tokenizer_prompts_total"), 4)
        self.assertEqual(t.metric(r.port, "xpyd_tokenizer_mismatch_total"), 0)  # the sim honours it too
        # a batch of more texts than --tokenizer-max-batch-prompts (2) keeps the byte estimate
        self.assertEqual(completion(r.port, {"prompt": ["one", "two", "three"]})[0], 400)  # (the sim: no batches)
        t.wait_until(lambda: len(access_lines(r)) == 6, what="six access lines")
        self.assertEqual(access_lines(r)[5]["prompt_src"], "estimate")
        # and on one keep-alive connection: over it, then a prompt counted
        c = t.RawConn(r.port)
        for prompt, want in ((["one", "two", "three"], 400), ("four", 200)):
            body = json.dumps({"model": "sim-model", "prompt": prompt, "max_tokens": 2}).encode()
            c.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            self.assertEqual(c.response()[0], want)
        c.close()
        t.wait_until(lambda: len(access_lines(r)) == 8, what="eight access lines")
        self.assertEqual([l["prompt_src"] for l in access_lines(r)[6:]], ["estimate", "tokenizer"])
        self.assertEqual(t.metric(r.port, 'xpyd_tokenizer_fallbacks_total{reason="shape"}'), 2)
        self.assertEqual(t.metric(r.port, "xpyd_tokenizer_prompts_total"), 5)
        t.wait_until(lambda: t.router_idle(r.port), what="the router idle")
        self.assertEqual(t.metric(r.port, "xpyd_tokenizer_queue_depth"), 0)
        self.assertEqual(t.metric(r.port, "xpyd_request_body_bytes"), 0)

    def test_a_router_with_another_model_counts_mismatches(self):
        p, d = self.engines("qwen3")
        r = self.start(t.router([p], [d], "--tokenizer", model_dir("llama3_1")))
        st, out = completion(r.port, {"prompt": MIXED})
        self.assertEqual(st, 200, out)
        self.assertEqual(t.metric(r.port, "xpyd_tokenizer_mismatch_total"), 1)

    def test_truncate_prompt_tokens_cuts_the_prompt_as_vllm(self):
        # vLLM's truncate_prompt_tokens: a prompt keeps its last k tokens (Hugging Face's left truncation: the BOS
        # a completion gets stays before them), -1 is max_model_len, k over max_model_len a 400: counted so here,
        # charged and checked against max_model_len as cut; Hugging Face's ids and the sims' own counts agree
        p, d = self.engines("llama3_1", "--max-model-len", "200")
        r = self.start(t.router([p], [d], "--tokenizer", model_dir("llama3_1"), "--access-log", "json"))
        t.wait_until(lambda: all(x["learned_max_model_len"] == 200 for role in ("prefill", "decode")
                                 for x in t.status(r.port)["pools"][role]["instances"]), what="max_model_len learned")
        text, short = MIXED * 8, "a short prompt"
        full = oracle("llama3_1", [text], special=True)[0]
        self.assertGreater(len(full), 400)
        st, out = completion(r.port, {"prompt": text})
        self.assertEqual(st, 400, out)  # whole, it is over
        self.assertIn("However, your request has %d input tokens" % len(full), out["error"]["message"])
        served = []
        for body, want in (({"prompt": text, "truncate_prompt_tokens": 100}, 100),
                           ({"prompt": short, "truncate_prompt_tokens": 100},
                            len(oracle("llama3_1", [short], special=True)[0])),
                           ({"prompt": text, "truncate_prompt_tokens": 7, "add_special_tokens": False}, 7)):
            st, out = completion(r.port, body)
            self.assertEqual(st, 200, out)
            self.assertEqual(out["usage"]["prompt_tokens"], want)  # the engine's count
            served.append(want)
        st, _, out = t.request(r.port, "POST", "/v1/chat/completions",
                               {"model": "sim-model", "max_tokens": 2, "truncate_prompt_tokens": 50,
                                "messages": [{"role": "user", "content": text}]}, timeout=30)
        self.assertEqual(st, 200, out)
        self.assertEqual(json.loads(out)["usage"]["prompt_tokens"], 50)
        served.append(50)
        st, out = completion(r.port, {"prompt": text, "truncate_prompt_tokens": -1, "max_tokens": 1})
        self.assertEqual(st, 400, out)  # cut to 200, and one more token does not fit
        self.assertIn("your request has 200 input tokens", out["error"]["message"])
        st, out = completion(r.port, {"prompt": short, "truncate_prompt_tokens": 201})
        self.assertEqual(st, 400, out)
        self.assertEqual(out["error"]["message"], "truncate_prompt_tokens value (201) is greater than max_model_len "
                         "(200). Please, select a smaller truncation size.")
        t.wait_until(lambda: len(access_lines(r)) == 7, what="access lines")
        self.assertEqual([l["prompt_tokens"] for l in access_lines(r) if l["status"] == 200], served)
        self.assertEqual(t.metric(r.port, "xpyd_tokenizer_mismatch_total"), 0)
        for e in (p, d):  # the refused ones never reached them
            self.assertEqual(t.metric(e.port, 'vllm:request_success_total{engine="0",model_name="sim-model"}'), 4)
        self.assertEqual(t.metric(r.port, 'xpyd_request_errors_total{reason="context_too_long"}'), 3)

    def test_truncate_caps_the_estimate_without_a_tokenizer(self):
        # without --tokenizer a prompt is charged its byte estimate; a truncate_prompt_tokens below it caps the
        # charge, as the engine keeps no more (the rank's charge while the prefill holds the request)
        p = self.start(t.sim("--role", "prefill", "--stall-ms", "1500"))
        d = self.start(t.sim("--role", "decode"))
        r = self.start(t.router([p], [d]))
        rank = lambda: t.status(r.port)["pools"]["prefill"]["instances"][0]["outstanding_tokens"]
        for extra, want in (({}, 4000 // 4 + 1), ({"truncate_prompt_tokens": 10}, 10)):
            s = t.Stream(r.port, "/v1/completions", dict({"model": "sim-model", "prompt": "a " * 2000,
                                                          "max_tokens": 2, "stream": True}, **extra),
                         timeout=30, lazy=True)
            t.wait_until(lambda: rank() > 0, what="the prefill charged")
            self.assertEqual(rank(), want)
            self.assertEqual(s.read_all()[-1], "[DONE]")
            t.wait_until(lambda: rank() == 0, what="the charge returned")

    def test_over_max_model_len_is_400_before_any_engine(self):
        p, d = self.engines("llama3_1")
        r = llama_router_of_60(self, p, d)
        text = "你好世界，这是一个测试。" * 6
        n = len(oracle("llama3_1", [text], special=True)[0])
        self.assertGreater(n, 30)  # ~1 token per 2 characters: 66 characters, 198 bytes; the byte estimate: 50
        self.assertLessEqual(n, 55)
        long = text * 2
        n2 = len(oracle("llama3_1", [long], special=True)[0])
        self.assertGreater(n2, 60)
        st, out = completion(r.port, {"prompt": long})  # the prompt alone is over
        self.assertEqual(st, 400, out)
        self.assertEqual(out["error"]["message"], "This model's maximum context length is 60 tokens. However, "
                         "your request has %d input tokens. Please reduce the length of the input." % n2)
        st, out = completion(r.port, {"prompt": text, "max_tokens": 61 - n})  # prompt + max_tokens over
        self.assertEqual(st, 400, out)
        self.assertIn("'max_tokens' or 'max_completion_tokens' is too large: %d" % (61 - n), out["error"]["message"])
        self.assertEqual(out["error"]["type"], "BadRequestError")
        st, out = completion(r.port, {"prompt": text, "max_tokens": 60 - n})  # exactly fits
        self.assertEqual(st, 200, out)
        # on one keep-alive connection: refused, then served, then refused
        c = t.RawConn(r.port)
        for prompt, want in ((long, 400), (text, 200), (long, 400)):
            body = json.dumps({"model": "sim-model", "prompt": prompt, "max_tokens": 2}).encode()
            c.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            self.assertEqual(c.response()[0], want)
        c.close()
        # token ids count as they are: 40 of them (past the sixteen bytes counted at a time) + 21 is over, + 20 fits
        st, out = completion(r.port, {"prompt": list(range(1000, 1040)), "max_tokens": 21})
        self.assertEqual(st, 400, out)
        self.assertIn("'max_tokens' or 'max_completion_tokens' is too large: 21", out["error"]["message"])
        self.assertIn("your request has 40 input tokens", out["error"]["message"])
        st, out = completion(r.port, {"prompt": list(range(1000, 1040)), "max_tokens": 20})
        self.assertEqual(st, 200, out)
        # 1.5 MB of short words, counted in full before the answer (300,000 regex pieces: an encoder that looked at
        # the whole text again at each piece would take hours, not the fraction of a second this takes; 10 s is
        # twenty times what it takes under ASan on a loaded machine, and a third of the CPU the mutant burns)
        words = "word " * 300000
        st, out = completion(r.port, {"prompt": words}, timeout=10)
        self.assertEqual(st, 400, out)
        self.assertIn("your request has %d input tokens" % len(oracle("llama3_1", [words], special=True)[0]),
                      out["error"]["message"])
        # no engine saw a refused request: the sims served the three that fit, nothing else
        for e in (p, d):
            self.assertEqual(t.metric(e.port, 'vllm:request_success_total{engine="0",model_name="sim-model"}'), 3)
        self.assertEqual(t.metric(r.port, 'xpyd_request_errors_total{reason="context_too_long"}'), 6)
        t.wait_until(lambda: t.router_idle(r.port), what="the router idle")

    def test_prefix_blocks_are_the_engines_blocks(self):
        p1 = self.start(t.sim("--role", "prefill", "--tokenizer", model_dir("llama3_1"), *CACHE))
        p2 = self.start(t.sim("--role", "prefill", "--tokenizer", model_dir("llama3_1"), *CACHE))
        d = self.start(t.sim("--role", "decode", "--tokenizer", model_dir("llama3_1")))
        r = self.start(t.router([p1, p2], [d], "--tokenizer", model_dir("llama3_1"), "--prefill-policy", "cache",
                                "--prefix-block-tokens", "16"))
        shared = (MIXED * 6).strip() + "."
        ids = oracle("llama3_1", [shared + " one more question?"], special=True)[0]
        for suffix in (" first question?", " second question here?", " and a third one."):
            st, out = completion(r.port, {"prompt": shared + suffix})
            self.assertEqual(st, 200, out)
        st, out = completion(r.port, {"prompt": ids})  # the same text as ids: the same blocks
        self.assertEqual(st, 200, out)
        pred = t.metric(r.port, 'xpyd_prefix_predicted_tokens_total{role="prefill"}')
        truth = t.metric(r.port, 'xpyd_prefix_cached_tokens_total{role="prefill"}')
        self.assertGreater(truth, 3 * 16 * 10)
        self.assertEqual(pred, truth)  # token blocks: the index knows exactly what the engine has
        self.assertEqual(t.metric(r.port, "xpyd_tokenizer_mismatch_total"), 0)

    def test_client_leaving_while_tokenized_and_bad_text(self):
        p, d = self.engines("llama3_1")
        r = self.start(t.router([p], [d], "--tokenizer", model_dir("llama3_1"), "--tokenizer-threads", "1"))
        big = json.dumps({"model": "sim-model", "prompt": "word " * 1500000, "max_tokens": 1}).encode()
        for _ in range(3):  # sent whole, then gone before the answer
            s = socket.create_connection(("127.0.0.1", r.port))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(big), big))
            s.close()
        # 22 MB of short words: ~1.5 s here, ten times that under ASan; a quadratic encoder takes hours
        t.wait_until(lambda: t.metric(r.port, "xpyd_tokenizer_queue_depth") == 0 and t.router_idle(r.port),
                     timeout=60 if os.environ.get("XPYD_SANITIZED") == "ON" else 20,
                     what="the tokenizer done and the router idle")
        t.wait_until(lambda: t.metric(r.port, "xpyd_request_body_bytes") == 0, what="body memory back to 0")
        # at most the first was encoded (if the thread took it before its client was seen leaving); the two that
        # waited behind it were given up
        self.assertLessEqual(t.metric(r.port, "xpyd_tokenizer_seconds_count"), 1)
        # a lone surrogate is not UTF-8: the router keeps the estimate (the engine decides), counted
        st, _, body = t.request(r.port, "POST", "/v1/completions",
                                b'{"model":"sim-model","prompt":"a \\ud800 b","max_tokens":1}')
        self.assertEqual(t.metric(r.port, 'xpyd_tokenizer_fallbacks_total{reason="invalid_text"}'), 1)
        self.assertEqual(t.metric(r.port, 'xpyd_tokenizer_prompts_total'), 0)
        # the router still serves
        st, out = completion(r.port, {"prompt": "still here"})
        self.assertEqual(st, 200, out)
        t.wait_until(lambda: t.router_idle(r.port), what="the router idle")

    def test_a_prompt_that_takes_long_holds_up_no_other(self):
        p = self.start(t.sim("--role", "prefill", "--max-model-len", "10000000"))
        d = self.start(t.sim("--role", "decode", "--max-model-len", "10000000"))
        r = self.start(t.router([p], [d], "--tokenizer", model_dir("llama3_1"), "--tokenizer-threads", "1",
                                "--tokenizer-wait-ms", "100", "--access-log", "json"))
        # 4 MB without a space: one piece, over a second of BPE on the one tokenizer thread (Hugging Face: 3.2 s)
        big = {"prompt": "a" * (4 << 20)}
        res = {}
        th = threading.Thread(target=lambda: res.update(big=completion(r.port, big)))
        th.start()
        t.wait_until(lambda: t.metric(r.port, "xpyd_tokenizer_queue_depth") == 1, what="the long prompt taken")
        st, out = completion(r.port, {"prompt": "a short question"})  # not taken within 100 ms: the estimate
        self.assertEqual(st, 200, out)
        self.assertTrue(th.is_alive(), "the short prompt waited for the long one")
        self.assertEqual(t.metric(r.port, "xpyd_tokenizer_queue_depth"), 1)  # the short one no longer counted
        self.assertEqual(t.metric(r.port, 'xpyd_tokenizer_fallbacks_total{reason="busy"}'), 1)
        # once the thread has been on the long one for longer than the wait, the next is not queued at all
        shorts = [1]

        def short_stalled():
            st, out = completion(r.port, {"prompt": "another short question"})
            self.assertEqual(st, 200, out)
            shorts[0] += 1
            return t.metric(r.port, 'xpyd_tokenizer_fallbacks_total{reason="stalled"}') == 1
        t.wait_until(short_stalled, what="a short prompt not queued behind the stalled thread")
        self.assertTrue(th.is_alive(), "the long prompt ended too soon for this check")
        self.assertEqual(t.metric(r.port, 'xpyd_tokenizer_fallbacks_total{reason="busy"}') + 1, shorts[0])
        th.join(120)
        self.assertEqual(res["big"][0], 200, res["big"][1])
        lines = access_lines(r)  # the estimates, the prefill counted them; the long one last
        self.assertEqual([l["prompt_src"] for l in lines], ["engine"] * shorts[0] + ["tokenizer"])
        st, out = completion(r.port, {"prompt": "the thread is free again"})  # tokenized again
        self.assertEqual(st, 200, out)
        self.assertEqual(t.metric(r.port, "xpyd_tokenizer_prompts_total"), 2)
        self.assertEqual(t.metric(r.port, "xpyd_tokenizer_seconds_count"), 2)  # the short ones never encoded
        t.wait_until(lambda: t.router_idle(r.port) and t.metric(r.port, "xpyd_tokenizer_queue_depth") == 0,
                     what="the router idle")
        self.assertEqual(t.metric(r.port, "xpyd_request_body_bytes"), 0)

    def test_pieces_alike_where_the_cache_looks_are_kept_four_at_a_time(self):
        # a hostile prompt: 3,000 pieces between special tokens, of one length and with the same first and last 32
        # bytes (what the cache's key reads), differing in the middle. Kept without a bound, each new one would be
        # compared with every one kept before it: quadratic (a 1.8 MB prompt of them took 2.5 s of a tokenizer
        # thread instead of 0.06, a 16 MB one minutes). Four are kept, the rest counted, and the count stays exact
        p, d = self.engines("llama3_1", "--max-model-len", "65536")
        r = self.start(t.router([p], [d], "--tokenizer", model_dir("llama3_1"), "--access-log", "json"))
        prompt = "<|eot_id|>".join("a" * 40 + "%06d" % i + "a" * 40 for i in range(3000))
        for rnd in (1, 2):  # fresh, then again: the four are found, the others refused again
            st, out = completion(r.port, {"prompt": prompt})
            self.assertEqual(st, 200, out)
            t.wait_until(lambda: t.router_idle(r.port), what="the router idle")
            self.assertEqual(t.metric(r.port, "xpyd_tokenizer_cache_entries"), 4)
            self.assertEqual(t.metric(r.port, "xpyd_tokenizer_cache_alike_refused_total"), rnd * 2996)
        want = oracle("llama3_1", [prompt], special=True)
        self.assertEqual([l["prompt_tokens"] for l in access_lines(r)], [len(want[0])] * 2)
        self.assertEqual(t.metric(r.port, "xpyd_tokenizer_mismatch_total"), 0)
        # the bound is the operator's: --tokenizer-cache-alike-max 2 keeps two
        r2 = self.start(t.router([p], [d], "--tokenizer", model_dir("llama3_1"), "--tokenizer-cache-alike-max", "2"))
        st, out = completion(r2.port, {"prompt": prompt})
        self.assertEqual(st, 200, out)
        t.wait_until(lambda: t.router_idle(r2.port), what="the second router idle")
        self.assertEqual(t.metric(r2.port, "xpyd_tokenizer_cache_entries"), 2)
        self.assertEqual(t.metric(r2.port, "xpyd_tokenizer_cache_alike_refused_total"), 2998)

    def test_without_the_flag_nothing_changes_and_a_bad_directory_stops_the_router(self):
        p, d = self.engines("llama3_1")
        r = self.start(t.router([p], [d], "--access-log", "json"))
        st, out = completion(r.port, {"prompt": MIXED})
        self.assertEqual(st, 200, out)
        t.wait_until(lambda: len(access_lines(r)) == 1, what="an access line")
        line = access_lines(r)[0]
        self.assertEqual(line["prompt_src"], "engine")  # the estimate, replaced by the prefill's count
        self.assertEqual(line["prompt_tokens"], len(oracle("llama3_1", [MIXED], special=True)[0]))
        self.assertEqual(t.metric(r.port, "xpyd_tokenizer_prompts_total"), 0)
        self.assertEqual(t.metric(r.port, 'xpyd_tokenizer_fallbacks_total{reason="template"}'), 0)
        res = subprocess.run([os.path.join(t.BIN, "xpyd_router"), "--port", "0", "-p", "127.0.0.1:1", "-d",
                              "127.0.0.1:2", "--tokenizer", "/nonexistent"], capture_output=True, text=True,
                             timeout=30)
        self.assertEqual(res.returncode, 2, res.stderr)
        self.assertIn("--tokenizer /nonexistent: ", res.stderr)
        self.assertIn("/nonexistent/tokenizer.json", res.stderr)


def vllm_conversation(req, parts):
    """What vLLM passes to the chat template for a request (vllm/entrypoints/chat_utils.py and its pydantic
    models), written here for the oracle, apart from the router's C: content as text joined with newlines or as
    text parts, tool-call arguments parsed, tools with null description/parameters when absent."""
    def text(c, as_parts):  # _parse_chat_message_content_parts: a part's text, which ones are kept
        if c is None:
            return []
        if isinstance(c, str):
            c = [{"type": "text", "text": c}]
        out = []
        for p in c:
            kind = "text" if isinstance(p, str) else p["type"]
            t = p if isinstance(p, str) else p.get({"refusal": "refusal", "thinking": "thinking"}.get(kind, "text"))
            if not as_parts and not t:  # read as a string: only truthy texts are joined
                continue
            if as_parts and t is None and kind in ("text", "refusal"):
                continue
            out.append(t)
        return out
    msgs = []
    for m in req["messages"]:
        texts = text(m.get("content"), parts)  # (a tool's parts are then joined, as read for parts)
        out = {"role": m["role"], "content": [{"type": "text", "text": x} for x in texts]
               if parts and m["role"] != "tool" else "\n".join(texts)}
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = json.loads(json.dumps(m["tool_calls"]))
            for c in calls:
                a = c["function"].get("arguments")
                if isinstance(a, str):
                    try:
                        c["function"]["arguments"] = json.loads(a)
                    except ValueError:
                        c["function"]["arguments"] = {}
            out["tool_calls"] = calls
        if m["role"] == "tool" and "tool_call_id" in m:
            out["tool_call_id"] = m["tool_call_id"]
        if isinstance(m.get("name"), str):
            out["name"] = m["name"]
        msgs.append(out)
    conv = {"messages": msgs}
    if req.get("tools") is not None:
        conv["tools"] = [{"type": x.get("type", "function"),
                          "function": {"name": x["function"]["name"],
                                       "description": x["function"].get("description"),
                                       "parameters": x["function"].get("parameters")}} for x in req["tools"]]
    for k in ("add_generation_prompt", "continue_final_message", "chat_template_kwargs"):
        if k in req:
            conv[k] = req[k]
    return conv


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CHATS = [
    {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello 你好 😀"}]},
    {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                  {"role": "user", "content": [{"type": "text", "text": "two"}, {"type": "text", "text": "parts"}]}]},
    {"messages": [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": "c1", "type": "function",
                       "function": {"name": "get_weather",
                                    # (numbers as json.loads reads them: 1.0 a float, 17 digits exact)
                                    "arguments": "{\"city\":\"Paris\",\"ratio\":1.0,\"n\":12345678901234567}"}}]},
                  {"role": "tool", "tool_call_id": "c1", "content": "21 C"}], "tools": TOOLS},
    {"messages": [{"role": "user", "content": "think?"}], "chat_template_kwargs": {"enable_thinking": False}},
    {"messages": [{"role": "user", "content": "hi"}], "add_special_tokens": True, "add_generation_prompt": False},
]
# a conversation of more pieces than an encode looks up at once (16: tok_cache_prefetch), then the same with two turns
# more: its history comes from the cache across those batches and the count must still be Hugging Face's
LONG = [{"role": "system", "content": "You answer in English, 中文 and code."}] + [
    {"role": ("user", "assistant")[i % 2], "content": "Turn %d: %s" % (i, ("for (i = 0; i < n; i++) x += 路由 %d; " % i) * 9)}
    for i in range(14)]
CHATS += [{"messages": LONG}, {"messages": LONG + [{"role": "assistant", "content": "Yes."},
                                                  {"role": "user", "content": "And then?"}]}]
# parts vLLM keeps or drops: a bare string is text, "" and a part without its text are dropped for a template that
# reads content as a string (kept, "" as a part, for one that loops over parts), refusal and thinking parts
EDGE_PARTS = {"messages": [{"role": "user", "content": [
    {"type": "text", "text": "one"}, "bare", {"type": "text"}, {"type": "refusal", "refusal": "no"},
    {"type": "input_text", "text": "two"}, {"type": "text", "text": ""}]},
    {"role": "assistant", "content": [{"type": "output_text", "text": "three"}, {"type": "thinking", "thinking": "hm"}]},
    {"role": "user", "content": ""}]}
CHATS.append(EDGE_PARTS)


class RouterChat(t.TestCase):
    """Chat requests with --tokenizer: rendered with the model's template as vLLM renders it, counted exactly."""

    def chat(self, port, req):
        st, _, out = t.request(port, "POST", "/v1/chat/completions", dict(req, model="sim-model", max_tokens=2),
                               timeout=30)
        return st, json.loads(out)

    def test_counts_equal_jinja2_and_hugging_face(self):
        models = (("qwen3", False), ("gemma3", True))
        for name, parts in models[:1] if os.environ.get("XPYD_SANITIZED") == "ON" else models:  # (ASan: one)
            with self.subTest(model=name):
                p = self.start(t.sim("--role", "prefill", "--tokenizer", model_dir(name)))
                d = self.start(t.sim("--role", "decode", "--tokenizer", model_dir(name)))
                r = self.start(t.router([p], [d], "--tokenizer", model_dir(name), "--access-log", "json"))
                reqs = CHATS if name == "qwen3" else [CHATS[0], CHATS[1], EDGE_PARTS]
                texts = theirs(template_of(name), specials(name), [vllm_conversation(q, parts) for q in reqs])
                want = []
                for q, text in zip(reqs, texts):
                    self.assertIsInstance(text, str)
                    want.append(len(oracle(name, [text], special=bool(q.get("add_special_tokens")))[0]))
                for q in reqs:
                    st, out = self.chat(r.port, q)
                    self.assertEqual(st, 200, out)
                t.wait_until(lambda: len(access_lines(r)) == len(reqs), what="access lines")
                lines = access_lines(r)
                self.assertEqual([l["prompt_tokens"] for l in lines], want)
                self.assertEqual({l["prompt_src"] for l in lines}, {"tokenizer"})
                self.assertEqual(t.metric(r.port, "xpyd_tokenizer_mismatch_total"), 0)  # the sims counted the same
                # an image part: its placeholders are the model's own; the estimate counts it
                st, out = self.chat(r.port, {"messages": [{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]})
                self.assertEqual(t.metric(r.port, 'xpyd_tokenizer_fallbacks_total{reason="media"}'), 1)
                t.wait_until(lambda: t.router_idle(r.port), what="the router idle")
                for proc in (r, p, d):
                    proc.stop()

    def test_a_repeated_key_counts_as_json_loads_reads_it(self):
        # the body is read where it lies: a member given twice is its last, as vLLM's json.loads takes it (a tree
        # parser's lookup finds the first), at the top level and in a message; the sims (their own reading) agree
        raw = (b'{"model":"sim-model","max_tokens":2,"messages":[{"role":"user","content":"not this"}],'
               b'"messages":[{"role":"system","content":"first","content":"You are terse, \\u4f60\\u597d."},'
               b'{"role":"assistant","role":"user","content":"Hello \\"world\\"\\nagain"}]}')
        req = json.loads(raw)
        self.assertEqual(req["messages"][1]["role"], "user")  # what Python reads
        want = len(oracle("qwen3", theirs(template_of("qwen3"), specials("qwen3"),
                                          [vllm_conversation(req, False)]))[0])
        p, d = (self.start(t.sim("--role", role, "--tokenizer", model_dir("qwen3"))) for role in ("prefill", "decode"))
        r = self.start(t.router([p], [d], "--tokenizer", model_dir("qwen3"), "--access-log", "json"))
        st, _, out = t.request(r.port, "POST", "/v1/chat/completions", raw, timeout=30)
        self.assertEqual(st, 200, out)
        t.wait_until(lambda: len(access_lines(r)) == 1, what="the access line")
        self.assertEqual(access_lines(r)[0]["prompt_tokens"], want)
        self.assertEqual(access_lines(r)[0]["prompt_src"], "tokenizer")
        self.assertEqual(t.metric(r.port, "xpyd_tokenizer_mismatch_total"), 0)
        t.wait_until(lambda: t.router_idle(r.port), what="the router idle")

    def test_conversation_turns_come_from_the_cache(self):
        p, d = (self.start(t.sim("--role", role, "--tokenizer", model_dir("qwen3"))) for role in ("prefill", "decode"))
        r = self.start(t.router([p], [d], "--tokenizer", model_dir("qwen3"), "--access-log", "json"))
        msgs = [{"role": "system", "content": "You answer questions about routers. " * 8}]
        for turn in range(5):
            msgs.append({"role": "user", "content": "Question %d: how are requests placed? " % turn * 10})
            st, out = self.chat(r.port, {"messages": msgs})
            self.assertEqual(st, 200, out)
            msgs.append({"role": "assistant", "content": "By their tokens, turn %d. " % turn * 12})
        # system prompts of the same length in bytes but other tokens: one unlike it throughout, one alike in its
        # first and last 100 bytes (where the cache looks a piece up) and digits between: the cache compares the
        # whole piece, so both are encoded, and the sims' counts agree (a wrong hit shows as a mismatch below)
        sysp = msgs[0]["content"]
        twin = sysp[:100] + ("0123456789" * 40)[:len(sysp) - 200] + sysp[len(sysp) - 100:]
        self.assertEqual(len(twin), len(sysp))
        for other in ("x y " * 72, twin):
            st, out = self.chat(r.port, {"messages": [{"role": "system", "content": other}] + msgs[1:3]})
            self.assertEqual(st, 200, out)
            t.wait_until(lambda: t.router_idle(r.port), what="the router idle")
        hit = t.metric(r.port, "xpyd_tokenizer_cache_hit_bytes_total")
        miss = t.metric(r.port, "xpyd_tokenizer_cache_miss_bytes_total")
        self.assertGreater(hit, miss)  # from the second turn on, the history is not encoded again
        self.assertGreater(t.metric(r.port, "xpyd_tokenizer_cache_bytes"), 0)
        self.assertEqual(t.metric(r.port, "xpyd_tokenizer_mismatch_total"), 0)  # and the counts stay exact

    def test_the_cache_lives_on_huge_pages(self):
        # a cold hit reads a conversation's pieces wherever they were put, and on 4 KiB pages misses the TLB on most
        # of them: under jemalloc the cache's hash table and entries get an arena of their own advised for
        # transparent huge pages (Debian's THP mode is `madvise`: only advised memory gets them, so nothing else in
        # the router has any, and XPYD_TOKENIZER_CACHE_SMALL_PAGES=1, the bench's A/B, turns the advice off)
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            if "[madvise]" not in f.read():
                self.skipTest("transparent huge pages are not in madvise mode here")
        p, d = (self.start(t.sim("--role", role, "--tokenizer", model_dir("llama3_1"))) for role in ("prefill", "decode"))

        def huge_kib(pid):
            with open("/proc/%d/smaps" % pid) as f:
                return sum(int(l.split()[1]) for l in f if l.startswith("AnonHugePages:"))

        for small in ("0", "1"):
            r = self.start(t.Proc("xpyd_router", ["--port", "0", "--log-level", "warn", "-p", "127.0.0.1:%d" % p.port,
                                                  "-d", "127.0.0.1:%d" % d.port, "--tokenizer", model_dir("llama3_1")],
                                  env={"XPYD_TOKENIZER_CACHE_SMALL_PAGES": small}))
            with open("/proc/%d/maps" % r.p.pid) as f:
                if "libjemalloc" not in f.read():
                    self.skipTest("this router does not run on jemalloc (a sanitizer build)")
            st, out = self.chat(r.port, {"messages": [{"role": "user", "content": "Where do requests go? " * 200}]})
            self.assertEqual(st, 200, out)
            if small == "0":  # the hash table, written at start, fills a huge page (the kernel's, or khugepaged's)
                t.wait_until(lambda: huge_kib(r.p.pid) >= 2048, what="the cache on huge pages", timeout=15)
            else:
                self.assertEqual(huge_kib(r.p.pid), 0)
            r.stop()

    def test_a_chat_without_max_tokens_has_the_rest_of_the_context(self):
        # vLLM gives a chat without max_tokens what max_model_len leaves after its prompt: only a prompt of
        # max_model_len tokens or more is refused (a completion's default is 16, and counts, unless set to null)
        p, d = (self.start(t.sim("--role", role, "--tokenizer", model_dir("llama3_1"), "--max-model-len", "60"))
                for role in ("prefill", "decode"))
        r = llama_router_of_60(self, p, d)
        reqs = [{"messages": [{"role": "user", "content": "word " * k}]} for k in range(30, 70)]
        texts = theirs(template_of("llama3_1"), specials("llama3_1"), [vllm_conversation(q, False) for q in reqs])
        counts = [len(ids) for ids in oracle("llama3_1", texts, special=False)]
        near = next(q for q, n in zip(reqs, counts) if 50 <= n < 60)  # fits, but not with 16 more
        n = counts[reqs.index(near)]
        over = next((q, c) for q, c in zip(reqs, counts) if c >= 60)
        for body, want, needle in ((near, 200, None),
                                   (dict(near, max_tokens=61 - n), 400, "is too large: %d" % (61 - n)),
                                   (dict(near, max_tokens=60 - n), 200, None),
                                   (over[0], 400, "your request has %d input tokens" % over[1])):
            st, _, out = t.request(r.port, "POST", "/v1/chat/completions", dict(body, model="sim-model"), timeout=30)
            self.assertEqual(st, want, out)
            if needle:
                self.assertIn(needle, json.loads(out)["error"]["message"])
        # a completion: 16 unless the client says null (vLLM reads that as "what is left")
        ids = {"model": "sim-model", "prompt": list(range(1000, 1050))}
        st, _, out = t.request(r.port, "POST", "/v1/completions", ids, timeout=30)
        self.assertEqual(st, 400, out)
        self.assertIn("is too large: 16", json.loads(out)["error"]["message"])
        st, _, out = t.request(r.port, "POST", "/v1/completions", dict(ids, max_tokens=None), timeout=30)
        self.assertEqual(st, 200, out)
        self.assertEqual(t.metric(r.port, 'xpyd_request_errors_total{reason="context_too_long"}'), 3)
        t.wait_until(lambda: t.router_idle(r.port), what="the router idle")

    def test_a_requests_own_template_is_counted_where_the_engines_trust_it(self):
        # vLLM refuses a request's chat_template unless started with --trust-request-chat-template: a router that
        # is not told they trust it never renders a client's template (the estimate counts it), and passes the
        # engine's 400 on; told so, it renders the request's template (the kwargs' winning) and counts it exactly
        hi = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello"},
              {"role": "user", "content": MIXED}]
        own = "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>{{ m.content }}{% endfor %}"
        reqs = [{"messages": hi, "chat_template": own},
                {"messages": hi, "chat_template": "x", "chat_template_kwargs": {"chat_template": own + "!"}}]
        # trusted, the templates are kept compiled within a memory budget, least recently used out: each of these
        # costs its tree's 64-KiB arena and a little more, so 150,000 bytes hold two: own + "!!" evicts own + "!" (the
        # least recently used: own was asked again), both kept ones are found, and own + "!" is compiled again
        third = {"messages": hi, "chat_template": own + "!!"}
        budget = ("--request-chat-template-cache-bytes", "150000")
        for trust in ("off", "on"):
            with self.subTest(trust=trust):
                flag = ("--trust-request-chat-template", trust)
                p, d = (self.start(t.sim("--role", role, "--tokenizer", model_dir("llama3_1"), *flag))
                        for role in ("prefill", "decode"))
                r = self.start(t.router([p], [d], "--tokenizer", model_dir("llama3_1"), "--access-log", "json", *flag,
                                        *budget))
                if trust == "on":
                    reqs = [reqs[0], reqs[1], reqs[0], third, reqs[0], third, reqs[1]]
                for q in reqs:
                    st, out = self.chat(r.port, q)
                    if trust == "off":
                        self.assertEqual(st, 400, out)
                        self.assertIn("Refused request with untrusted chat template", out["error"]["message"])
                    else:
                        self.assertEqual(st, 200, out)
                fb = t.metric(r.port, 'xpyd_tokenizer_fallbacks_total{reason="request_template"}')
                self.assertEqual(fb, 2 if trust == "off" else 0)
                kept = [t.metric(r.port, "xpyd_tokenizer_request_templates_%s_total" % k) for k in ("kept", "compiled")]
                self.assertEqual(kept, [3, 4] if trust == "on" else [0, 0])
                held = t.metric(r.port, "xpyd_tokenizer_request_template_cache_bytes")  # own + "!" and own + "!!"
                self.assertTrue(2 * 65536 < held <= 150000 if trust == "on" else held == 0, held)
                if trust == "on":
                    texts = theirs(template_of("llama3_1"), specials("llama3_1"), reqs)  # (the oracle: untrusted)
                    self.assertTrue(all(isinstance(x, dict) for x in texts))
                    texts = oracle_cache.jinja_renders([{"template": template_of("llama3_1"),
                                                         "special": specials("llama3_1"), "request": q, "trust": True}
                                                        for q in reqs])
                    self.assertTrue(texts[1].endswith("!"), texts[1])
                    want = [len(ids) for ids in oracle("llama3_1", texts)]
                    t.wait_until(lambda: len(access_lines(r)) == len(reqs), what="access lines")
                    self.assertEqual([(l["prompt_tokens"], l["prompt_src"]) for l in access_lines(r)],
                                     [(n, "tokenizer") for n in want])
                    self.assertEqual(t.metric(r.port, "xpyd_tokenizer_mismatch_total"), 0)  # the sims counted the same
                    # one that does not compile: the estimate counts it, the engine answers it
                    st, out = self.chat(r.port, {"messages": hi, "chat_template": "{% for %}"})
                    self.assertEqual(st, 400, out)
                    self.assertEqual(t.metric(r.port, 'xpyd_tokenizer_fallbacks_total{reason="render"}'), 1)
                    # four templates at once on two tokenizer threads, the budget holding two: kept ones evicted
                    # while another request renders with them (each render holds its own reference)
                    many = [{"messages": hi, "chat_template": own + "?" * (k % 4)} for k in range(24)]
                    with concurrent.futures.ThreadPoolExecutor(8) as pool:
                        sts = list(pool.map(lambda q: self.chat(r.port, q)[0], many))
                    self.assertEqual(sts, [200] * 24)
                    kept = [t.metric(r.port, "xpyd_tokenizer_request_templates_%s_total" % k)
                            for k in ("kept", "compiled")]
                    self.assertEqual(sum(kept), len(reqs) + 1 + 24)
                    self.assertEqual(t.metric(r.port, "xpyd_tokenizer_mismatch_total"), 0)
                t.wait_until(lambda: t.router_idle(r.port), what="the router idle")
                for proc in (r, p, d):
                    proc.stop()

    def test_a_render_over_its_step_bound_keeps_the_estimate(self):
        p, d = (self.start(t.sim("--role", role)) for role in ("prefill", "decode"))
        r = self.start(t.router([p], [d], "--tokenizer", model_dir("llama3_1"), "--access-log", "json",
                                "--tokenizer-render-max-steps", "1000"))
        short = [{"role": "user", "content": "hi"}]
        long = [{"role": ("user", "assistant")[i % 2], "content": "turn %d" % i} for i in range(101)]
        for msgs in (short, long, short):
            st, out = self.chat(r.port, {"messages": msgs})
            self.assertEqual(st, 200, out)  # (the engine answers what the router could only estimate)
        # the long one estimated, then corrected by the engine's usage; the same on one keep-alive connection
        c = t.RawConn(r.port)
        for msgs in (long, short):
            body = json.dumps({"model": "sim-model", "max_tokens": 2, "messages": msgs}).encode()
            c.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            self.assertEqual(c.response()[0], 200)
        c.close()
        t.wait_until(lambda: len(access_lines(r)) == 5, what="five access lines")
        self.assertEqual([l["prompt_src"] for l in access_lines(r)],
                         ["tokenizer", "engine", "tokenizer", "engine", "tokenizer"])
        self.assertEqual(t.metric(r.port, 'xpyd_tokenizer_fallbacks_total{reason="render"}'), 2)
        t.wait_until(lambda: t.router_idle(r.port), what="the router idle")

    def test_a_model_without_a_template_keeps_the_estimate_for_chat(self):
        p, d = (self.start(t.sim("--role", role, "--tokenizer", model_dir("llama2"))) for role in ("prefill", "decode"))
        r = self.start(t.router([p], [d], "--tokenizer", model_dir("llama2")))
        self.assertIn("no chat template the router can render", r.output())
        st, out = self.chat(r.port, {"messages": [{"role": "user", "content": "hi"}]})
        self.assertEqual(st, 200, out)
        self.assertEqual(t.metric(r.port, 'xpyd_tokenizer_fallbacks_total{reason="template"}'), 1)
        st, out = completion(r.port, {"prompt": "still exact"})
        self.assertEqual(t.metric(r.port, "xpyd_tokenizer_prompts_total"), 1)


if __name__ == "__main__":
    t.main()
