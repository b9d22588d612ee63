# SPDX-License-Identifier: Apache-2.0
"""Observability: after N requests of known shape the counters and histogram counts equal what was sent;
each failure path increments its reason; the page passes promtool; the Grafana dashboard only queries
metrics a live router exports; the access log has one line per request."""
import json
import os
import re
import shutil
import subprocess
import time

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
        self.assertEqual(m['xpyd_instance_selected_total{role="decode",engine="127.0.0.1:%d",dp_rank="0"}'
                           % d.port], 8)
        self.assertEqual(m["xpyd_active_streams"], 0)
        self.assertEqual(m['xpyd_request_outcomes_total{endpoint="/v1/completions",outcome="ok"}'], 5)
        self.assertEqual(m['xpyd_request_outcomes_total{endpoint="/v1/chat/completions",outcome="ok"}'], 3)
        self.assertEqual(m['xpyd_request_outcomes_total{endpoint="/v1/completions",outcome="client_error"}'], 1)
        self.assertEqual(m['xpyd_request_outcomes_total{endpoint="/v1/completions",outcome="error"}'], 0)
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

    def test_an_answer_read_is_already_counted(self):
        """A client that has read its whole answer and then asks /metrics (on a connection another worker
        serves) finds its request counted and nothing of it held: the router counts a request, releases its load
        and frees its body before the answer's last bytes go out. The router runs with a shim that makes a
        thread sleep 20 ms after each socket write, so whatever it did after the answer's write would still be
        undone when the client looks."""
        shim = os.path.join(t.tmpdir(prefix="xpyd-shim-"), "slow_socket_writes.so")
        subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", shim,
                        os.path.join(os.path.dirname(os.path.abspath(__file__)), "slow_socket_writes.c"), "-ldl"],
                       check=True)
        env = {"LD_PRELOAD": shim, "XPYD_TEST_SOCKET_WRITE_DELAY_US": "20000"}
        if os.environ.get("XPYD_SANITIZED", "0") not in ("", "0", "OFF"):  # the shim is loaded before ASan's runtime
            env["ASAN_OPTIONS"] = os.environ.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0"
        p = self.start(t.sim("--role", "prefill"))
        d = self.start(t.sim("--role", "decode", "--decode-us-per-token", "0"))
        r = self.start(t.Proc("xpyd_router", ["--port", "0", "--log-level", "warn", "--threads", "2", "-p",
                                              "127.0.0.1:%d" % p.port, "-d", "127.0.0.1:%d" % d.port], env=env))
        # scrapes on connections opened beforehand, on both workers (each accepted by whichever was free; eight
        # all on one worker would be 1 in 128): asked the moment the answer is read
        scrapes = [t.RawConn(r.port) for _ in range(8)]
        key = 'xpyd_requests_total{endpoint="/v1/completions",status="%d"}'
        body = json.dumps({"prompt": "a b", "max_tokens": 2}).encode()
        seen = []
        for i in range(N_READ_THEN_COUNTED):
            if i % 3 == 2:
                s = t.Stream(r.port, "/v1/completions", {"prompt": "a b", "max_tokens": 2, "stream": True})
                s.read_all()
            else:
                c = t.RawConn(r.port)
                c.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n%s" % (len(body), body) if i % 3 == 0 else
                       b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n{bad")
                self.assertEqual(c.response()[0], 200 if i % 3 == 0 else 400)
                c.close()
            for sc in scrapes:
                sc.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            for k, sc in enumerate(scrapes):
                st, _, _, page = sc.response()
                self.assertEqual(st, 200)
                m = t.parse_metrics(page.decode())
                got = (m[key % 200] + m.get(key % 400, 0), m["xpyd_active_requests"], m["xpyd_request_body_bytes"])
                if got != (i + 1, 0, 0):
                    seen.append((i, k, got))
        self.assertEqual(seen, [], "(request, scrape, (counted, in progress, body bytes held)) after its answer")

    def test_process_metrics_match_the_kernel(self):
        """process_* against /proc read by the test, xpyd_build_info against --version."""
        d = self.start(t.sim("--role", "decode"))
        t0 = time.time()
        r = self.start(t.router([], [d.port], "--handoff", "none"))
        for _ in range(20):
            self.assertEqual(t.post_json(r.port, "/v1/completions", {"prompt": "a " * 2000, "max_tokens": 2})[0],
                             200)
        pid = r.p.pid
        m = t.metrics(r.port)
        with open("/proc/%d/status" % pid) as f:
            rss = [int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:")][0]
        self.assertLess(abs(m["process_resident_memory_bytes"] - rss), rss * 0.2 + (4 << 20))
        fds = len(os.listdir("/proc/%d/fd" % pid))
        self.assertLessEqual(abs(m["process_open_fds"] - fds), 2)  # a scrape's own connection comes and goes
        with open("/proc/%d/limits" % pid) as f:
            soft = [l.split()[3] for l in f if l.startswith("Max open files")][0]
        self.assertEqual(m["process_max_fds"], int(soft))
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        tck = os.sysconf("SC_CLK_TCK")
        cpu = (int(fields[11]) + int(fields[12])) / tck
        self.assertLessEqual(m["process_cpu_seconds_total"], cpu + 0.05)
        self.assertGreater(m["process_cpu_seconds_total"], 0)
        with open("/proc/stat") as f:
            btime = [int(l.split()[1]) for l in f if l.startswith("btime")][0]
        self.assertAlmostEqual(m["process_start_time_seconds"], btime + int(fields[19]) / tck, delta=0.02)
        self.assertLess(abs(m["process_start_time_seconds"] - t0), 2)
        version = subprocess.run([os.path.join(t.BIN, "xpyd_router"), "--version"], capture_output=True, text=True).stdout
        v, rev = re.match(r"xpyd_router (\S+) \(git (\S+)\)", version).groups()
        self.assertEqual(m['xpyd_build_info{version="%s",git_revision="%s"}' % (v, rev)], 1)

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


class AccessLogAndLevels(t.TestCase):
    """The access log has one format for every request (served, failed, refused before routing): timestamp,
    request id, client address, method, path, status, six-decimal durations; log levels mean what they say."""

    def lines(self, r, fmt):
        out = r.output().splitlines()
        if fmt == "json":
            return [json.loads(l) for l in out if l.startswith("{")]
        got = []
        for l in out:
            if " access " in l:
                got.append(dict(kv.split("=", 1) for kv in l.split() if "=" in kv))
        return got

    def test_every_request_one_line_in_both_formats(self):
        p = self.start(t.sim("--role", "prefill"))
        d = self.start(t.sim("--role", "decode"))
        for fmt in ("json", "logfmt"):
            r = self.start(t.router([p.port], [d.port], "--api-key", "k", "--access-log", fmt))
            auth = {"Authorization": "Bearer k"}
            s = t.Stream(r.port, "/v1/completions", {"prompt": "a b", "max_tokens": 3, "stream": True},
                         headers=dict(auth, **{"X-Request-Id": "mine-1"}))
            s.read_all()
            self.assertEqual(t.post_json(r.port, "/v1/completions", {"prompt": "a"})[0], 401)
            self.assertEqual(t.request(r.port, "GET", "/v1/chat/completions", headers=auth)[0], 405)
            self.assertEqual(t.request(r.port, "POST", "/v1/completions", "{", headers=auth)[0], 400)
            r.stop()
            ls = self.lines(r, fmt)
            self.assertEqual([l["status"] if fmt == "json" else int(l["status"]) for l in ls], [200, 401, 405, 400])
            ok, unauth, wrong, bad = ls
            self.assertEqual(ok["request_id"], "mine-1")
            for l in ls:
                self.assertRegex(l["ts"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
                self.assertRegex(l["client"], r"^127\.0\.0\.1:\d+$")
                self.assertNotEqual(l["request_id"], "-")
                for k in ("ttft_s", "total_s"):
                    self.assertRegex(str(l[k]) if fmt == "logfmt" else "%.6f" % l[k], r"^-?\d+\.\d{6}$")
                    if fmt == "logfmt":
                        self.assertRegex(l[k], r"^-?\d+\.\d{6}$")
            self.assertEqual([l["method"] for l in ls], ["POST", "POST", "GET", "POST"])
            self.assertEqual([l["path"] for l in ls], ["/v1/completions", "/v1/completions", "/v1/chat/completions",
                                                      "/v1/completions"])
            self.assertEqual([l["error"] for l in ls], ["none", "unauthorized", "method_not_allowed", "bad_request"])
            self.assertGreater(float(ok["ttft_s"]), 0)
            self.assertEqual(float(unauth["ttft_s"]), -1)
            if fmt == "logfmt":
                self.assertEqual(unauth["ttft_s"], "-1.000000")
            self.assertTrue(unauth["request_id"].startswith("xpyd-"))

    def test_routine_events_are_info_failures_error(self):
        p = self.start(t.sim("--role", "prefill"))
        dead = t.free_port()
        r = self.start(t.router([p.port], [dead], "--admin-key", "adm", "--max-retries", "0",
                                "--health-interval-ms", "0"))
        d2 = self.start(t.sim("--role", "decode"))
        st, _, _ = t.post_json(r.port, "/admin/instances", {"role": "decode", "host": "127.0.0.1", "port": d2.port},
                               headers={"Authorization": "Bearer adm"})
        self.assertEqual(st, 201)
        t.request(r.port, "DELETE", "/admin/instances/decode/127.0.0.1:%d" % d2.port,
                  headers={"Authorization": "Bearer adm"})
        self.assertEqual(t.post_json(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 2})[0], 502)
        out = r.output()  # started with --log-level warn: events are still written, under their own level
        added = [l for l in out.splitlines() if "event=instance_added" in l]
        removed = [l for l in out.splitlines() if "event=instance_removed" in l]
        failed = [l for l in out.splitlines() if "event=request_failed" in l]
        self.assertEqual(len(added), 1)
        self.assertIn("level=info", added[0])
        self.assertIn("level=info", removed[0])
        self.assertIn("level=error", failed[0])
        self.assertEqual([l for l in out.splitlines() if "level=error" in l and "event=request_failed" not in l], [])


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
        self.assertOpenAIError(st, out, 503, "max_model_len")  # an estimate: the engines are the judges
        self.assertEqual(reason(r.port, "context_too_long"), 1)
        # token ids are an exact count: the client's error, in vLLM's words, before any engine
        st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": list(range(40)), "max_tokens": 20})
        self.assertOpenAIError(st, out, 400, "'max_tokens' or 'max_completion_tokens' is too large: 20. This model's "
                               "maximum context length is 50 tokens and your request has 40 input tokens")
        self.assertEqual(reason(r.port, "context_too_long"), 2)
        self.assertEqual(t.metric(d.port, "xpyd_sim:requests_total"), 0)
        # a batch is checked prompt by prompt, as vLLM checks it: two prompts of 40 ids fit with 5 more each (the
        # sim then refuses a batch itself); one of 48 does not
        st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": [list(range(40))] * 2, "max_tokens": 5})
        self.assertOpenAIError(st, out, 400, "batched prompts (arrays of several prompts) are not supported")
        st, _, out = t.post_json(r.port, "/v1/completions",
                                 {"prompt": [list(range(40)), list(range(48))], "max_tokens": 5})
        self.assertOpenAIError(st, out, 400, "is too large: 5. This model's maximum context length is 50 tokens "
                               "and your request has 48 input tokens")
        self.assertEqual(reason(r.port, "context_too_long"), 3)
        st, _, _ = t.request(r.port, "POST", "/v1/completions", "x" * 100)
        self.assertEqual(reason(r.port, "bad_request"), 2)  # and the engine's 400 for the batch

    def cfg(self, pp, dp, mml):
        path = os.path.join(self._tmp(), "c.json")
        with open(path, "w") as f:
            json.dump({"prefill": {"hosts": [{"host": "127.0.0.1", "port": pp, "max_model_len": mml}]},
                       "decode": {"hosts": [{"host": "127.0.0.1", "port": dp, "max_model_len": mml}]}}, f)
        return path

    def _tmp(self):
        d = t.tmpdir(prefix="xpyd-cfg-")
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
            r = self.start(t.router(ps, ds, "--first-token-timeout-ms", "300", "--prefill-fallback", "off"))
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


N_READ_THEN_COUNTED = 12

if __name__ == "__main__":
    t.main()
