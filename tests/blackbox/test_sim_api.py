# SPDX-License-Identifier: Apache-2.0
"""xpyd_sim speaks vLLM's OpenAI API: stream framing byte by byte, response shapes, validation errors,
batching, faults and abort on client disconnect."""
import json
import re
import os
import socket
import subprocess
import time

import xpyd_testlib as t

EVENT_RE = re.compile(rb"data: [^\n]+\n\n")


class SimApi(t.TestCase):
    def setUp(self):
        super().setUp()
        self.s = self.start(t.sim("--decode-us-per-token", "200", "--max-model-len", "64"))

    def test_completion_stream_bytes(self):
        st = t.Stream(self.s.port, "/v1/completions",
                      {"model": "sim-model", "prompt": "one two three", "max_tokens": 5, "stream": True,
                       "stream_options": {"include_usage": True}},
                      headers={"X-Request-Id": "rid-1"})
        self.assertEqual(st.status, 200)
        self.assertEqual(st.headers["content-type"], "text/event-stream")
        payloads = st.read_all()
        # framing: the whole body is a sequence of `data: ...\n\n` events and nothing else
        self.assertEqual(b"".join(EVENT_RE.findall(st.raw)), st.raw)
        self.assertEqual(payloads[-1], "[DONE]")
        chunks = [json.loads(p) for p in payloads[:-1]]
        content = t.content_events(payloads)
        self.assertEqual(len(content), 5)
        for c in content:
            self.assertEqual(c["object"], "text_completion")
            self.assertEqual(c["id"], "cmpl-rid-1")
            self.assertEqual(c["model"], "sim-model")
            self.assertIsNone(c["usage"])
            self.assertRegex(c["choices"][0]["text"], r"^ [a-z]+$")
        self.assertEqual([c["choices"][0]["finish_reason"] for c in content], [None] * 4 + ["length"])
        usage = chunks[-1]
        self.assertEqual(usage["choices"], [])
        self.assertEqual(usage["usage"]["prompt_tokens"], 3)
        self.assertEqual(usage["usage"]["completion_tokens"], 5)
        self.assertEqual(usage["usage"]["total_tokens"], 8)

    def test_stream_without_usage_has_no_usage_chunk(self):
        payloads = t.Stream(self.s.port, "/v1/completions",
                            {"prompt": "a b", "max_tokens": 3, "stream": True}).read_all()
        self.assertEqual(len(payloads), 4)
        self.assertEqual(payloads[-1], "[DONE]")
        self.assertTrue(all(json.loads(p)["choices"] for p in payloads[:-1]))

    def test_chat_stream_shape(self):
        st = t.Stream(self.s.port, "/v1/chat/completions",
                      {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi there"}]}],
                       "max_completion_tokens": 3, "stream": True, "stream_options": {"include_usage": True}})
        payloads = st.read_all()
        first = json.loads(payloads[0])
        self.assertEqual(first["object"], "chat.completion.chunk")
        self.assertEqual(first["choices"][0]["delta"], {"role": "assistant", "content": ""})
        self.assertTrue(first["id"].startswith("chatcmpl-"))
        self.assertEqual(len(t.content_events(payloads)), 3)
        self.assertEqual(json.loads(payloads[-2])["usage"]["completion_tokens"], 3)
        self.assertEqual(json.loads(payloads[-2])["usage"]["prompt_tokens"], 3)
        self.assertEqual(payloads[-1], "[DONE]")
        ids = {json.loads(p)["id"] for p in payloads[:-1]}
        self.assertEqual(len(ids), 1)

    def test_non_stream_shapes_and_determinism(self):
        st, h, body = t.post_json(self.s.port, "/v1/completions", {"prompt": "x y z", "max_tokens": 4})
        self.assertEqual(st, 200)
        self.assertEqual(h["content-type"], "application/json")
        self.assertEqual(body["object"], "text_completion")
        self.assertEqual(body["choices"][0]["finish_reason"], "length")
        self.assertEqual(body["usage"], {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7,
                                         "prompt_tokens_details": {"cached_tokens": 0}})
        self.assertEqual(len(body["choices"][0]["text"].split()), 4)
        # the same prompt generates the same tokens, streamed or not
        payloads = t.Stream(self.s.port, "/v1/completions",
                            {"prompt": "x   y z", "max_tokens": 4, "stream": True}).read_all()
        streamed = "".join(c["choices"][0]["text"] for c in t.content_events(payloads))
        self.assertEqual(streamed, body["choices"][0]["text"])
        st, _, chat = t.post_json(self.s.port, "/v1/chat/completions",
                                  {"messages": [{"role": "user", "content": "q"}], "max_tokens": 2})
        self.assertEqual(st, 200)
        self.assertEqual(chat["object"], "chat.completion")
        self.assertEqual(chat["choices"][0]["message"]["role"], "assistant")
        self.assertEqual(len(chat["choices"][0]["message"]["content"].split()), 2)

    def test_default_max_tokens_as_vllm(self):
        # unset: a completion generates 16 (vLLM's default); a chat, or a completion whose max_tokens is null,
        # what the context leaves (--max-model-len 64)
        for path, body, want in (("/v1/completions", {"prompt": "x y z"}, 16),
                                 ("/v1/completions", {"prompt": "x y z", "max_tokens": None}, 61),
                                 ("/v1/chat/completions", {"messages": [{"role": "user", "content": "q"}]}, None)):
            st, _, out = t.post_json(self.s.port, path, dict(body, ignore_eos=True))
            self.assertEqual(st, 200, out)
            u = out["usage"]
            self.assertEqual(u["completion_tokens"], want if want else 64 - u["prompt_tokens"])
        st, _, out = t.post_json(self.s.port, "/v1/completions", {"prompt": "w " * 64, "max_tokens": None})
        self.assertOpenAIError(st, out, 400, "maximum context length is 64 tokens")

    def test_validation_errors(self):
        cases = [
            ({"prompt": "a", "stream": False, "stream_options": {"include_usage": True}}, 400,
             "Stream options can only be defined when `stream=True`."),
            ({"prompt": "a", "max_tokens": 2, "min_tokens": 3}, 400, "min_tokens must be less than or equal"),
            ({"prompt": "a b c", "max_tokens": 62}, 400, "maximum context length is 64 tokens"),
            ({"prompt": "a", "model": "nope"}, 404, "does not exist"),
            ({"max_tokens": 2}, 400, "'prompt' is required"),
            ({"prompt": "a", "max_tokens": "2"}, 400, "must be an integer"),
        ]
        for body, status, needle in cases:
            st, h, resp = t.post_json(self.s.port, "/v1/completions", body)
            self.assertOpenAIError(st, resp, status, needle)
            self.assertEqual(h["content-type"], "application/json")
        st, _, raw = t.request(self.s.port, "POST", "/v1/completions", '{"prompt": "a",')
        self.assertOpenAIError(st, json.loads(raw), 400, "malformed JSON")
        st, _, resp = t.post_json(self.s.port, "/v1/chat/completions", {"messages": "hi"})
        self.assertOpenAIError(st, resp, 400, "messages")
        st, _, raw = t.request(self.s.port, "GET", "/v1/completions")
        self.assertEqual(st, 405)
        st, _, raw = t.request(self.s.port, "GET", "/nope")
        self.assertEqual(st, 404)

    def test_charset_content_type_accepted(self):
        st, _, body = t.post_json(self.s.port, "/v1/completions", {"prompt": "a", "max_tokens": 1},
                                  headers={"Content-Type": "application/json; charset=utf-8"})
        self.assertEqual(st, 200, body)

    def test_models_health_tokenize_metrics(self):
        st, _, raw = t.request(self.s.port, "GET", "/v1/models")
        m = json.loads(raw)
        self.assertEqual(st, 200)
        self.assertEqual(m["data"][0]["id"], "sim-model")
        self.assertEqual(m["data"][0]["root"], "sim-model")
        self.assertEqual(m["data"][0]["max_model_len"], 64)
        self.assertEqual(t.request(self.s.port, "GET", "/health")[0], 200)
        st, _, tok = t.post_json(self.s.port, "/tokenize", {"prompt": "a b c d"})
        self.assertEqual((st, tok["count"], len(tok["tokens"])), (200, 4, 4))
        t.post_json(self.s.port, "/v1/completions", {"prompt": "a b c d", "max_tokens": 3})
        m = t.metrics(self.s.port)
        for name in ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                     "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "xpyd_sim:handoffs_total",
                     "xpyd_sim:kv_leases_active", "xpyd_sim:kv_leases_expired_total"]:
            self.assertIn(name, m)
        self.assertEqual(m['vllm:prompt_tokens_total{engine="0",model_name="sim-model"}'], 4)
        self.assertEqual(m['vllm:generation_tokens_total{engine="0",model_name="sim-model"}'], 3)

    def test_disconnect_aborts_request(self):
        # 60 tokens take 3 s here: a loaded CI machine must not finish the stream before the client leaves
        self.s = self.start(t.sim("--decode-us-per-token", "50000", "--max-model-len", "64"))
        st = t.Stream(self.s.port, "/v1/completions", {"prompt": "a", "max_tokens": 60, "stream": True,
                                                       "ignore_eos": True})
        ev = st.events()
        next(ev)
        next(ev)
        self.assertEqual(t.metric(self.s.port, "vllm:num_requests_running"), 1)
        st.close()
        t.wait_until(lambda: t.metric(self.s.port, "xpyd_sim:requests_aborted_total") == 1, what="abort")
        self.assertEqual(t.metric(self.s.port, "vllm:num_requests_running"), 0)
        # a non-streamed request abandoned while it computes is aborted too
        c = socket.create_connection(("127.0.0.1", self.s.port))
        body = json.dumps({"prompt": "a", "max_tokens": 60})
        c.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   "Content-Length: %d\r\n\r\n%s" % (len(body), body)).encode())
        t.wait_until(lambda: t.metric(self.s.port, "vllm:num_requests_running") == 1, what="running")
        c.close()
        t.wait_until(lambda: t.metric(self.s.port, "xpyd_sim:requests_aborted_total") == 2, what="abort 2")
        self.assertEqual(t.metric(self.s.port, "vllm:num_requests_running"), 0)


class SimBatching(t.TestCase):
    def test_excess_waits_then_runs(self):
        s = self.start(t.sim("--decode-us-per-token", "2000", "--max-batch", "1"))
        a = t.Stream(s.port, "/v1/completions", {"prompt": "a", "max_tokens": 30, "stream": True}, lazy=True)
        b = t.Stream(s.port, "/v1/completions", {"prompt": "b", "max_tokens": 3, "stream": True}, lazy=True)
        t.wait_until(lambda: t.metric(s.port, "vllm:num_requests_waiting") == 1, what="one waiting")
        self.assertEqual(t.metric(s.port, "vllm:num_requests_running"), 1)
        self.assertEqual(len(t.content_events(a.read_all())), 30)
        self.assertEqual(len(t.content_events(b.read_all())), 3)
        m = t.metrics(s.port)
        self.assertEqual((m["vllm:num_requests_running"], m["vllm:num_requests_waiting"]), (0, 0))


class SimFaults(t.TestCase):
    def test_status_code(self):
        s = self.start(t.sim("--status-code", "503"))
        st, _, body = t.post_json(s.port, "/v1/completions", {"prompt": "a"})
        self.assertOpenAIError(st, body, 503, "injected")
        self.assertEqual(t.request(s.port, "GET", "/health")[0], 200)

    def test_fail_rate(self):
        s = self.start(t.sim("--fail-rate", "1"))
        st, _, body = t.post_json(s.port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})
        self.assertOpenAIError(st, body, 500, "--fail-rate")
        self.assertEqual(t.metric(s.port, 'xpyd_sim:faults_injected_total{kind="fail_rate"}'), 1)

    def test_fail_after_tokens_cuts_stream(self):
        s = self.start(t.sim("--fail-after-tokens", "2", "--decode-us-per-token", "100"))
        st = t.Stream(s.port, "/v1/completions", {"prompt": "a", "max_tokens": 10, "stream": True})
        payloads = st.read_all()
        self.assertEqual(len(t.content_events(payloads)), 2)
        self.assertNotIn("[DONE]", payloads)
        t.wait_until(lambda: t.metric(s.port, "vllm:num_requests_running") == 0, what="slot freed")

    def test_stall(self):
        s = self.start(t.sim("--stall-ms", "3000"))
        with self.assertRaises(socket.timeout):
            t.request(s.port, "POST", "/v1/completions", {"prompt": "a", "max_tokens": 1}, timeout=0.3)
        self.assertEqual(t.metric(s.port, 'xpyd_sim:faults_injected_total{kind="stall"}'), 1)

    def test_startup_delay_is_polled(self):
        """--startup-delay-ms: nothing listens (no port file) until the delay is over, then /health answers
        at once, so launch scripts that poll readiness are exercised."""
        import time
        t0 = time.monotonic()
        s = self.start(t.Proc("xpyd_sim", ["--port", "0", "--log-level", "warn", "--startup-delay-ms", "700"],
                              ready_path=None))
        waited = time.monotonic() - t0
        self.assertGreaterEqual(waited, 0.6, "the port was there before the start-up delay was over")
        self.assertEqual(t.request(s.port, "GET", "/health")[0], 200)

    def test_port_in_use_exits_cleanly(self):
        """A port it cannot listen on: exit 1 with the reason, nothing leaked (the sanitized build's leak check
        runs this too: the event base was left behind)."""
        busy = socket.socket()
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        self.addCleanup(busy.close)
        out = subprocess.run([os.path.join(t.BIN, "xpyd_sim"), "--port", str(busy.getsockname()[1])],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 1, out.stderr)
        self.assertIn("cannot listen", out.stderr)
        self.assertNotIn("LeakSanitizer", out.stderr)
        self.assertNotIn("ERROR: AddressSanitizer", out.stderr)


class SimBackpressure(t.TestCase):
    def test_a_paused_reader_holds_the_stream_back(self):
        """A reader that stops taking a fast stream costs the engine --stream-buffer-bytes, not the whole answer
        (about 40 MB here); generation goes on when it reads again, and every token arrives."""
        n = 200000
        # (under ASan a small quarantine: freed memory held back for its checks is not what this measures, and
        # its default 256 MiB made the resident size follow every byte the stream had sent)
        asan = os.environ.get("ASAN_OPTIONS", "")
        s = self.start(t.sim("--decode-us-per-token", "0", "--max-model-len", str(n + 100),
                             env={"ASAN_OPTIONS": asan + ":quarantine_size_mb=1"} if asan else None))
        rss0 = t.rss_kib(s.p.pid)
        c = socket.socket()
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        c.connect(("127.0.0.1", s.port))
        body = json.dumps({"prompt": "a", "max_tokens": n, "stream": True, "ignore_eos": True})
        c.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   "Content-Length: %d\r\n\r\n%s" % (len(body), body)).encode())
        self.addCleanup(c.close)
        t.wait_until(lambda: t.metric(s.port, "xpyd_sim:stream_backpressure_waits_total") > 100,
                     what="generation held back")
        pending = t.metric(s.port, "xpyd_sim:stream_bytes_pending")
        self.assertLessEqual(pending, 262144 + 4096)  # the bound, plus at most one step's event
        gen = t.metric(s.port, "vllm:generation_tokens_total")
        self.assertLess(gen, n // 4)  # the kernel's buffers and the bound, not the answer
        self.assertLess(t.rss_kib(s.p.pid) - rss0, 32 * 1024)
        # reading again: the stream resumes and completes, every token once
        parts = []
        c.settimeout(30)
        while not (parts and b"".join(parts[-2:]).endswith(b"\r\n0\r\n\r\n")):
            d = c.recv(1 << 20)
            self.assertTrue(d, "the stream ended early")
            parts.append(d)
        data = b"".join(parts)
        self.assertEqual(data.count(b'"text":'), n)
        self.assertEqual(data.count(b"data: [DONE]"), 1)
        t.wait_until(lambda: t.metric(s.port, "vllm:num_requests_running") == 0, what="request done")


if __name__ == "__main__":
    t.main()
