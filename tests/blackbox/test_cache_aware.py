# SPDX-License-Identifier: Apache-2.0
"""Cache-aware placement, end to end through the router and sims with vLLM-style prefix caching:
 - policy `cache`: a repeated prefix goes back to the prefill that holds it (the engine reports the hit in
   usage.prompt_tokens_details.cached_tokens, the router exports prediction and truth) until that rank is full
   (max_inflight), then another takes it; a removed rank's entries are dropped (back, it starts cold);
 - xpyd_sim's cache itself: hits counted as vLLM counts them, cache_config_info, serial prefill;
 - session affinity (--session-key): one session, one rank; a rank removal moves only its own sessions;
 - conditional disaggregation: a short prompt is computed by the decode alone (no prefill leg), a long one
   goes through the prefill; "when busy" too; counters and the access log say which;
 - bad settings refused; every load back to zero."""
import json
import os
import subprocess
import threading

import xpyd_testlib as t

ADMIN = {"Authorization": "Bearer adm"}
PREFIX = " ".join("w%d" % i for i in range(400))  # 400 tokens on the sim (one per word)
CACHE = ("--prefix-caching", "on")


def completion(port, prompt, max_tokens=2, headers=None):
    st, _, out = t.post_json(port, "/v1/completions", {"prompt": prompt, "max_tokens": max_tokens,
                                                       "ignore_eos": True}, headers=headers)
    assert st == 200, out
    return out


def selected(port, role, sim_port):
    return t.metric(port, 'xpyd_instance_selected_total{role="%s",engine="127.0.0.1:%d",dp_rank="0"}'
                    % (role, sim_port), default=0)  # a removed rank is not listed


def access_lines(r):
    return [json.loads(l) for l in r.output().splitlines() if l.startswith("{")]


class SimPrefixCache(t.TestCase):
    def test_hits_as_vllm_counts_them(self):
        s = self.start(t.sim("--role", "both", "--block-size", "16", "--num-gpu-blocks", "100", *CACHE))
        out = completion(s.port, PREFIX + " one")
        self.assertEqual(out["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
        out = completion(s.port, PREFIX + " two")  # 401 tokens: 25 full blocks shared
        self.assertEqual(out["usage"]["prompt_tokens_details"]["cached_tokens"], 400)
        out = completion(s.port, PREFIX)  # all 400 cached, but one token is always computed
        self.assertEqual(out["usage"]["prompt_tokens_details"]["cached_tokens"], 384)
        self.assertEqual(t.metric(s.port, 'vllm:prefix_cache_queries_total{engine="0",model_name="sim-model"}'),
                         401 + 401 + 400)
        self.assertEqual(t.metric(s.port, 'vllm:prefix_cache_hits_total{engine="0",model_name="sim-model"}'), 784)
        self.assertEqual(t.metric(s.port, 'vllm:cache_config_info{block_size="16",enable_prefix_caching="True",'
                                          'num_gpu_blocks="100"}'), 1)
        # capacity: 100 blocks; another 100 blocks of other words evict the prefix
        completion(s.port, " ".join("x%d" % i for i in range(1600)))
        out = completion(s.port, PREFIX + " three")
        self.assertEqual(out["usage"]["prompt_tokens_details"]["cached_tokens"], 0)

    def test_off_by_default(self):
        s = self.start(t.sim("--role", "both"))
        completion(s.port, PREFIX)
        out = completion(s.port, PREFIX)
        self.assertEqual(out["usage"]["prompt_tokens_details"]["cached_tokens"], 0)


class CachePolicy(t.TestCase):
    def cluster(self, nprefill=3, *args, pargs=()):
        ps = [self.start(t.sim("--role", "prefill", *CACHE, *pargs)) for _ in range(nprefill)]
        d = self.start(t.sim("--role", "decode", *CACHE, "--decode-us-per-token", "100"))
        r = self.start(t.router([p.port for p in ps], [d.port], "--prefill-policy", "cache", "--admin-key", "adm",
                                *args))
        return ps, d, r

    def test_repeated_prefix_goes_where_it_is_cached(self):
        ps, d, r = self.cluster()
        completion(r.port, "other " * 300)  # another prompt first: rotation would send the next one elsewhere
        for k in range(6):
            out = completion(r.port, PREFIX + " q%d" % k)
            if k:
                self.assertEqual(out["usage"]["prompt_tokens_details"]["cached_tokens"], 400, out)
        counts = sorted(selected(r.port, "prefill", p.port) for p in ps)
        self.assertEqual(counts, [0, 1, 6])  # the six with the prefix went to one rank
        pred = t.metric(r.port, 'xpyd_prefix_predicted_tokens_total{role="prefill"}')
        truth = t.metric(r.port, 'xpyd_prefix_cached_tokens_total{role="prefill"}')
        self.assertEqual(truth, 5 * 400)
        self.assertGreater(pred, 0)
        self.assertGreater(t.metric(r.port, 'xpyd_prefix_index_bytes{role="prefill"}'), 0)
        self.assertEqual(t.metric(r.port, 'xpyd_prefix_index_bytes{role="decode"}'), 0)  # lot there: no index
        self.idle(r)

    def test_until_the_rank_is_full_then_another(self):
        # prefills that hold each request 1 s, at most one request each: while the cached rank holds one, the next
        # goes elsewhere (the two are sent together; a cached prompt alone would finish too fast to overlap)
        ps, d, r = self.cluster(2, "--prefill-max-inflight", "1", pargs=("--stall-ms", "1000"))
        completion(r.port, PREFIX + " warm")
        home = [p for p in ps if selected(r.port, "prefill", p.port) == 1][0]
        other = [p for p in ps if p is not home][0]
        outs = []
        ths = [threading.Thread(target=lambda k=k: outs.append(completion(r.port, PREFIX + " c%d" % k)))
               for k in range(2)]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        self.assertEqual(selected(r.port, "prefill", home.port), 2)
        self.assertEqual(selected(r.port, "prefill", other.port), 1)
        self.assertEqual(sorted(o["usage"]["prompt_tokens_details"]["cached_tokens"] for o in outs), [0, 400])
        self.idle(r)

    def test_removed_rank_entries_dropped(self):
        ps, d, r = self.cluster(1)
        completion(r.port, PREFIX + " a")
        completion(r.port, PREFIX + " b")
        before = t.metric(r.port, 'xpyd_prefix_predicted_tokens_total{role="prefill"}')
        self.assertGreater(before, 0)
        st, _, out = t.request(r.port, "DELETE", "/admin/instances/prefill/127.0.0.1:%d" % ps[0].port, headers=ADMIN)
        self.assertEqual(st, 200, out)
        st, _, out = t.request(r.port, "POST", "/admin/instances",
                               {"role": "prefill", "host": "127.0.0.1", "port": ps[0].port}, headers=ADMIN)
        self.assertEqual(st, 201, out)
        completion(r.port, PREFIX + " c")  # the engine still has it, but the router no longer predicts it
        self.assertEqual(t.metric(r.port, 'xpyd_prefix_predicted_tokens_total{role="prefill"}'), before)
        completion(r.port, PREFIX + " d")  # recorded again at that dispatch
        self.assertGreater(t.metric(r.port, 'xpyd_prefix_predicted_tokens_total{role="prefill"}'), before)
        self.idle(r)

    def test_engine_cache_size_from_its_metrics(self):
        # the sim's cache holds 30 blocks of 16 tokens: two 400-token prompts do not fit together. With engine
        # scraping on, the router sizes its index the same (vllm:cache_config_info num_gpu_blocks x block_size),
        # so after B it no longer predicts A cached; without scraping (its own 8192 blocks) it still does.
        a, b = PREFIX, " ".join("v%d" % i for i in range(400))

        def predicted_a_again(*flags):
            p = self.start(t.sim("--role", "prefill", *CACHE, "--num-gpu-blocks", "30"))
            d = self.start(t.sim("--role", "decode", "--decode-us-per-token", "100"))
            r = self.start(t.router([p.port], [d.port], "--prefill-policy", "cache", *flags))
            cap = 'xpyd_instance_prefix_capacity_blocks{role="prefill",engine="127.0.0.1:%d",dp_rank="0"}' % p.port
            if flags:  # the engine's 30 blocks of 16 tokens, in the router's 16-token blocks
                t.wait_until(lambda: t.metric(r.port, cap) == 30, what="engine cache size scraped")
            else:
                self.assertEqual(t.metric(r.port, cap), 8192)
            completion(r.port, a + " x")
            completion(r.port, b + " y")
            before = t.metric(r.port, 'xpyd_prefix_predicted_tokens_total{role="prefill"}')
            completion(r.port, a + " z")
            self.idle(r)
            return t.metric(r.port, 'xpyd_prefix_predicted_tokens_total{role="prefill"}') - before

        self.assertGreater(predicted_a_again(), 300)
        self.assertLess(predicted_a_again("--scrape-interval-ms", "50"), 100)

    def test_chat_turns_are_prefixes(self):
        ps, d, r = self.cluster()
        msgs = [{"role": "system", "content": PREFIX}, {"role": "user", "content": "hello there"}]
        for turn in range(4):
            st, _, out = t.post_json(r.port, "/v1/chat/completions", {"messages": msgs, "max_tokens": 3})
            self.assertEqual(st, 200, out)
            msgs = msgs + [{"role": "assistant", "content": out["choices"][0]["message"]["content"]},
                           {"role": "user", "content": "and then %d" % turn}]
        self.assertEqual(sorted(selected(r.port, "prefill", p.port) for p in ps), [0, 0, 4])
        self.assertGreater(t.metric(r.port, 'xpyd_prefix_cached_tokens_total{role="prefill"}'), 3 * 400)
        self.idle(r)


class SessionAffinity(t.TestCase):
    def test_sticky_and_only_the_removed_ranks_sessions_move(self):
        p = self.start(t.sim("--role", "prefill"))
        ds = [self.start(t.sim("--role", "decode", "--decode-us-per-token", "100")) for _ in range(3)]
        r = self.start(t.router([p.port], [d.port for d in ds], "--session-key", "header:X-Session-Id",
                                "--access-log", "json", "--admin-key", "adm"))

        def where(sid):
            before = {d.port: selected(r.port, "decode", d.port) for d in ds}
            completion(r.port, "hello", headers={"X-Session-Id": sid})
            moved = [port for port in before if selected(r.port, "decode", port) > before[port]]
            self.assertEqual(len(moved), 1)
            return moved[0]

        sessions = ["s%d" % i for i in range(24)]
        home = {s: where(s) for s in sessions}
        self.assertGreater(len(set(home.values())), 1)  # spread over the ranks
        for s in sessions:
            self.assertEqual(where(s), home[s])
        gone = ds[0].port
        st, _, out = t.request(r.port, "DELETE", "/admin/instances/decode/127.0.0.1:%d" % gone, headers=ADMIN)
        self.assertEqual(st, 200, out)
        for s in sessions:
            w = where(s)
            self.assertNotEqual(w, gone)
            if home[s] != gone:
                self.assertEqual(w, home[s], s)
        self.assertGreater(t.metric(r.port, 'xpyd_session_affinity_total{role="decode"}'), 0)
        # no session: the policy places it
        completion(r.port, "hello")
        self.idle(r)

    def test_body_key(self):
        p = self.start(t.sim("--role", "prefill"))
        ds = [self.start(t.sim("--role", "decode", "--decode-us-per-token", "100")) for _ in range(4)]
        r = self.start(t.router([p.port], [d.port for d in ds], "--session-key", "body:user"))
        for _ in range(5):
            st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "x", "max_tokens": 1, "user": "alice"})
            self.assertEqual(st, 200, out)
        self.assertEqual(sorted(selected(r.port, "decode", d.port) for d in ds), [0, 0, 0, 5])
        self.idle(r)

    def test_bad_session_key_refused(self):
        for bad in ("cookie:x", "header:", "user"):
            rr = t.Proc("xpyd_router", ["--port", "0", "-p", "127.0.0.1:1", "-d", "127.0.0.1:2", "--session-key", bad],
                        port_flag=False)
            self.assertNotEqual(rr.p.wait(10), 0)
            rr.stop(check=False)
            self.assertIn("--session-key must be header:NAME or body:FIELD", rr.output())


class LocalPrefill(t.TestCase):
    def test_short_local_long_remote(self):
        p = self.start(t.sim("--role", "prefill", *CACHE))
        d = self.start(t.sim("--role", "decode", *CACHE, "--decode-us-per-token", "100"))
        r = self.start(t.router([p.port], [d.port], "--local-prefill-max-tokens", "100", "--access-log", "json"))
        out = completion(r.port, "short prompt here", 4)
        self.assertEqual(out["usage"]["completion_tokens"], 4)
        self.assertEqual(t.metric(p.port, "xpyd_sim:requests_total"), 0)  # no prefill leg at all
        completion(r.port, PREFIX, 4)  # 400 uncached tokens: remote
        self.assertEqual(t.metric(p.port, "xpyd_sim:requests_total"), 1)
        # the decode received that prompt's KV and caches it: the same prefix is now mostly cached there
        completion(r.port, PREFIX + " more words", 4)
        self.assertEqual(t.metric(p.port, "xpyd_sim:requests_total"), 1)
        self.assertEqual(t.metric(r.port, 'xpyd_pd_decisions_total{decision="local_prefill"}'), 2)
        self.assertEqual(t.metric(r.port, 'xpyd_pd_decisions_total{decision="remote_prefill"}'), 1)
        # the text is what the decode alone gives
        ref = t.post_json(d.port, "/v1/completions", {"prompt": "short prompt here", "max_tokens": 4,
                                                      "ignore_eos": True})[2]
        self.assertEqual(out["choices"][0]["text"], ref["choices"][0]["text"])
        self.idle(r)
        r.stop()
        self.assertEqual([l["pd"] for l in access_lines(r)], ["local", "remote", "local"])

    def test_when_busy(self):
        p = self.start(t.sim("--role", "prefill", "--stall-ms", "1500"))
        d = self.start(t.sim("--role", "decode", "--decode-us-per-token", "100"))
        r = self.start(t.router([p.port], [d.port], "--prefill-max-inflight", "1",
                                "--local-prefill-when-busy-tokens", "1000"))
        slow = threading.Thread(target=lambda: completion(r.port, "first one", 2))
        slow.start()
        t.wait_until(lambda: t.metric(r.port, 'xpyd_instance_inflight_requests{role="prefill",engine='
                                              '"127.0.0.1:%d",dp_rank="0"}' % p.port) == 1, what="prefill busy")
        completion(r.port, "second one", 2)  # the only prefill is full: the decode computes it
        self.assertEqual(t.metric(r.port, 'xpyd_pd_decisions_total{decision="local_prefill"}'), 1)
        slow.join()
        completion(r.port, PREFIX * 3, 2)  # prefill free again: remote even above the busy threshold
        self.assertEqual(t.metric(r.port, 'xpyd_pd_decisions_total{decision="remote_prefill"}'), 2)
        self.idle(r)

    def test_not_in_bootstrap_mode(self):
        # its decode cannot run alone: the flag would do nothing, so the router refuses it at start
        for flag in ("--local-prefill-max-tokens", "--local-prefill-when-busy-tokens"):
            out = subprocess.run([os.path.join(t.BIN, "xpyd_router"), "--dry-run", "-p", "10.0.0.1:8100", "-d",
                                  "10.0.0.2:8200", "--handoff", "bootstrap", flag, "1000"],
                                 capture_output=True, text=True, timeout=30)
            self.assertEqual(out.returncode, 2, out.stdout)
            self.assertIn("%s does nothing with --handoff bootstrap" % flag, out.stderr)


if __name__ == "__main__":
    t.main()
