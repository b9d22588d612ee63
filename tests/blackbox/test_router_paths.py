# SPDX-License-Identifier: Apache-2.0
"""xpyd_router request paths against xpyd_sim: every handoff mode x stream/non-stream x completions/chat,
first-token modes, repeat mode, DP external and internal. After each test the router holds no load and
the sims hold no KV lease."""
import json
import shutil

import xpyd_testlib as t

PROMPT = "a b c d e f g h"


def body(kind, n, stream, **kw):
    if kind == "chat":
        b = {"model": "sim-model", "messages": [{"role": "user", "content": PROMPT}], "max_completion_tokens": n}
    else:
        b = {"model": "sim-model", "prompt": PROMPT, "max_tokens": n}
    b["stream"] = stream
    if stream:
        b["stream_options"] = {"include_usage": True}
    b.update(kw)
    return b


def path(kind):
    return "/v1/chat/completions" if kind == "chat" else "/v1/completions"


class Cluster(t.TestCase):
    """1P1D (or more) sims plus a router, torn down after each test."""

    handoff = "kv-params"

    def cluster(self, router_args=(), np=1, nd=1, p_args=(), d_args=()):
        self.store = t.tmpdir(prefix="xpyd-store-")
        self.addCleanup(shutil.rmtree, self.store, True)
        common = ["--handoff", self.handoff, "--store-dir", self.store, "--decode-us-per-token", "200"]
        self.P = [self.start(t.sim("--role", "prefill", *common, *p_args)) for _ in range(np)]
        self.D = [self.start(t.sim("--role", "decode", *common, *d_args)) for _ in range(nd)]
        self.R = self.start(t.router(self.P, [d.port for d in self.D],
                                     "--handoff", self.handoff, *router_args))
        return self.R

    def assert_clean(self):
        t.wait_until(lambda: t.router_idle(self.R.port), what="router load back to zero")
        for p in self.P:
            self.assertEqual(t.metric(p.port, "xpyd_sim:kv_leases_active"), 0, "stranded KV lease")
        for s in self.P + self.D:
            t.wait_until(lambda: t.metric(s.port, "vllm:num_requests_running") == 0, what="sims idle")

    def run_matrix(self):
        self.cluster()
        for kind in ("completions", "chat"):
            for stream in (True, False):
                with self.subTest(kind=kind, stream=stream):
                    if stream:
                        st = t.Stream(self.R.port, path(kind), body(kind, 5, True))
                        self.assertEqual(st.status, 200)
                        self.assertEqual(st.headers["content-type"], "text/event-stream")
                        payloads = st.read_all()
                        self.assertEqual(payloads[-1], "[DONE]")
                        self.assertEqual(len(t.content_events(payloads)), 5)
                        usage = json.loads(payloads[-2])["usage"]
                        self.assertEqual(usage["completion_tokens"], 5)
                        ids = {json.loads(p)["id"] for p in payloads[:-1]}
                        self.assertEqual(len(ids), 1)
                    else:
                        st, h, out = t.post_json(self.R.port, path(kind), body(kind, 5, False))
                        self.assertEqual(st, 200, out)
                        self.assertEqual(h["content-type"], "application/json")
                        self.assertEqual(out["usage"]["completion_tokens"], 5)
                        self.assertNotIn("kv_transfer_params", out)
                        text = out["choices"][0].get("text") or out["choices"][0]["message"]["content"]
                        self.assertEqual(len(text.split()), 5)
        self.assert_clean()


class KvParamsPaths(Cluster):
    handoff = "kv-params"

    def test_matrix(self):
        self.run_matrix()
        m = t.metrics(self.D[0].port)
        self.assertEqual(m['xpyd_sim:handoffs_total{mode="kv-params",result="done"}'], 4)
        self.assertEqual(t.metric(self.P[0].port, "xpyd_sim:kv_leases_released_total"), 4)

    def test_prefill_cached_tokens_shown(self):
        self.cluster()
        payloads = t.Stream(self.R.port, "/v1/completions", body("completions", 3, True)).read_all()
        # the decode reports the whole prompt as cached; the client sees the prefill's number (0)
        self.assertEqual(json.loads(payloads[-2])["usage"]["prompt_tokens_details"]["cached_tokens"], 0)

    def test_headers_forwarded_same_request_id(self):
        self.cluster()
        st, _, out = t.post_json(self.R.port, "/v1/completions", body("completions", 2, False),
                                 headers={"Authorization": "Bearer k", "X-Request-Id": "client-id-7"})
        self.assertEqual(st, 200, out)
        self.assertEqual(out["id"], "cmpl-client-id-7")  # the decode saw the same X-Request-Id
        self.assertEqual(t.metric(self.P[0].port, "xpyd_sim:kv_leases_released_total"), 1)

    def test_first_token_from_prefill(self):
        # the decode holds each request 1.5 s: the first token can only have come from the prefill
        self.cluster(["--first-token", "prefill"], d_args=["--stall-ms", "1500"])
        for kind in ("completions", "chat"):
            st = t.Stream(self.R.port, path(kind), body(kind, 4, True))
            ev = st.events()
            first, _ = next(ev)
            while not t.content_events([first]):
                first, _ = next(ev)
            self.assertEqual(t.metric(self.D[0].port, "vllm:generation_tokens_total"), 0 if kind == "completions" else 4)
            rest = [first] + [p for p, _ in ev]
            content = t.content_events(rest)
            self.assertEqual(len(content), 4)  # exactly max_tokens: decode's first was removed
            self.assertEqual(rest[-1], "[DONE]")
            self.assertEqual(len({json.loads(p)["id"] for p in rest[:-1]}), 1)
            if kind == "chat":
                roles = [p for p in rest[:-1] if "role" in (json.loads(p)["choices"] or [{}])[0].get("delta", {})]
                self.assertLessEqual(len(roles), 1)
        m = t.metrics(self.R.port)
        self.assertEqual(m["xpyd_first_token_mismatch_total"], 0)
        self.assert_clean()

    def test_first_token_mismatch_counted(self):
        # engines sampling differently (other seeds): the prefill's token still leads, the decode's first
        # content event is still removed, and the disagreement is counted
        self.cluster(["--first-token", "prefill"], p_args=["--seed", "1"], d_args=["--seed", "2"])
        for _ in range(3):
            payloads = t.Stream(self.R.port, "/v1/completions", body("completions", 4, True)).read_all()
            self.assertEqual(len(t.content_events(payloads)), 4)
        self.assertEqual(t.metric(self.R.port, "xpyd_first_token_mismatch_total"), 3)
        self.assert_clean()

    def test_generator_on_p_node_alias(self):
        self.cluster(["--generator_on_p_node"])
        payloads = t.Stream(self.R.port, "/v1/completions", body("completions", 3, True)).read_all()
        self.assertEqual(len(t.content_events(payloads)), 3)
        self.assert_clean()


class StorePaths(Cluster):
    handoff = "store"

    def test_matrix(self):
        self.run_matrix()
        self.assertEqual(t.metric(self.D[0].port, 'xpyd_sim:handoffs_total{mode="store",result="done"}'), 4)

    def test_repeat_mode(self):
        self.cluster(["--repeat-d-times", "2"], nd=2)
        for _ in range(3):
            payloads = t.Stream(self.R.port, "/v1/completions", body("completions", 4, True)).read_all()
            self.assertEqual(len(t.content_events(payloads)), 4)
        # N+1 decode requests reached the sims per measured request
        t.wait_until(lambda: sum(t.metric(d.port, "xpyd_sim:requests_total") for d in self.D) == 9,
                     what="clones reached decodes")
        self.assertEqual(t.metric(self.R.port, "xpyd_repeat_clones_total"), 6)
        self.assert_clean()


class BootstrapPaths(Cluster):
    handoff = "bootstrap"

    def test_matrix(self):
        self.run_matrix()
        self.assertEqual(t.metric(self.D[0].port, 'xpyd_sim:handoffs_total{mode="bootstrap",result="done"}'), 4)


class DataParallel(t.TestCase):
    def test_external_decode_dp(self):
        base = t.free_port_range(2)
        p = self.start(t.sim("--role", "prefill"))
        d = self.start(t.Proc("xpyd_sim", ["--role", "decode", "--port", str(base), "--dp-size", "2",
                                           "--log-level", "warn", "--decode-us-per-token", "3000"], port_flag=False))
        for i in range(2):
            t.wait_until(lambda: t.request(base + i, "GET", "/health")[0] == 200, what="rank up")
        r = self.start(t.router([p.port], [base], "--decode-dp", "2"))
        streams = [t.Stream(r.port, "/v1/completions", body("completions", 10, True), lazy=True) for _ in range(4)]
        for s in streams:
            self.assertEqual(len(t.content_events(s.read_all())), 10)
        for i in range(2):  # every rank served, evenly
            self.assertEqual(t.metric(base + i, "xpyd_sim:requests_total"), 2)
        t.wait_until(lambda: t.router_idle(r.port), what="idle")

    def test_internal_decode_dp_pins_rank(self):
        p = self.start(t.sim("--role", "prefill"))
        d = self.start(t.sim("--role", "decode", "--dp-size", "3", "--dp-mode", "internal",
                             "--decode-us-per-token", "3000"))
        r = self.start(t.router([p.port], [d.port], "--dp-mode", "internal", "--decode-dp", "3"))
        st = t.status(r.port)
        self.assertEqual([i["dp_rank"] for i in st["pools"]["decode"]["instances"]], [0, 1, 2])
        streams = [t.Stream(r.port, "/v1/completions", body("completions", 10, True), lazy=True) for _ in range(3)]
        for s in streams:
            self.assertEqual(len(t.content_events(s.read_all())), 10)
        m = t.metrics(d.port)
        for k in range(3):
            self.assertEqual(m['xpyd_sim:requests_total{engine="%d",model_name="sim-model"}' % k], 1)
        t.wait_until(lambda: t.router_idle(r.port), what="idle")

    def test_dry_run_expands_port_major(self):
        import subprocess, os
        out = subprocess.run([os.path.join(t.BIN, "xpyd_router"), "--dry-run", "-p", "10.0.0.1:8100",
                              "-d", "10.0.0.2:8200", "10.0.0.3:8200", "--decode-dp", "2"],
                             capture_output=True, text=True, check=True).stdout
        ranks = [l.split()[1] for l in out.splitlines() if l.strip().startswith("D[")]
        self.assertEqual(ranks, ["10.0.0.2:8200", "10.0.0.3:8200", "10.0.0.2:8201", "10.0.0.3:8201"])


if __name__ == "__main__":
    t.main()
