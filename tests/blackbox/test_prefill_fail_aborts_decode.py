# SPDX-License-Identifier: Apache-2.0
"""PD failure semantics, both directions. SGLang bootstrap: both legs start at once, so when the prefill fails
the router aborts the decode (POST /abort_request {"rid"}) instead of leaving it waiting for KV that never
comes. kv-params: when the prefill answered but no decode took its KV (every decode attempt failed), the
router dispatches the request to a decode and cancels it at once, so the prefill's KV is freed now rather
than when its lease expires."""
import xpyd_testlib as t

CMPL = {"prompt": "a b c d", "max_tokens": 4}


class BootstrapPrefillFailure(t.TestCase):
    def test_prefill_error_aborts_decode(self):
        p = self.start(t.sim("--role", "prefill", "--handoff", "bootstrap", "--status-code", "500"))
        d = self.start(t.sim("--role", "decode", "--handoff", "bootstrap", "--handoff-timeout-ms", "60000"))
        r = self.start(t.router([p], [d.port], "--handoff", "bootstrap", "--max-retries", "0"))
        st, _, out = t.post_json(r.port, "/v1/completions", CMPL)
        self.assertOpenAIError(st, out, 500, "injected")
        # /abort_request was sent, and the decode leg closed once written: whichever reached the decode first,
        # it holds nothing now (its rendezvous would otherwise wait 60 s)
        t.wait_until(lambda: t.metric(d.port, "xpyd_sim:abort_request_calls_total") == 1, what="abort sent")
        t.wait_until(lambda: t.metric(d.port, "vllm:num_requests_running") == 0 and
                     t.metric(d.port, "vllm:num_requests_waiting") == 0, timeout=5, what="decode holds nothing")
        self.idle(r)

    def test_prefill_down_aborts_decode_each_attempt(self):
        dead = t.free_port()
        d = self.start(t.sim("--role", "decode", "--handoff", "bootstrap", "--handoff-timeout-ms", "60000"))
        r = self.start(t.router([dead], [d.port], "--handoff", "bootstrap", "--max-retries", "0"))
        st, _, out = t.post_json(r.port, "/v1/completions", CMPL)
        self.assertOpenAIError(st, out, 502, "prefill 127.0.0.1:%d failed" % dead)
        # /abort_request was sent, and the decode leg closed once written: whichever reached the decode first,
        # it holds nothing now (its rendezvous would otherwise wait 60 s)
        t.wait_until(lambda: t.metric(d.port, "xpyd_sim:abort_request_calls_total") == 1, what="abort sent")
        t.wait_until(lambda: t.metric(d.port, "vllm:num_requests_running") == 0 and
                     t.metric(d.port, "vllm:num_requests_waiting") == 0, timeout=5, what="decode holds nothing")
        self.idle(r)


class KvParamsDecodeFailure(t.TestCase):
    def check_released(self, p, r, failures):
        t.wait_until(lambda: t.metric(p.port, "xpyd_sim:kv_leases_active") == 0, timeout=5,
                     what="prefill KV freed well before its 60 s lease")
        self.assertEqual(t.metric(p.port, "xpyd_sim:kv_leases_expired_total"), 0)
        self.assertEqual(t.metric(r.port, "xpyd_kv_release_dispatches_total"), failures)
        self.idle(r)

    def test_decode_error_frees_prefill_kv(self):
        p = self.start(t.sim("--role", "prefill", "--kv-lease-ms", "60000"))
        bad = self.start(t.sim("--role", "decode", "--status-code", "503"))
        good = self.start(t.sim("--role", "decode"))
        r = self.start(t.router([p.port], [bad.port, good.port], "--decode-policy", "rr", "--max-retries", "0",
                                "--eject-after-failures", "0"))
        codes = sorted(t.post_json(r.port, "/v1/completions", CMPL)[0] for _ in range(4))
        self.assertEqual(codes, [200, 200, 503, 503])
        self.check_released(p, r, 2)
        # the release went to the decode that had not failed, as a request it saw cancelled
        t.wait_until(lambda: t.metric(good.port, "xpyd_sim:requests_total") == 4, what="dispatches seen")

    def test_decode_down_frees_prefill_kv(self):
        p = self.start(t.sim("--role", "prefill", "--kv-lease-ms", "60000"))
        good = self.start(t.sim("--role", "decode"))
        dead = t.free_port()
        r = self.start(t.router([p.port], [dead, good.port], "--decode-policy", "rr", "--max-retries", "0",
                                "--eject-after-failures", "0"))
        codes = sorted(t.post_json(r.port, "/v1/completions", CMPL)[0] for _ in range(2))
        self.assertEqual(codes, [200, 502])
        self.check_released(p, r, 1)

    def test_success_dispatches_nothing(self):
        p = self.start(t.sim("--role", "prefill"))
        d = self.start(t.sim("--role", "decode"))
        r = self.start(t.router([p.port], [d.port]))
        for _ in range(3):
            self.assertEqual(t.post_json(r.port, "/v1/completions", CMPL)[0], 200)
        self.check_released(p, r, 0)
        self.assertEqual(t.metric(d.port, "xpyd_sim:requests_total"), 3)


class HandoffFailuresCounted(t.TestCase):
    """xpyd_kv_handoff_failures_total counts a decode that failed while a prefill's KV was meant for it, in every
    handoff mode that has a prefill leg; a prefill failure, or a success, is not one."""
    MODES = ["kv-params", "xpyd", "store", "bootstrap", "mooncake"]

    def cluster(self, mode, prefill_args=(), decode_args=(), router_args=()):
        extra = []
        if mode == "store":
            store = t.tmpdir(prefix="xpyd-store-")
            extra = ["--store-dir", store, "--store-wait-ms", "2000"]
        pargs = ["--role", "prefill", "--handoff", mode, "--kv-lease-ms", "60000"] + extra + list(prefill_args)
        rargs = ["--handoff", mode, "--max-retries", "0"] + list(router_args)
        if mode == "mooncake":
            bport = t.free_port()
            pargs += ["--bootstrap-port", str(bport)]
            rargs += ["--prefill-bootstrap-port", str(bport)]
        p = self.start(t.sim(*pargs))
        d = self.start(t.sim("--role", "decode", "--handoff", mode, "--handoff-timeout-ms", "5000", *extra,
                             *decode_args))
        r = self.start(t.router([p] if mode == "bootstrap" else [p.port], [d.port], *rargs))
        return p, d, r

    def test_each_mode_counts_a_failed_decode(self):
        for mode in self.MODES:
            with self.subTest(mode=mode):
                _, _, r = self.cluster(mode, decode_args=("--status-code", "503"))
                st, _, out = t.post_json(r.port, "/v1/completions", CMPL)
                self.assertOpenAIError(st, out, 503, "injected")
                self.assertEqual(t.metric(r.port, "xpyd_kv_handoff_failures_total"), 1)
                self.assertEqual(t.metric_sum(
                    r.port, 'xpyd_instance_errors_total{role="decode",cause="status"}'), 1)
                self.assertEqual(t.metric(r.port, 'xpyd_request_outcomes_total{endpoint="/v1/completions",'
                                                  'outcome="error"}'), 1)
                t.wait_until(lambda: t.router_idle(r.port), what="router load back to zero")

    def test_a_prefill_failure_or_a_success_is_not_a_handoff_failure(self):
        for mode in self.MODES:
            with self.subTest(mode=mode):
                _, _, r = self.cluster(mode, prefill_args=("--status-code", "500"),
                                       router_args=("--prefill-fallback", "off"))
                st, _, out = t.post_json(r.port, "/v1/completions", CMPL)
                self.assertOpenAIError(st, out, 500, "injected")
                _, _, ok = self.cluster(mode)
                self.assertEqual(t.post_json(ok.port, "/v1/completions", CMPL)[0], 200)
                for router in (r, ok):
                    self.assertEqual(t.metric(router.port, "xpyd_kv_handoff_failures_total"), 0)
                    t.wait_until(lambda: t.router_idle(router.port), what="router load back to zero")


if __name__ == "__main__":
    t.main()
