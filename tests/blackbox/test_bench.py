# SPDX-License-Identifier: Apache-2.0
"""xpyd_bench against sims with known timing reproduces that timing (TTFT ~ prefill + first token, ITL ~ the
configured per-token delay, within a generous tolerance: loopback and a shared 2-core machine add noise),
counts failures when the sims inject them, and writes benchmark_serving's JSON keys."""
import json
import os
import subprocess

import xpyd_testlib as t


def run_bench(port, *args):
    out = os.path.join(t.tmpdir(prefix="xpyd-bench-"), "r.json")
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
        s = self.start(t.sim("--decode-us-per-token", "100000"))
        rc, out, r = run_bench(s.port, "--backend", "openai-chat", "--num-prompts", "5", "--random-output-len", "7",
                               "--ignore-eos")
        self.assertEqual((rc, r["completed"], r["total_output_tokens"]), (0, 5, 35))
        # the role chunk carries choices: it sets TTFT and one ITL gap more than content chunks alone
        self.assertEqual(len(r["itls"][0]), 7)
        # the prefill yields the first token: no 100 ms decode step in TTFT (half a step of margin: a loaded CI
        # machine under ASan once took 15.2 ms against a 20 ms step and a 15 ms bound)
        self.assertLess(r["mean_ttft_ms"], 50)


NPM_DIR = t.NPM_DIR


class Accounting(t.TestCase):
    """Honest numbers: token counts are the server's (usage), the prompts hold their requested length for real
    tokenizers, and the result file has benchmark_serving's keys."""

    def test_input_tokens_are_the_servers(self):
        # chat: the sim counts one role token per message on top of the words, as a chat template adds tokens;
        # the bench reports what the server counted, not what it asked for
        s = self.start(t.sim("--decode-us-per-token", "100"))
        rc, out, r = run_bench(s.port, "--backend", "openai-chat", "--num-prompts", "6", "--random-input-len", "20",
                               "--random-output-len", "5", "--ignore-eos", "--goodput", "ttft:60000", "e2el:60000")
        self.assertEqual(rc, 0, out)
        self.assertEqual(r["input_lens"], [21] * 6)
        self.assertEqual(r["total_input_tokens"], 126)
        self.assertIn("Total input tokens:                     126", out)
        for k in ("date", "tokenizer_id", "request_goodput", "generated_texts"):
            self.assertIn(k, r)
        self.assertRegex(r["date"], r"^\d{8}-\d{6}$")
        self.assertAlmostEqual(r["request_goodput"], r["request_throughput"], places=6)  # generous SLOs: all good
        self.assertEqual([len(x.split()) for x in r["generated_texts"]], [5] * 6)
        # an SLO no request meets: goodput 0; without --goodput: null, as benchmark_serving writes it
        rc, out, r = run_bench(s.port, "--num-prompts", "3", "--random-output-len", "3", "--goodput", "ttft:0.001")
        self.assertEqual(r["request_goodput"], 0)
        rc, out, r = run_bench(s.port, "--num-prompts", "2", "--random-output-len", "2")
        self.assertIsNone(r["request_goodput"])

    def test_tokenizer_free_prompts_are_token_ids(self):
        s = self.start(t.sim("--decode-us-per-token", "100"))
        rc, out, r = run_bench(s.port, "--tokenizer-free", "--num-prompts", "4", "--random-input-len", "37",
                               "--random-output-len", "3")
        self.assertEqual(rc, 0, out)
        self.assertEqual(r["input_lens"], [37] * 4)
        # prefix-repetition in ids: shared prefixes an engine caches by its token ids
        c = self.start(t.sim("--decode-us-per-token", "100", "--prefix-caching", "on"))
        rc, out, r = run_bench(c.port, "--tokenizer-free", "--dataset-name", "prefix-repetition",
                               "--prefix-repetition-prefix-len", "64", "--prefix-repetition-suffix-len", "7",
                               "--prefix-repetition-num-prefixes", "2", "--prefix-repetition-output-len", "2",
                               "--num-prompts", "6", "--max-concurrency", "1")
        self.assertEqual(rc, 0, out)
        self.assertEqual(r["input_lens"], [71] * 6)
        self.assertEqual(t.metric(c.port, 'vllm:prefix_cache_hits_total{engine="0",model_name="sim-model"}'), 4 * 64)
        p = subprocess.run([os.path.join(t.BIN, "xpyd_bench"), "--tokenizer-free", "--backend", "openai-chat"],
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 2)
        self.assertIn("only completions", p.stderr)

    def test_prompt_words_are_one_token_each_in_real_vocabularies(self):
        # the words xpyd_bench builds prompts from, checked against OpenAI's cl100k_base and o200k_base (the
        # vocabularies Llama 3 and Qwen extend): a prompt of N words is N tokens, within the 10 %
        t.npm_package("gpt-tokenizer")  # installed if missing (skipped, saying why, only when it cannot be)
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "bench_workload.c")) as f:
            src = f.read()
        table = src.split("prompt_words[] = {", 1)[1].split("};", 1)[0]
        words = json.loads("[" + table.strip().rstrip(",") + "]")
        self.assertGreater(len(words), 100)
        # prompts as the bench makes them: random words joined by single spaces
        import random
        rnd = random.Random(7)
        prompts = [" ".join(rnd.choice(words) for _ in range(n)) for n in (1, 16, 128, 1000)]
        js = ("const cl=require('gpt-tokenizer/cjs/encoding/cl100k_base');"
              "const o2=require('gpt-tokenizer/cjs/encoding/o200k_base');"
              "const ps=JSON.parse(require('fs').readFileSync(0,'utf8'));"
              "console.log(JSON.stringify(ps.map(p=>[cl.encode(p).length,o2.encode(p).length])));")
        out = subprocess.run(["node", "-e", js], input=json.dumps(prompts), capture_output=True, text=True,
                             env=dict(os.environ, NODE_PATH=os.path.join(NPM_DIR, "node_modules")), timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        counts = json.loads(out.stdout)
        for p, (cl, o2) in zip(prompts, counts):
            n = len(p.split())
            self.assertLessEqual(abs(cl - n), n * 0.1, (n, cl))
            self.assertLessEqual(abs(o2 - n), n * 0.1, (n, o2))
        self.assertEqual([c for c, _ in counts], [1, 16, 128, 1000])  # in fact exact


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



class Micro(t.TestCase):
    def test_kv_lookup_checks_its_answers(self):
        # the KV-event index micro-benchmark exits 1 on a wrong answer: a lookup's leading blocks per rank, a prompt
        # taken in as vLLM, vLLM --block-size 64 and SGLang's pages of one token publish it (held whole, then none)
        p = subprocess.run([os.path.join(t.BIN, "xpyd_kv_lookup"), "50"], capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        got = json.loads(p.stdout)
        self.assertEqual((got["prompt_tokens"], got["blocks"], got["ranks"]), (8192, 512, 64))
        for k in ("precise_lookup_us", "ingest_vllm_us", "ingest_vllm_block64_us", "ingest_sglang_page1_us"):
            self.assertGreater(got[k], 0, k)


if __name__ == "__main__":
    t.main()
