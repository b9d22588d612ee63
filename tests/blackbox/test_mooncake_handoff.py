# SPDX-License-Identifier: Apache-2.0
"""--handoff mooncake: vLLM's MooncakeConnector (push with transfer_id). The router learns each prefill's DP
ranks and engine ids from GET /query on its bootstrap server, then sends both legs at once: the prefill a
max_tokens-1 prefill with {do_remote_decode, transfer_id} pinned by X-data-parallel-rank, the decode the
client's body with {do_remote_prefill, remote_bootstrap_addr, remote_engine_id, transfer_id}. Checked with a
recording fake engine (the exact wire fields and headers of both legs) and end to end through xpyd_sim."""
import json
import os
import signal
import threading
import time

import xpyd_testlib as t


def sse(events):
    return b"".join(b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n" for e in events)


def cmpl_event(text, finish=None):
    return {"id": "cmpl-d", "object": "text_completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}


def cmpl_json(text):
    return {"id": "cmpl-p", "object": "text_completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4,
                      "prompt_tokens_details": {"cached_tokens": 2}}}


class Recording:
    """A fake prefill (generate + GET /query on a second port, as vLLM's bootstrap server) and a fake decode,
    both recording what they receive. prefill_status/decode_delay script failures."""

    def __init__(self, tc, ids=("engine-r0", "engine-r1"), prefill_status=None, decode_delay=0.0):
        self.ids = list(ids)
        self.prefill_status = list(prefill_status or [])
        self.lock = threading.Lock()

        def prefill(method, path, body):
            if method != "POST":  # health checks
                return 200, "application/json", b"{}"
            with self.lock:
                st = self.prefill_status.pop(0) if self.prefill_status else 200
            if st != 200:
                return st, "application/json", json.dumps({"error": {"message": "injected prefill failure",
                                                                     "type": "x", "code": st}}).encode()
            return 200, "application/json", json.dumps(cmpl_json(" a")).encode()

        def boot(method, path, body):
            if path != "/query":
                return 404, "application/json", b"{}"
            return 200, "application/json", json.dumps({str(i): {"engine_id": e}
                                                        for i, e in enumerate(self.ids)}).encode()

        def decode(method, path, body):
            if method != "POST":
                return 200, "application/json", b"{}"
            if decode_delay:
                time.sleep(decode_delay)
            req = json.loads(body)
            # vLLM's decode waits for the prefill's KV push under its transfer_id: it never answers before the
            # prefill has the request (the router cancels a prefill leg still unsent when the request ends)
            xfer = req.get("kv_transfer_params", {}).get("transfer_id")
            t.wait_until(lambda: any(json.loads(b).get("kv_transfer_params", {}).get("transfer_id") == xfer
                                     for m, _, b in list(self.p.requests) if m == "POST"), what="the prefill's leg")
            if req.get("stream"):
                return 200, "text/event-stream", sse([cmpl_event(" a"), cmpl_event(" b", "length"), b"[DONE]"])
            return 200, "application/json", json.dumps(cmpl_json(" a b")).encode()

        self.p = t.FakeEngine(prefill)
        self.boot = t.FakeEngine(boot)
        self.d = t.FakeEngine(decode)
        tc.addCleanup(self.p.stop)
        tc.addCleanup(self.boot.stop)
        tc.addCleanup(self.d.stop)

    def router(self, tc, *args):
        return tc.start(t.router([self.p.port], [self.d.port], "--handoff", "mooncake", "--prefill-bootstrap-port",
                                 str(self.boot.port), "--query-interval-ms", "200", *args))

    def generate(self, who):
        eng = self.p if who == "p" else self.d
        return [(json.loads(b), h) for (m, path, b), h in zip(eng.requests, eng.headers) if m == "POST"]


class RecordingEngine(t.TestCase):
    def test_exact_wire_fields_both_legs(self):
        rec = Recording(self)
        r = rec.router(self)
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 7,
                "stream": True, "stream_options": {"include_usage": True}, "temperature": 0, "user": "u1"}
        cmpl = {"model": "m", "prompt": "a b c", "max_tokens": 5, "min_tokens": 2, "seed": 9}
        sent = []
        for i in range(4):  # both DP ranks of the prefill get used (least loaded, rotating ties)
            body = chat if i % 2 else cmpl
            path = "/v1/chat/completions" if i % 2 else "/v1/completions"
            rid = "req-%d" % i
            if body.get("stream"):
                s = t.Stream(r.port, path, body, headers={"X-Request-Id": rid})
                self.assertEqual(s.response().status, 200)
                s.read_all()
            else:
                st, _, out = t.post_json(r.port, path, body, headers={"X-Request-Id": rid})
                self.assertEqual(st, 200, out)
            sent.append((rid, body))
        pre, dec = rec.generate("p"), rec.generate("d")
        self.assertEqual(len(pre), 4)
        self.assertEqual(len(dec), 4)
        # matched by request id: the recording engines serve several connections on threads of their own, so the
        # order they record in is not the order the requests were sent in
        by_id = lambda legs: {h.get("X-Request-Id"): (b, h) for b, h in legs}
        pre, dec = by_id(pre), by_id(dec)
        ranks = set()
        for rid, body in sent:
            (pb, ph), (db, dh) = pre[rid], dec[rid]
            xfer = "xfer-" + rid
            want_p = {k: v for k, v in body.items() if k not in ("stream_options", "min_tokens")}
            want_p.update(stream=False, max_tokens=1,
                          kv_transfer_params={"do_remote_decode": True, "do_remote_prefill": False,
                                              "transfer_id": xfer})
            if "max_completion_tokens" in body:
                want_p["max_completion_tokens"] = 1
            self.assertEqual(pb, want_p)
            self.assertEqual(ph.get("X-Request-Id"), rid)
            rank = int(ph["X-data-parallel-rank"])
            ranks.add(rank)
            want_d = dict(body)
            want_d["kv_transfer_params"] = {"do_remote_decode": False, "do_remote_prefill": True,
                                            "remote_bootstrap_addr": "http://127.0.0.1:%d" % rec.boot.port,
                                            "remote_engine_id": rec.ids[rank], "transfer_id": xfer}
            self.assertEqual(db, want_d)
            self.assertEqual(dh.get("X-Request-Id"), rid)
            self.assertNotIn("X-data-parallel-rank", dh)
        self.assertEqual(ranks, {0, 1})
        s = t.status(r.port)
        self.assertEqual([(i["dp_rank"], i["engine_id"], i["ready"]) for i in s["pools"]["prefill"]["instances"]],
                         [(0, "engine-r0", True), (1, "engine-r1", True)])
        self.idle(r)

    def test_retry_sends_both_legs_with_a_new_transfer_id(self):
        # the first prefill attempt fails while the decode waits: its decode leg is closed, and the retry
        # sends a fresh pair with a new transfer_id (never one leg of the old pair)
        rec = Recording(self, ids=("e0", "e1"), prefill_status=[500], decode_delay=0.3)
        r = rec.router(self, "--max-retries", "1", "--retry-backoff-ms", "0", "--eject-after-failures", "0")
        st, _, out = t.post_json(r.port, "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 3},
                                 headers={"X-Request-Id": "rq"})
        self.assertEqual(st, 200, out)
        self.assertEqual(out["choices"][0]["text"], " a b")
        t.wait_until(lambda: len(rec.generate("d")) == 2, what="both decode legs recorded")
        pre = [b["kv_transfer_params"]["transfer_id"] for b, _ in rec.generate("p")]
        dec = [b["kv_transfer_params"]["transfer_id"] for b, _ in rec.generate("d")]
        self.assertEqual(pre, ["xfer-rq", "xfer-rq-1"])
        self.assertEqual(sorted(dec), ["xfer-rq", "xfer-rq-1"])
        # the retry went to the other prefill rank, and its decode leg names that rank's engine
        ranks = [int(h["X-data-parallel-rank"]) for _, h in rec.generate("p")]
        self.assertEqual(sorted(ranks), [0, 1])
        second = [b for b, _ in rec.generate("d") if b["kv_transfer_params"]["transfer_id"] == "xfer-rq-1"][0]
        self.assertEqual(second["kv_transfer_params"]["remote_engine_id"], rec.ids[ranks[1]])
        self.assertEqual(t.metric(r.port, 'xpyd_retries_total{role="prefill"}'), 1)
        self.idle(r)

    def test_prefill_failure_is_the_clients_error(self):
        rec = Recording(self, ids=("only",), prefill_status=[400], decode_delay=0.3)
        r = rec.router(self, "--max-retries", "2")
        st, _, out = t.post_json(r.port, "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 3})
        self.assertOpenAIError(st, out, 400, "injected prefill failure")
        self.assertEqual(len(rec.generate("p")), 1)  # a 4xx judged the request: no retry
        self.idle(r)

    def test_prefill_without_query_is_not_eligible(self):
        # one prefill whose bootstrap server is down: never picked, /health 503 while it is the only one
        rec = Recording(self)
        dead, other = t.free_port(), t.free_port()
        topo = {"handoff": "mooncake", "query_interval_ms": 200,
                "prefill": {"hosts": [{"host": "127.0.0.1", "port": rec.p.port, "bootstrap_port": rec.boot.port},
                                      {"host": "127.0.0.1", "port": other, "bootstrap_port": dead}]},
                "decode": {"hosts": [{"host": "127.0.0.1", "port": rec.d.port}]}}
        path = os.path.join(t.tmpdir(prefix="xpyd-test-"), "topo.json")
        with open(path, "w") as f:
            json.dump(topo, f)
        r = self.start(t.Proc("xpyd_router", ["--port", "0", "--log-level", "warn", "--config", path]))
        t.wait_until(lambda: sum(i["ready"] for i in t.status(r.port)["pools"]["prefill"]["instances"]) == 2,
                     what="the answering prefill's two ranks ready")
        for i in range(6):
            st, _, out = t.post_json(r.port, "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 2})
            self.assertEqual(st, 200, out)
        insts = t.status(r.port)["pools"]["prefill"]["instances"]
        self.assertEqual(sorted((i["port"], i["ready"]) for i in insts),
                         sorted([(rec.p.port, True), (rec.p.port, True), (other, False)]))
        self.assertEqual(t.metric(r.port, 'xpyd_instance_healthy{role="prefill",engine="127.0.0.1:%d",dp_rank="0"}'
                                  % other), 0)
        self.idle(r)

    def test_no_answering_prefill_means_unavailable(self):
        rec = Recording(self)
        dead = t.free_port()
        r = self.start(t.Proc("xpyd_router", ["--port", "0", "--log-level", "warn", "-p",
                                              "127.0.0.1:%d" % rec.p.port, "-d", "127.0.0.1:%d" % rec.d.port,
                                              "--handoff", "mooncake", "--prefill-bootstrap-port", str(dead)],
                              ready_path="/status"))
        self.assertEqual(t.request(r.port, "GET", "/health")[0], 503)
        st, _, out = t.post_json(r.port, "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 2})
        self.assertOpenAIError(st, out, 503, "no healthy prefill")
        self.assertEqual(rec.generate("p"), [])
        self.assertEqual(rec.generate("d"), [])
        self.idle(r)


def rank_prompt_tokens(port, rank):
    """vllm:prompt_tokens_total of one DP rank of a sim."""
    m = t.metrics(port)
    keys = [k for k in m if k.startswith('vllm:prompt_tokens_total{engine="%s"' % rank)]
    assert len(keys) == 1, keys
    return m[keys[0]]


def mooncake_prefill(*extra, port=0, bport=None):
    bport = bport or t.free_port()
    return t.Proc("xpyd_sim", ["--port", str(port), "--log-level", "warn", "--role", "prefill", "--handoff",
                               "mooncake", "--bootstrap-port", str(bport), "--dp-mode", "internal"] + list(extra)), bport


class ThroughSims(t.TestCase):
    def cluster(self, *router_args, dp=2):
        p, bport = mooncake_prefill("--dp-size", str(dp))
        p = self.start(p)
        d = self.start(t.sim("--role", "decode", "--handoff", "mooncake", "--decode-us-per-token", "200"))
        r = self.start(t.router([p.port], [d.port], "--handoff", "mooncake", "--prefill-bootstrap-port", str(bport),
                                *router_args))
        return p, d, r

    def test_stream_and_not_chat_and_completions(self):
        p, d, r = self.cluster()
        n = 0
        for path, body in (("/v1/completions", {"prompt": "a b c d", "max_tokens": 6}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a b"}],
                                                     "max_tokens": 6})):
            for stream in (False, True):
                b = dict(body, model="sim-model", stream=stream, ignore_eos=True)
                if stream:
                    b["stream_options"] = {"include_usage": True}
                    s = t.Stream(r.port, path, b)
                    self.assertEqual(s.response().status, 200)
                    evs = s.read_all()
                    self.assertEqual(evs[-1], "[DONE]")
                    self.assertEqual(len(t.content_events(evs)), 6, evs)
                    usage = [json.loads(e)["usage"] for e in evs[:-1] if json.loads(e).get("usage")]
                    self.assertEqual(usage[-1]["completion_tokens"], 6)
                else:
                    st, _, out = t.post_json(r.port, path, b)
                    self.assertEqual(st, 200, out)
                    self.assertEqual(out["usage"]["completion_tokens"], 6)
                n += 1
        self.assertEqual(t.metric(d.port, 'xpyd_sim:handoffs_total{mode="mooncake",result="done"}'), n)
        self.assertEqual(t.metric(d.port, 'xpyd_sim:handoffs_total{mode="mooncake",result="failed"}'), 0)
        # both DP ranks of the prefill served (the header pinned each request)
        for rank in ("0", "1"):
            self.assertGreater(rank_prompt_tokens(p.port, rank), 0)
        t.wait_until(lambda: t.metric(p.port, "xpyd_sim:kv_leases_active") == 0, what="every KV claimed")
        self.idle(r)

    def test_prefill_restart_with_new_engine_ids(self):
        pport, bport = t.free_port(), t.free_port()
        p, _ = mooncake_prefill(port=pport, bport=bport)
        p = self.start(p)
        d = self.start(t.sim("--role", "decode", "--handoff", "mooncake", "--handoff-timeout-ms", "3000"))
        r = self.start(t.router([pport], [d.port], "--handoff", "mooncake", "--prefill-bootstrap-port", str(bport),
                                "--query-interval-ms", "100", "--health-interval-ms", "100"))
        body = {"model": "sim-model", "prompt": "a b", "max_tokens": 3}
        self.assertEqual(t.post_json(r.port, "/v1/completions", body)[0], 200)
        old = t.request_json_status(r.port)["pools"]["prefill"]["instances"][0]["engine_id"]
        p.stop()
        t.wait_until(lambda: not t.status(r.port)["pools"]["prefill"]["instances"][0]["ready"],
                     what="the stopped prefill made unready")
        p2, _ = mooncake_prefill(port=pport, bport=bport)
        p2 = self.start(p2)
        new = json.loads(t.request(bport, "GET", "/query")[2])["0"]["engine_id"]
        self.assertNotEqual(new, old)
        t.wait_until(lambda: t.status(r.port)["pools"]["prefill"]["instances"][0].get("engine_id") == new and
                     t.status(r.port)["pools"]["prefill"]["instances"][0]["ready"], what="new engine id learned")
        t.wait_until(lambda: t.request(r.port, "GET", "/health")[0] == 200, what="router healthy again")
        for _ in range(3):
            st, _, out = t.post_json(r.port, "/v1/completions", body)
            self.assertEqual(st, 200, out)
        self.assertEqual(t.metric(d.port, 'xpyd_sim:handoffs_total{mode="mooncake",result="done"}'), 4)
        self.assertEqual(t.metric(d.port, 'xpyd_sim:handoffs_total{mode="mooncake",result="failed"}'), 0)
        self.idle(r)

    def test_prefill_dp_grows_and_shrinks(self):
        # a prefill restarted with another DP size: the router's ranks follow its /query answer
        pport, bport = t.free_port(), t.free_port()
        p, _ = mooncake_prefill("--dp-size", "1", port=pport, bport=bport)
        p = self.start(p)
        d = self.start(t.sim("--role", "decode", "--handoff", "mooncake"))
        r = self.start(t.router([pport], [d.port], "--handoff", "mooncake", "--prefill-bootstrap-port", str(bport),
                                "--query-interval-ms", "100"))
        ranks = lambda: sorted(i["dp_rank"] for i in t.status(r.port)["pools"]["prefill"]["instances"])
        self.assertEqual(ranks(), [0])
        p.stop()
        p3, _ = mooncake_prefill("--dp-size", "3", port=pport, bport=bport)
        p3 = self.start(p3)
        t.wait_until(lambda: ranks() == [0, 1, 2], what="three ranks")
        t.wait_until(lambda: t.request(r.port, "GET", "/health")[0] == 200, what="router healthy")
        for _ in range(6):
            self.assertEqual(t.post_json(r.port, "/v1/completions", {"model": "sim-model", "prompt": "a",
                                                                     "max_tokens": 2})[0], 200)
        for rank in ("0", "1", "2"):
            self.assertGreater(rank_prompt_tokens(p3.port, rank), 0)
        p3.stop()
        p2, _ = mooncake_prefill("--dp-size", "2", port=pport, bport=bport)
        self.start(p2)
        t.wait_until(lambda: ranks() == [0, 1], what="back to two ranks (rank 2 taken out)")
        self.idle(r)

    def test_prefill_failure_cancels_the_decode_leg(self):
        p, bport = mooncake_prefill("--status-code", "500")
        p = self.start(p)
        d = self.start(t.sim("--role", "decode", "--handoff", "mooncake", "--handoff-timeout-ms", "60000"))
        r = self.start(t.router([p.port], [d.port], "--handoff", "mooncake", "--prefill-bootstrap-port", str(bport),
                                "--max-retries", "0"))
        st, _, out = t.post_json(r.port, "/v1/completions", {"model": "sim-model", "prompt": "a b", "max_tokens": 3})
        self.assertOpenAIError(st, out, 500, "injected")
        # the decode leg was closed: the decode holds nothing (its claim would otherwise wait 60 s)
        t.wait_until(lambda: t.metric(d.port, "vllm:num_requests_running") == 0 and
                     t.metric(d.port, "vllm:num_requests_waiting") == 0, timeout=5, what="decode holds nothing")
        self.idle(r)

    def test_decode_failure_drops_the_prefill_leg(self):
        p, bport = mooncake_prefill("--prefill-us-per-token", "200000")  # a slow prefill: still running
        p = self.start(p)
        d = self.start(t.sim("--role", "decode", "--handoff", "mooncake", "--status-code", "503"))
        r = self.start(t.router([p.port], [d.port], "--handoff", "mooncake", "--prefill-bootstrap-port", str(bport),
                                "--max-retries", "0"))
        st, _, out = t.post_json(r.port, "/v1/completions", {"model": "sim-model", "prompt": "a b c", "max_tokens": 3})
        self.assertOpenAIError(st, out, 503, "")
        t.wait_until(lambda: t.metric(p.port, "vllm:num_requests_running") == 0, timeout=5,
                     what="the prefill leg closed (the sim aborted it)")
        self.idle(r)

    def test_client_disconnect_closes_both_legs(self):
        p, bport = mooncake_prefill()
        p = self.start(p)
        d = self.start(t.sim("--role", "decode", "--handoff", "mooncake", "--decode-us-per-token", "50000"))
        r = self.start(t.router([p.port], [d.port], "--handoff", "mooncake", "--prefill-bootstrap-port", str(bport)))
        s = t.Stream(r.port, "/v1/completions", {"model": "sim-model", "prompt": "a", "max_tokens": 200,
                                                  "stream": True, "ignore_eos": True})
        self.assertEqual(s.response().status, 200)
        next(iter(s.events()))
        s.close()
        t.wait_until(lambda: t.metric(d.port, "vllm:num_requests_running") == 0, timeout=5, what="decode freed")
        self.idle(r)
        self.assertEqual(t.metric(r.port, 'xpyd_request_errors_total{reason="client_disconnect"}'), 1)

    def test_first_token_from_prefill(self):
        # the prefill's token opens the stream when the decode has said nothing yet; the client sees every
        # token exactly once, the same text as the decode alone
        p, d, r = self.cluster("--first-token", "prefill")
        b = {"model": "sim-model", "prompt": "a b c", "max_tokens": 5, "stream": True, "ignore_eos": True}
        s = t.Stream(r.port, "/v1/completions", b)
        evs = s.read_all()
        texts = [e["choices"][0]["text"] for e in t.content_events(evs)]
        st, _, ref = t.post_json(d.port, "/v1/completions", dict(b, stream=False))
        self.assertEqual("".join(texts), ref["choices"][0]["text"])
        self.assertEqual(len(texts), 5)
        self.idle(r)

    def test_admission_queue_waits_for_a_decode_slot(self):
        # every decode at max_inflight: requests wait (their prefill pick given back) and all complete
        p, d, r = self.cluster("--decode-max-inflight", "1", "--admission-queue", "16",
                               "--queue-timeout-ms", "20000")
        results = []

        def one(i):
            results.append(t.post_json(r.port, "/v1/completions", {"model": "sim-model", "prompt": "w%d x" % i,
                                                                   "max_tokens": 8, "ignore_eos": True})[0])
        ths = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for th in ths:
            th.start()
        for th in ths:
            th.join(60)
        self.assertEqual(results, [200] * 6)
        self.assertGreater(t.metric(r.port, "xpyd_admission_queue_admitted_total"), 0)
        self.assertEqual(t.metric(d.port, 'xpyd_sim:handoffs_total{mode="mooncake",result="done"}'), 6)
        self.idle(r)

    def test_admin_add_and_reload_keep_learned_ranks(self):
        # a prefill added at runtime is unready until its /query answers, then serves with its own ranks; a
        # SIGHUP that still lists a prefill keeps the ranks learned from it
        p1, b1 = mooncake_prefill("--dp-size", "2")
        p1 = self.start(p1)
        d = self.start(t.sim("--role", "decode", "--handoff", "mooncake"))
        path = os.path.join(t.tmpdir(prefix="xpyd-test-"), "topo.json")
        topo = {"handoff": "mooncake", "query_interval_ms": 100, "admin_key": "adm",
                "prefill": {"hosts": [{"host": "127.0.0.1", "port": p1.port, "bootstrap_port": b1}]},
                "decode": {"hosts": [{"host": "127.0.0.1", "port": d.port}]}}
        with open(path, "w") as f:
            json.dump(topo, f)
        r = self.start(t.Proc("xpyd_router", ["--port", "0", "--log-level", "warn", "--config", path]))
        inst = lambda: sorted((i["port"], i["dp_rank"], i["ready"]) for i in t.status(r.port)["pools"]["prefill"]["instances"])
        t.wait_until(lambda: inst() == [(p1.port, 0, True), (p1.port, 1, True)], what="p1's two ranks")
        p2, b2 = mooncake_prefill("--dp-size", "3")
        p2 = self.start(p2)
        st, _, out = t.post_json(r.port, "/admin/instances", {"role": "prefill", "host": "127.0.0.1", "port": p2.port,
                                                               "bootstrap_port": b2},
                                 headers={"Authorization": "Bearer adm"})
        self.assertEqual(st, 201, out)
        self.assertEqual([(i["dp_rank"], i["ready"]) for i in out["instances"]], [(0, False)])
        t.wait_until(lambda: [x for x in inst() if x[0] == p2.port] ==
                     [(p2.port, 0, True), (p2.port, 1, True), (p2.port, 2, True)], what="p2's three ranks")
        r.signal(signal.SIGHUP)  # the file lists p1 only: p2 goes, p1 keeps both learned ranks
        t.wait_until(lambda: inst() == [(p1.port, 0, True), (p1.port, 1, True)], what="reloaded")
        for _ in range(4):
            self.assertEqual(t.post_json(r.port, "/v1/completions", {"model": "sim-model", "prompt": "a",
                                                                     "max_tokens": 2})[0], 200)
        self.idle(r)


class Config(t.TestCase):
    def test_repeat_mode_refused(self):
        rc = t.Proc("xpyd_router", ["--dry-run", "-p", "127.0.0.1:9", "-d", "127.0.0.1:10", "--handoff", "mooncake",
                                    "--repeat-d-times", "1"], port_flag=False)
        rc.p.wait(10)
        self.assertEqual(rc.p.returncode, 2)
        self.assertIn("--repeat-d-times needs --handoff store", rc.output())
        rc.stop(check=False)

    def test_dry_run_shows_one_port_per_prefill_and_default_bootstrap_port(self):
        rc = t.Proc("xpyd_router", ["--dry-run", "-p", "10.0.0.1:8100", "--prefill-dp", "2", "-d", "10.0.0.2:8200",
                                    "--handoff", "mooncake"], port_flag=False)
        rc.p.wait(10)
        out = rc.output()
        self.assertEqual(rc.p.returncode, 0, out)
        self.assertIn("P[0] 10.0.0.1:8100 dp_rank=0", out)
        self.assertIn("P[1] 10.0.0.1:8100 dp_rank=1", out)
        self.assertIn("bootstrap_port=8998", out)
        self.assertIn("D[0] 10.0.0.2:8200 dp_rank=-1", out)
        rc.stop(check=False)


if __name__ == "__main__":
    t.main()
