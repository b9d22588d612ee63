"""xpyd_bench against sims with known timing reproduces that timing (TTFT ~ prefill + first token, ITL ~ the
configured per-token delay, within a generous tolerance: loopback and a shared 2-core machine add noise),
counts failures when the sims inject them, and writes benchmark_serving's JSON keys."""
import json
import os
import subprocess
import tempfile

import xpyd_testlib as t


def run_bench(port, *args):
    out = os.path.join(tempfile.mkdtemp(prefix="xpyd-bench-"), "r.json")
    p = subprocess.run([os.path.join(t.BIN, "xpyd_bench"), "--port", str(port), "--disable-tqdm", "--save-result",
                        "--result-filename", out] + list(args), capture_output=True, text=True, timeout=120)
    with open(out) as f:
        return p.returncode, p.stdout, json.load(f)


class Timing(t.TestCase):
    def test_reproduces_engine_timing(self):
        # 40-word prompts at 1 ms per prompt token = 40 ms prefill; then one token every 20 ms
        s = self.start(t.sim("--prefill-us-per-token", "1000", "--decode-us-per-token", "20000"))
        rc, out, r = run_bench(s.port, "--num-prompts", "8", "--max-concurrency", "4", "--random-input-len", "40",
                               "--random-output-len", "10", "--ignore-eos", "--percentile-metrics", "ttft,tpot,itl,e2el")
        self.assertEqual(rc, 0, out)
        self.assertEqual(r["completed"], 8)
        self.assertEqual(r["total_output_tokens"], 80)
        # TTFT = the prefill (40 ms), whose forward pass yields the first token, as in vLLM
        self.assertGreater(r["mean_ttft_ms"], 38)
        self.assertLess(r["mean_ttft_ms"], 70)
        self.assertGreater(r["median_itl_ms"], 18)
        self.assertLess(r["median_itl_ms"], 24)
        self.assertAlmostEqual(r["mean_tpot_ms"], r["mean_itl_ms"], delta=2)
        for k in ["request_throughput", "output_throughput", "p99_ttft_ms", "ttfts", "itls", "input_lens",
                  "output_lens", "errors", "duration", "mean_e2el_ms"]:
            self.assertIn(k, r)
        self.assertEqual(len(r["ttfts"]), 8)
        self.assertEqual(len(r["itls"][0]), 9)
        for line in ["Serving Benchmark Result", "Successful requests:", "Mean TTFT (ms):", "Mean TPOT (ms):",
                     "P99 ITL (ms):", "Output token throughput (tok/s):"]:
            self.assertIn(line, out)

    def test_chat_backend(self):
        s = self.start(t.sim("--decode-us-per-token", "20000"))
        rc, out, r = run_bench(s.port, "--backend", "openai-chat", "--num-prompts", "5", "--random-output-len", "7",
                               "--ignore-eos")
        self.assertEqual((rc, r["completed"], r["total_output_tokens"]), (0, 5, 35))
        # the role chunk carries choices: it sets TTFT and one ITL gap more than content chunks alone
        self.assertEqual(len(r["itls"][0]), 7)
        self.assertLess(r["mean_ttft_ms"], 15)  # the prefill yields the first token: no 20 ms step in TTFT


class Failures(t.TestCase):
    def test_injected_failures_are_counted(self):
        s = self.start(t.sim("--fail-rate", "1"))
        rc, out, r = run_bench(s.port, "--num-prompts", "6", "--random-output-len", "4")
        self.assertEqual(rc, 1)
        self.assertEqual((r["completed"], r["failed"]), (0, 6))
        self.assertTrue(all(e.startswith("HTTP 500") for e in r["errors"]), r["errors"])
        self.assertIn("Failed requests:                        6", out)

    def test_cut_streams_are_failures(self):
        s = self.start(t.sim("--fail-after-tokens", "2", "--decode-us-per-token", "0"))
        rc, out, r = run_bench(s.port, "--num-prompts", "4", "--random-output-len", "10", "--ignore-eos")
        self.assertEqual(r["failed"], 4)
        self.assertTrue(all("without [DONE]" in e or "connection" in e for e in r["errors"]), r["errors"])

    def test_through_the_router_direct_baseline(self):
        p = self.start(t.sim("--role", "prefill"))
        d = self.start(t.sim("--role", "decode", "--decode-us-per-token", "0"))
        rc, out, r = run_bench(d.port, "--direct-prefill", "127.0.0.1:%d" % p.port, "--num-prompts", "5",
                               "--random-output-len", "6", "--ignore-eos")
        self.assertEqual((rc, r["completed"]), (0, 5), out)
        self.assertEqual(t.metric(d.port, 'xpyd_sim:handoffs_total{mode="kv-params",result="done"}'), 5)


if __name__ == "__main__":
    t.main()
