"""Observability: after N requests of known shape the counters and histogram counts equal what was sent;
each failure path increments its reason; the page passes promtool; the Grafana dashboard only queries
metrics a live router exports; the access log has one line per request."""
import json
import os
import re
import shutil
import subprocess

import xpyd_testlib as t

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


class Counts(t.TestCase):
    def test_counters_match_traffic(self):
        p = self.start(t.sim("--role", "prefill"))
        d = self.start(t.sim("--role", "decode", "--decode-us-per-token", "100"))
        r = self.start(t.router([p.port], [d.port], "--access-log", "json"))
        for _ in range(5):
            t.Stream(r.port, "/v1/completions", {"prompt": "a b c d", "max_tokens": 6, "stream": True}).read_all()
        for _ in range(3):
            st, _, _ = t.post_json(r.port, "/v1/chat/completions",
                                   {"messages": [{"role": "user", "content": "x y"}], "max_tokens": 4})
            self.assertEqual(st, 200)
        t.request(r.port, "POST", "/v1/completions", "{bad")
        m = t.metrics(r.port)
        self.assertEqual(m['xpyd_requests_total{endpoint="/v1/completions",status="200"}'], 5)
        self.assertEqual(m['xpyd_requests_total{endpoint="/v1/chat/completions",status="200"}'], 3)
        self.assertEqual(m['xpyd_requests_total{endpoint="/v1/completions",status="400"}'], 1)
        self.assertEqual(m["xpyd_ttft_seconds_count"], 5)          # streams only
        self.assertEqual(m["xpyd_itl_seconds_count"], 5 * 5)       # gaps between 6 tokens
        self.assertEqual(m["xpyd_e2e_seconds_count"], 8)
        self.assertEqual(m["xpyd_prefill_seconds_count"], 8)
        self.assertEqual(m["xpyd_decode_seconds_count"], 8)
        self.assertEqual(m['xpyd_ttft_seconds_bucket{le="+Inf"}'], 5)
        self.assertEqual(m["xpyd_generation_tokens_total"], 5 * 6 + 3 * 4)
        self.assertEqual(m["xpyd_prompt_tokens_total"], 5 * 4 + 3 * 3)  # exact, from the prefill's usage
        self.assertEqual(m['xpyd_instance_selected_total{role="decode",instance="127.0.0.1:%d",dp_rank="0"}'
                           % d.port], 8)
        self.assertEqual(m["xpyd_active_streams"], 0)
        r.stop()
        lines = [json.loads(l) for l in r.output().splitlines() if l.startswith("{")]
        self.assertEqual(len(lines), 9)
        ok = [l for l in lines if l["status"] == 200]
        self.assertEqual(len(ok), 8)
        for l in ok:
            self.assertEqual(l["prefill"], "127.0.0.1:%d" % p.port)
            self.assertEqual(l["decode"], "127.0.0.1:%d" % d.port)
            self.assertEqual(l["error"], "none")
        bad = [l for l in lines if l["status"] == 400][0]
        self.assertEqual(bad["error"], "bad_request")

    def test_promtool_accepts_the_page(self):
        if not shutil.which("promtool"):
            self.fail("promtool missing: scripts/deps.sh installs Debian's prometheus package")
        p = self.start(t.sim("--role", "prefill"))
        d = self.start(t.sim("--role", "decode", "--dp-size", "2", "--dp-mode", "internal"))
        r = self.start(t.router([p.port], [d.port], "--dp-mode", "internal", "--decode-dp", "2"))
        t.post_json(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 2})
        page = t.request(r.port, "GET", "/metrics")[2]
        out = subprocess.run(["promtool", "check", "metrics"], input=page, capture_output=True)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)  # the router's page: no finding at all
        for port in (p.port, d.port):
            # the sims use vLLM's real names, which contain ':' (a lint finding, valid for Prometheus);
            # anything else promtool says is a defect
            page = t.request(port, "GET", "/metrics")[2]
            out = subprocess.run(["promtool", "check", "metrics"], input=page, capture_output=True)
            other = [l for l in (out.stdout + out.stderr).decode().splitlines()
                     if l and not l.endswith("metric names should not contain ':'")]
            self.assertEqual(other, [])


def reason(port, name):
    return t.metric(port, 'xpyd_request_errors_total{reason="%s"}' % name)


class Reasons(t.TestCase):
    def test_each_failure_path_counts_its_reason(self):
        p = self.start(t.sim("--role", "prefill"))
        d = self.start(t.sim("--role", "decode"))
        # context_too_long: every decode's max_model_len is below prompt + max_tokens
        r = self.start(t.Proc("xpyd_router", ["--port", "0", "--log-level", "error", "--config",
                                              self.cfg(p.port, d.port, 50)]))
        st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 100})
        self.assertOpenAIError(st, out, 503, "max_model_len")
        self.assertEqual(reason(r.port, "context_too_long"), 1)
        st, _, _ = t.request(r.port, "POST", "/v1/completions", "x" * 100)
        self.assertEqual(reason(r.port, "bad_request"), 1)

    def cfg(self, pp, dp, mml):
        path = os.path.join(self._tmp(), "c.json")
        with open(path, "w") as f:
            json.dump({"prefill": {"hosts": [{"host": "127.0.0.1", "port": pp, "max_model_len": mml}]},
                       "decode": {"hosts": [{"host": "127.0.0.1", "port": dp, "max_model_len": mml}]}}, f)
        return path

    def _tmp(self):
        import tempfile
        d = tempfile.mkdtemp(prefix="xpyd-cfg-")
        self.addCleanup(shutil.rmtree, d, True)
        return d

    def test_bad_prefill_answer_and_large_response(self):
        fake = t.FakeEngine(lambda m, path, b: (200, "application/json", b"this is not json"))
        self.addCleanup(fake.stop)
        big = t.FakeEngine(lambda m, path, b: (200, "application/json",
                                               b'{"choices":[{"text":"' + b"x" * 5000 + b'"}]}'))
        self.addCleanup(big.stop)
        d = self.start(t.sim("--role", "decode"))
        r = self.start(t.router([fake.port], [d.port], "--max-retries", "0"))
        st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "a"})
        self.assertOpenAIError(st, out, 502, "not a JSON completion")
        self.assertEqual(reason(r.port, "prefill_bad_response"), 1)
        r2 = self.start(t.router([big.port], [d.port], "--max-response-bytes", "2048"))
        st, _, out = t.post_json(r2.port, "/v1/completions", {"prompt": "a"})
        self.assertOpenAIError(st, out, 502, "--max-response-bytes")
        self.assertEqual(reason(r2.port, "response_too_large"), 1)

    def test_leg_failures(self):
        dead = t.free_port()
        p = self.start(t.sim("--role", "prefill"))
        stall = self.start(t.sim("--role", "prefill", "--stall-ms", "5000"))
        p500 = self.start(t.sim("--role", "prefill", "--status-code", "500"))
        d = self.start(t.sim("--role", "decode"))
        d503 = self.start(t.sim("--role", "decode", "--status-code", "503"))
        dcut = self.start(t.sim("--role", "decode", "--fail-after-tokens", "1"))
        dstall = self.start(t.sim("--role", "decode", "--stall-ms", "5000"))
        cases = [([dead], [d.port], "prefill_connect"), ([stall.port], [d.port], "prefill_timeout"),
                 ([p500.port], [d.port], "prefill_status"), ([p.port], [dead], "decode_connect"),
                 ([p.port], [dstall.port], "decode_timeout"), ([p.port], [d503.port], "decode_status"),
                 ([p.port], [dcut.port], "decode_broken_stream")]
        for ps, ds, why in cases:
            r = self.start(t.router(ps, ds, "--first-token-timeout-ms", "300"))
            t.Stream(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 3, "stream": True}).read_all()
            self.assertEqual(reason(r.port, why), 1, why)
            t.wait_until(lambda: t.router_idle(r.port), what="idle")
            r.stop()

    def test_client_disconnect_counted(self):
        p = self.start(t.sim("--role", "prefill"))
        d = self.start(t.sim("--role", "decode", "--decode-us-per-token", "5000"))
        r = self.start(t.router([p.port], [d.port]))
        st = t.Stream(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 100, "stream": True})
        next(st.events())
        st.close()
        t.wait_until(lambda: reason(r.port, "client_disconnect") == 1, what="counted")
        self.assertEqual(t.metric(r.port, 'xpyd_requests_total{endpoint="/v1/completions",status="499"}'), 1)


class Dashboard(t.TestCase):
    def test_every_queried_metric_exists(self):
        with open(os.path.join(ROOT, "conf", "grafana", "xpyd.json")) as f:
            dash = json.load(f)
        exprs = [tg["expr"] for panel in dash["panels"] for tg in panel.get("targets", [])]
        self.assertGreaterEqual(len(exprs), 6)
        names = set()
        for e in exprs:
            names.update(n for n in re.findall(r"\b(xpyd_[a-z_]+)", e))
        p = self.start(t.sim("--role", "prefill"))
        d = self.start(t.sim("--role", "decode"))
        r = self.start(t.router([p.port], [d.port]))
        t.Stream(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 3, "stream": True}).read_all()
        page = t.request(r.port, "GET", "/metrics")[2].decode()
        series = set(re.findall(r"^([a-z_:]+)", page, re.M))
        for n in sorted(names):
            self.assertIn(n, series, "dashboard queries %s, which /metrics does not export" % n)


if __name__ == "__main__":
    t.main()
