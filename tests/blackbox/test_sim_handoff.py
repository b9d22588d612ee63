# SPDX-License-Identifier: Apache-2.0
"""xpyd_sim handoff modes driven by the test itself (kv-params, store, bootstrap, mooncake), forged and expired
params, abort_request, and data-parallel ranks (external and internal)."""
import json
import shutil
import threading

import xpyd_testlib as t

PROMPT = "the quick brown fox jumps over the lazy dog"


def prefill_kv(port, rid="req-1", prompt=PROMPT):
    st, _, body = t.post_json(port, "/v1/completions",
                              {"prompt": prompt, "max_tokens": 1, "stream": False,
                               "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False,
                                                      "remote_engine_id": None, "remote_block_ids": None,
                                                      "remote_host": None, "remote_port": None}},
                              headers={"X-Request-Id": rid})
    assert st == 200, body
    return body


class KvParams(t.TestCase):
    def setUp(self):
        super().setUp()
        self.p = self.start(t.sim("--role", "prefill", "--kv-lease-ms", "60000"))
        self.d = self.start(t.sim("--role", "decode", "--decode-us-per-token", "100"))

    def test_prefill_params_accepted_by_decode(self):
        pre = prefill_kv(self.p.port)
        kv = pre["kv_transfer_params"]
        for k in ["remote_block_ids", "remote_engine_id", "remote_request_id", "remote_host", "remote_port",
                  "tp_size"]:
            self.assertIn(k, kv)
        self.assertTrue(kv["do_remote_prefill"])
        self.assertEqual(kv["remote_request_id"], "req-1")
        self.assertEqual(t.metric(self.p.port, "xpyd_sim:kv_leases_active"), 1)
        payloads = t.Stream(self.d.port, "/v1/completions",
                            {"prompt": PROMPT, "max_tokens": 4, "stream": True,
                             "stream_options": {"include_usage": True}, "kv_transfer_params": kv}).read_all()
        content = t.content_events(payloads)
        self.assertEqual(len(content), 4)
        # greedy: the prefill's one token is the decode's first token
        self.assertEqual(content[0]["choices"][0]["text"], pre["choices"][0]["text"])
        usage = json.loads(payloads[-2])["usage"]
        self.assertEqual(usage["prompt_tokens_details"]["cached_tokens"], 9)  # decode's (wrong) view
        pm, dm = t.metrics(self.p.port), t.metrics(self.d.port)
        self.assertEqual(pm["xpyd_sim:kv_leases_active"], 0)
        self.assertEqual(pm["xpyd_sim:kv_leases_released_total"], 1)
        self.assertEqual(dm['xpyd_sim:handoffs_total{mode="kv-params",result="done"}'], 1)
        self.assertEqual(dm["xpyd_sim:kv_bytes_received_total"], 9 * 64)
        # the decode computed no prefill itself
        self.assertEqual(dm["vllm:prompt_tokens_total"], 0)

    def test_forged_params_rejected(self):
        kv = prefill_kv(self.p.port)["kv_transfer_params"]
        for field, value in [("remote_engine_id", "someone-else"), ("remote_block_ids", [999]),
                             ("remote_request_id", "never-issued")]:
            forged = dict(kv, **{field: value})
            st, _, body = t.post_json(self.d.port, "/v1/completions",
                                      {"prompt": PROMPT, "max_tokens": 2, "kv_transfer_params": forged})
            self.assertOpenAIError(st, body, 400, "kv_transfer_params rejected")
        self.assertEqual(t.metric(self.d.port, 'xpyd_sim:handoffs_total{mode="kv-params",result="failed"}'), 3)
        # a prompt other than the one prefilled fails the integrity check, and the lease is consumed
        st, _, body = t.post_json(self.d.port, "/v1/completions",
                                  {"prompt": "another prompt", "max_tokens": 2, "kv_transfer_params": kv})
        self.assertOpenAIError(st, body, 500, "integrity check failed")
        self.assertEqual(t.metric(self.p.port, "xpyd_sim:kv_leases_active"), 0)
        # pulling twice: the second pull finds nothing
        st, _, body = t.post_json(self.d.port, "/v1/completions",
                                  {"prompt": PROMPT, "max_tokens": 2, "kv_transfer_params": kv})
        self.assertOpenAIError(st, body, 400, "already pulled")

    def test_roles_enforced(self):
        st, _, body = t.post_json(self.p.port, "/v1/completions",
                                  {"prompt": "a", "kv_transfer_params": {
                                      "do_remote_prefill": True, "remote_engine_id": "e", "remote_request_id": "r",
                                      "remote_host": "127.0.0.1", "remote_port": 1, "remote_block_ids": []}})
        self.assertOpenAIError(st, body, 400, "KV producer")

    def test_unreachable_prefill(self):
        kv = prefill_kv(self.p.port)["kv_transfer_params"]
        kv["remote_port"] = t.free_port()
        st, _, body = t.post_json(self.d.port, "/v1/completions",
                                  {"prompt": PROMPT, "max_tokens": 2, "kv_transfer_params": kv})
        self.assertOpenAIError(st, body, 500, "could not reach the prefill engine")


class KvLeaseExpiry(t.TestCase):
    def test_expired_lease_is_counted_and_rejected(self):
        p = self.start(t.sim("--role", "prefill", "--kv-lease-ms", "100"))
        d = self.start(t.sim("--role", "decode"))
        kv = prefill_kv(p.port)["kv_transfer_params"]
        t.wait_until(lambda: t.metric(p.port, "xpyd_sim:kv_leases_expired_total") == 1, what="lease expiry")
        self.assertEqual(t.metric(p.port, "xpyd_sim:kv_leases_active"), 0)
        st, _, body = t.post_json(d.port, "/v1/completions",
                                  {"prompt": PROMPT, "max_tokens": 2, "kv_transfer_params": kv})
        self.assertOpenAIError(st, body, 400, "expired")


class Store(t.TestCase):
    def test_store_hit_and_recompute(self):
        d = t.tmpdir(prefix="xpyd-store-")
        self.addCleanup(shutil.rmtree, d, True)
        p = self.start(t.sim("--role", "prefill", "--handoff", "store", "--store-dir", d))
        dec = self.start(t.sim("--role", "decode", "--handoff", "store", "--store-dir", d,
                               "--store-wait-ms", "50", "--decode-us-per-token", "100"))
        st, _, pre = t.post_json(p.port, "/v1/completions", {"prompt": PROMPT, "max_tokens": 1})
        self.assertEqual(st, 200)
        st, _, out = t.post_json(dec.port, "/v1/completions", {"prompt": PROMPT, "max_tokens": 3})
        self.assertEqual(st, 200, out)
        self.assertTrue(out["choices"][0]["text"].startswith(pre["choices"][0]["text"]))
        m = t.metrics(dec.port)
        self.assertEqual(m['xpyd_sim:handoffs_total{mode="store",result="done"}'], 1)
        self.assertEqual(m["vllm:prompt_tokens_total"], 0)
        # never prefilled: the decode waits store-wait-ms, then recomputes (and says so)
        st, _, out = t.post_json(dec.port, "/v1/completions", {"prompt": "not in the store", "max_tokens": 2})
        self.assertEqual(st, 200, out)
        m = t.metrics(dec.port)
        self.assertEqual(m['xpyd_sim:handoffs_total{mode="store",result="recomputed"}'], 1)
        self.assertEqual(m["vllm:prompt_tokens_total"], 4)


class Bootstrap(t.TestCase):
    def setUp(self):
        super().setUp()
        self.p = self.start(t.sim("--role", "prefill", "--handoff", "bootstrap"))
        self.d = self.start(t.sim("--role", "decode", "--handoff", "bootstrap", "--decode-us-per-token", "100",
                                  "--handoff-timeout-ms", "5000"))

    def body(self, room, **kw):
        b = {"prompt": PROMPT, "max_tokens": 3, "bootstrap_host": "127.0.0.1", "bootstrap_port": self.p.bootstrap_port,
             "bootstrap_room": room}
        b.update(kw)
        return b

    def test_concurrent_legs_rendezvous(self):
        result = {}

        def decode():
            result["d"] = t.post_json(self.d.port, "/v1/completions", self.body(4242, rid="r1"))

        th = threading.Thread(target=decode)
        th.start()  # the decode arrives first and waits for the room
        t.wait_until(lambda: t.metric(self.d.port, "vllm:num_requests_running") == 1, what="decode waiting")
        st, _, pre = t.post_json(self.p.port, "/v1/completions", self.body(4242, rid="r1"))
        th.join(10)
        self.assertEqual(st, 200)
        st, _, out = result["d"]
        self.assertEqual(st, 200, out)
        self.assertEqual(len(out["choices"][0]["text"].split()), 3)
        self.assertEqual(t.metric(self.d.port, 'xpyd_sim:handoffs_total{mode="bootstrap",result="done"}'), 1)
        self.assertEqual(t.metric(self.p.port, "xpyd_sim:kv_leases_active"), 0)

    def test_bootstrap_server_is_its_own_listener(self):
        # as SGLang's: the prefill's bootstrap server has a port of its own (the port file's second line), and
        # its HTTP port serves no KV route, so a router that sends the decode to the HTTP port fails
        self.assertIsNotNone(self.p.bootstrap_port)
        self.assertNotEqual(self.p.bootstrap_port, self.p.port)
        self.assertEqual(t.request(self.p.port, "POST", "/kv/pull", "{}")[0], 404)
        self.assertEqual(t.request(self.p.bootstrap_port, "POST", "/kv/pull", "{}")[0], 400)
        self.assertIsNone(self.d.bootstrap_port)  # a decode has none

    def test_abort_request_cancels_waiting_decode(self):
        result = {}
        th = threading.Thread(target=lambda: result.update(
            d=t.post_json(self.d.port, "/v1/completions", self.body(7, rid="victim"))))
        th.start()
        t.wait_until(lambda: t.metric(self.d.port, "vllm:num_requests_running") == 1, what="decode waiting")
        st, _, ab = t.post_json(self.d.port, "/abort_request", {"rid": "victim"})
        self.assertEqual((st, ab["aborted"]), (200, 1))
        th.join(10)
        st, _, out = result["d"]
        self.assertOpenAIError(st, out, 400, "aborted")
        m = t.metrics(self.d.port)
        self.assertEqual(m["vllm:num_requests_running"], 0)
        self.assertEqual(m["xpyd_sim:abort_requests_total"], 1)


class DataParallel(t.TestCase):
    def test_external_ranks_each_serve(self):
        base = t.free_port_range(2)
        p = self.start(t.Proc("xpyd_sim", ["--port", str(base), "--dp-size", "2", "--log-level", "warn"],
                              port_flag=False))
        for i in range(2):
            t.wait_until(lambda: t.request(base + i, "GET", "/health")[0] == 200, what="rank %d" % i)
            st, _, out = t.post_json(base + i, "/v1/completions", {"prompt": "a", "max_tokens": 1})
            self.assertEqual(st, 200)
            m = t.metrics(base + i)
            self.assertEqual(m['xpyd_sim:requests_total{engine="%d",model_name="sim-model"}' % i], 1)
        st, _, out = t.post_json(base, "/v1/completions", {"prompt": "a"}, headers={"X-data-parallel-rank": "1"})
        self.assertOpenAIError(st, out, 400, "out of range")
        p.stop()

    def test_internal_rank_header_pins(self):
        s = self.start(t.sim("--dp-size", "3", "--dp-mode", "internal"))
        for _ in range(2):
            st, _, _ = t.post_json(s.port, "/v1/completions", {"prompt": "a", "max_tokens": 1},
                                   headers={"X-data-parallel-rank": "2"})
            self.assertEqual(st, 200)
        m = t.metrics(s.port)
        self.assertEqual(m['xpyd_sim:requests_total{engine="2",model_name="sim-model"}'], 2)
        self.assertEqual(m['xpyd_sim:requests_total{engine="0",model_name="sim-model"}'], 0)
        # unpinned requests are balanced over idle ranks
        streams = [t.Stream(s.port, "/v1/completions", {"prompt": "a", "max_tokens": 20, "stream": True})
                   for _ in range(3)]
        m = t.metrics(s.port)
        for r in range(3):
            self.assertEqual(m['vllm:num_requests_running{engine="%d",model_name="sim-model"}' % r], 1)
        for st in streams:
            st.read_all()
        st, _, out = t.post_json(s.port, "/v1/completions", {"prompt": "a"}, headers={"X-data-parallel-rank": "3"})
        self.assertOpenAIError(st, out, 400, "out of range")


class Mooncake(t.TestCase):
    """vLLM MooncakeConnector's wire, as a test drives it: /query on the bootstrap port, a prefill keeping KV
    for transfer_id on the pinned rank, a decode claiming it with the engine id, and vLLM-like refusals."""

    def setUp(self):
        super().setUp()
        self.boot = t.free_port()
        self.p = self.start(t.sim("--role", "prefill", "--handoff", "mooncake", "--dp-size", "2", "--dp-mode",
                                  "internal", "--bootstrap-port", str(self.boot), "--kv-lease-ms", "60000"))
        self.d = self.start(t.sim("--role", "decode", "--handoff", "mooncake", "--decode-us-per-token", "100",
                                  "--handoff-timeout-ms", "500"))

    def prefill(self, xfer, rank):
        st, _, out = t.post_json(self.p.port, "/v1/completions",
                                 {"prompt": PROMPT, "max_tokens": 1, "stream": False,
                                  "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False,
                                                         "transfer_id": xfer}},
                                 headers={"X-data-parallel-rank": str(rank)})
        return st, out

    def decode(self, xfer, engine_id, addr=None):
        return t.post_json(self.d.port, "/v1/completions",
                           {"prompt": PROMPT, "max_tokens": 3,
                            "kv_transfer_params": {"do_remote_decode": False, "do_remote_prefill": True,
                                                   "remote_bootstrap_addr": addr or "http://127.0.0.1:%d" % self.boot,
                                                   "remote_engine_id": engine_id, "transfer_id": xfer}})

    def test_query_claim_and_refusals(self):
        st, _, body = t.request(self.boot, "GET", "/query")
        self.assertEqual(st, 200)
        q = json.loads(body)
        self.assertEqual(sorted(q), ["0", "1"])
        ids = [q["0"]["engine_id"], q["1"]["engine_id"]]
        self.assertNotEqual(ids[0], ids[1])
        self.assertEqual(self.prefill("xfer-a", 1)[0], 200)
        self.assertEqual(t.metric(self.p.port, "xpyd_sim:kv_leases_active"), 1)
        # the engine id must be the pinned rank's
        st, _, out = self.decode("xfer-a", ids[0])
        self.assertOpenAIError(st, out, 400, "does not match the engine that produced transfer_id")
        st, _, out = self.decode("xfer-a", ids[1])
        self.assertEqual(st, 200, out)
        self.assertEqual(out["usage"]["completion_tokens"], 3)
        self.assertEqual(out["usage"]["prompt_tokens_details"]["cached_tokens"], 9)  # the whole prompt came over
        self.assertEqual(t.metric(self.p.port, "xpyd_sim:kv_leases_active"), 0)
        # claimed once: a second claim waits, then fails as vLLM's decode does
        st, _, out = self.decode("xfer-a", ids[1])
        self.assertOpenAIError(st, out, 500, "did not produce transfer_id xfer-a within 500 ms")
        # the same transfer_id twice while held
        self.assertEqual(self.prefill("xfer-b", 0)[0], 200)
        st, out = self.prefill("xfer-b", 0)
        self.assertOpenAIError(st, out, 400, "transfer_id is already in use")
        self.assertEqual(t.metric(self.d.port, 'xpyd_sim:handoffs_total{mode="mooncake",result="done"}'), 1)
        self.assertEqual(t.metric(self.d.port, 'xpyd_sim:handoffs_total{mode="mooncake",result="failed"}'), 2)

    def test_bad_fields_are_400(self):
        st, _, out = self.decode("x", "e", addr="127.0.0.1:1")
        self.assertOpenAIError(st, out, 400, "remote_bootstrap_addr")
        st, _, out = t.post_json(self.d.port, "/v1/completions",
                                 {"prompt": "a", "kv_transfer_params": {"do_remote_prefill": True, "transfer_id": 5}})
        self.assertOpenAIError(st, out, 400, "transfer_id must be a non-empty string")
        st, _, out = t.post_json(self.p.port, "/v1/completions",
                                 {"prompt": "a", "kv_transfer_params": {"transfer_id": "x"}})
        self.assertOpenAIError(st, out, 400, "exactly one of do_remote_decode and do_remote_prefill")

    def test_decode_reaches_an_ipv6_style_address(self):
        # remote_bootstrap_addr with a bracketed host parses (the prefill is not there: a clear 500)
        st, _, out = self.decode("x", "e", addr="http://[::1]:%d" % t.free_port())
        self.assertOpenAIError(st, out, 500, "could not reach the prefill engine")


if __name__ == "__main__":
    t.main()
