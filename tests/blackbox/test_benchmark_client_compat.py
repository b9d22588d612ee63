# SPDX-License-Identifier: Apache-2.0
"""The router through the eyes of vLLM's benchmark_serving.py. The real script cannot be installed here (no
PyPI), so this is a standard-library port of its request functions for the `vllm`/`openai` backends
(POST /v1/completions) and `openai-chat` (POST /v1/chat/completions): the same payloads and headers, the
same line-by-line SSE handling (strip, drop "data: ", skip "[DONE]"), TTFT at the first chunk with choices,
ITL between such chunks, output length from the usage chunk, and its failure rule (no valid chunk = failed).
It must complete with zero failures, and its numbers must match what the sims were told to do."""
import http.client
import json
import statistics
import threading
import time

import xpyd_testlib as t


def request_func(port, backend, prompt, output_len):
    """Port of async_request_openai_completions / async_request_openai_chat_completions."""
    out = {"success": False, "ttft": 0.0, "itl": [], "output_tokens": 0, "generated_text": "", "error": ""}
    if backend == "openai-chat":
        path = "/v1/chat/completions"
        payload = {"model": "sim-model", "messages": [{"role": "user", "content": prompt}], "temperature": 0.0,
                   "max_completion_tokens": output_len, "stream": True, "stream_options": {"include_usage": True},
                   "ignore_eos": True}
    else:
        path = "/v1/completions"
        payload = {"model": "sim-model", "prompt": prompt, "temperature": 0.0, "repetition_penalty": 1.0,
                   "max_tokens": output_len, "logprobs": None, "stream": True,
                   "stream_options": {"include_usage": True}, "ignore_eos": True}
    headers = {"Content-Type": "application/json", "Authorization": "Bearer EMPTY"}
    st = time.perf_counter()
    most_recent = st
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        c.request("POST", path, body=json.dumps(payload), headers=headers)
        resp = c.getresponse()
        if resp.status != 200:
            out["error"] = "HTTP %d %s" % (resp.status, resp.read()[:200])
            return out
        first = False
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line:
                continue
            chunk = line.decode("utf-8")
            if chunk.startswith("data: "):
                chunk = chunk[len("data: "):]
            if chunk == "[DONE]":
                continue
            data = json.loads(chunk)
            choices = data.get("choices")
            if choices:
                text = choices[0].get("text") if backend != "openai-chat" else choices[0]["delta"].get("content")
                now = time.perf_counter()
                if not first:
                    first = True
                    out["ttft"] = now - st
                else:
                    out["itl"].append(now - most_recent)
                most_recent = now
                out["generated_text"] += text or ""
            elif data.get("usage"):
                out["output_tokens"] = data["usage"].get("completion_tokens")
        if first:
            out["success"] = True
        else:
            out["error"] = "Never received a valid chunk to calculate TTFT."
    finally:
        c.close()
    return out


class BenchmarkServingCompat(t.TestCase):
    def run_backend(self, port, backend, n=16, conc=4, out_len=12):
        results, lock = [], threading.Lock()
        sem = threading.Semaphore(conc)

        def one(i):
            with sem:
                r = request_func(port, backend, "w%d " % i + "tok " * 40, out_len)
            with lock:
                results.append(r)

        ths = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for th in ths:
            th.start()
        for th in ths:
            th.join(120)
        return results

    def test_backends_complete_with_sim_timing(self):
        # prefill: 41 prompt tokens at 500 us = ~20 ms; decode: 20 ms per token
        p = self.start(t.sim("--role", "prefill", "--prefill-us-per-token", "500"))
        ds = [self.start(t.sim("--role", "decode", "--decode-us-per-token", "20000")) for _ in range(2)]
        r = self.start(t.router([p.port], [d.port for d in ds]))
        for backend in ("vllm", "openai", "openai-chat"):
            res = self.run_backend(r.port, backend)
            failed = [x["error"] for x in res if not x["success"]]
            self.assertEqual(failed, [], backend)
            self.assertEqual({x["output_tokens"] for x in res}, {12}, backend)
            itl = statistics.median(v for x in res for v in x["itl"][1:])
            self.assertGreater(itl, 0.018, backend)
            self.assertLess(itl, 0.025, backend)
            ttft = statistics.median(x["ttft"] for x in res)
            self.assertGreater(ttft, 0.018, backend)   # at least the prefill
            self.assertLess(ttft, 0.080, backend)
        t.wait_until(lambda: t.router_idle(r.port), what="idle")
        self.assertEqual(t.metric(p.port, "xpyd_sim:kv_leases_active"), 0)

    def test_backends_complete_through_mooncake_handoff(self):
        # --handoff mooncake over sims: a DP-2 prefill learned from its /query, two decodes; every request of
        # every backend completes with the requested output length, and every transfer was claimed
        boot = t.free_port()
        p = self.start(t.sim("--role", "prefill", "--handoff", "mooncake", "--dp-size", "2", "--dp-mode", "internal",
                             "--bootstrap-port", str(boot), "--prefill-us-per-token", "100"))
        ds = [self.start(t.sim("--role", "decode", "--handoff", "mooncake", "--decode-us-per-token", "2000"))
              for _ in range(2)]
        r = self.start(t.router([p.port], [d.port for d in ds], "--handoff", "mooncake",
                                "--prefill-bootstrap-port", str(boot)))
        for backend in ("vllm", "openai", "openai-chat"):
            res = self.run_backend(r.port, backend, n=24, conc=8)
            failed = [x["error"] for x in res if not x["success"]]
            self.assertEqual(failed, [], backend)
            self.assertEqual({x["output_tokens"] for x in res}, {12}, backend)
        t.wait_until(lambda: t.router_idle(r.port), what="idle")
        done = sum(t.metric(d.port, 'xpyd_sim:handoffs_total{mode="mooncake",result="done"}') for d in ds)
        self.assertEqual(done, 72)
        t.wait_until(lambda: t.metric(p.port, "xpyd_sim:kv_leases_active") == 0, what="every transfer claimed")
        self.assertEqual(t.metric(p.port, "xpyd_sim:kv_leases_expired_total"), 0)


if __name__ == "__main__":
    t.main()
