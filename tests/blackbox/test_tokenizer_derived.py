#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""libxpyd_tokenizer (through xpyd_tokenize) against Hugging Face's own tokenizers on model files derived from the
shipped ones, for the rules those models do not exercise (test_tokenizer.py has the shipped models; this file is
apart so that each runs within its time limit under load): added tokens that are prefixes of others,
lstrip/rstrip, normalized (a fixed set, and seeded random sets of overlapping tokens with random flags, their ids
as Hugging Face gives them at load); Split pre-tokenizers that cut and a two-byte Replace; Metaspace with each
prepend_scheme; every Split behaviour, inverted or not, on patterns that match empty strings too; ByteLevel's
add_prefix_space; merges as Hugging Face reads them."""
import json
import os
import random
import subprocess
import unicodedata

import oracle_cache
import xpyd_testlib as t
from test_tokenizer import CORPUS, model_dir, random_strings

SANITIZED = os.environ.get("XPYD_SANITIZED") == "ON"


def tiny_byte_level():
    """A byte-level BPE model small enough to load at once (GPT-2's byte alphabet, a merge for every pair of
    "abcxq12" and the byte-level space, so that any cut between two of them shows in the ids; <|endoftext|>
    added): for the pre-tokenizer rules, which do not depend on the vocabulary's size."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    vocab = {chr(c): b for b, c in zip(bs, cs)}
    chars = list("abcxq12") + ["\u0120"]
    merges = ["%s %s" % (a, b) for a in chars for b in chars]
    for m in merges:
        vocab.setdefault(m.replace(" ", ""), len(vocab))
    return {"version": "1.0", "truncation": None, "padding": None, "normalizer": None, "post_processor": None,
            "decoder": None, "added_tokens": [{"id": len(vocab), "content": "<|endoftext|>", "single_word": False,
                                                "lstrip": False, "rstrip": False, "normalized": False,
                                                "special": True}],
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                              "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                      "merges": merges}}


class DerivedModels(t.TestCase):
    def test_added_token_rules_on_a_derived_model(self):
        # Qwen 3's files with added tokens the shipped models lack: one a prefix of another (the longest wins),
        # lstrip/rstrip (the whitespace around goes with the token), normalized (matched after NFC); written to
        # a temporary directory, both tokenizers load the same file
        with open(os.path.join(model_dir("qwen3"), "tokenizer.json"), encoding="utf-8") as f:
            d = json.load(f)
        base = max(a["id"] for a in d["added_tokens"]) + 1

        def tok(k, content, **kw):
            e = {"id": base + k, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
                 "normalized": False, "special": False}
            e.update(kw)
            return e
        d["added_tokens"] += [tok(0, "<think"), tok(1, "<thinker>"), tok(2, "[MASK]", lstrip=True, rstrip=True),
                              tok(3, "caf\u00e9!", normalized=True), tok(4, "<sp>", special=True, rstrip=True)]
        texts = ["<think> a", "<thinker> b <think", "x<thinker><think>y", "a  [MASK]  b", "[MASK]", " \t[MASK]\n",
                 "cafe\u0301! and caf\u00e9!", "<sp>  z", "<sp><think><sp>", "<thi nk>",
                 "<think <thinker><think>"]  # a token just matched that a longer one extends is not taken again
        mine = self.assertSameOnDerived(d, texts)
        self.assertIn(base + 1, mine[1])  # <thinker>, not <think> + "er>"

    def test_invalid_utf8_after_an_rstrip_token_is_refused(self):
        # rstrip takes the white space after a token; bytes that only look like one (E2 80 then not a
        # continuation byte) are invalid UTF-8 and the input is refused, not stripped (found by fuzz_tokenizer)
        with open(os.path.join(model_dir("qwen3"), "tokenizer.json"), encoding="utf-8") as f:
            d = json.load(f)
        d["added_tokens"].append({"id": 0, "content": "[MASK]", "single_word": False, "lstrip": True,
                                  "rstrip": True, "normalized": False, "special": False})
        tmp = t.tmpdir(prefix="xpyd-tok-")
        with open(os.path.join(tmp, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(d, f, ensure_ascii=False)
        for raw, ok in [(b"a [MASK]\xe2\x80E b", False), (b"a [MASK]\xe2\x80\x83b", True), (b"[MASK]\xe2\x80", False)]:
            p = subprocess.run([os.path.join(t.BIN, "xpyd_tokenize"), "--tokenizer", tmp], input=raw,
                               capture_output=True, timeout=60)
            with self.subTest(text=raw):
                self.assertEqual(p.returncode, 0 if ok else 1, p.stderr)
                if not ok:
                    self.assertIn(b"UTF-8", p.stderr)

    def assertSameOnDerived(self, d, texts):
        """tokenizer.json d written to a temporary directory, loaded by both tokenizers: the same ids for texts."""
        tmp = t.tmpdir(prefix="xpyd-tok-")
        with open(os.path.join(tmp, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(d, f, ensure_ascii=False)
        args = ["--tokenizer", tmp, "--jsonl"]
        inp = "".join(json.dumps(s) + "\n" for s in texts)
        p = subprocess.run([os.path.join(t.BIN, "xpyd_tokenize")] + args, input=inp, capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        mine = [json.loads(l) for l in p.stdout.splitlines()]
        theirs = oracle_cache.hf_ids(os.path.join(tmp, "tokenizer.json"), texts, timeout=120)
        self.assertEqual(len(mine), len(texts))
        self.assertEqual(list(zip(texts, mine)), list(zip(texts, theirs)))
        return mine

    def test_random_added_tokens_on_derived_models(self):
        # seeded random sets of added tokens that overlap (prefixes of each other, sharing ends), each with random
        # lstrip/rstrip/normalized/special, on a byte-level (Qwen 3) and a SentencePiece-style (Llama 2) model,
        # over texts made of their pieces, whitespace and words
        rnd = random.Random(31)
        alphabet = ["<", "a", "b", "|", ">", "é", "e\u0301", "x"]
        for name in ("qwen3", "llama2"):
            with open(os.path.join(model_dir(name), "tokenizer.json"), encoding="utf-8") as f:
                base = json.load(f)
            for round_ in range(3):
                d = json.loads(json.dumps(base))
                first = max([a["id"] for a in d["added_tokens"]] + list(d["model"]["vocab"].values())) + 1
                contents, forms = set(), set()
                while len(contents) < 12:  # no two alike after NFC: which of two equal patterns Hugging Face takes
                    c = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 4)))  # depends on a hash map's order
                    if unicodedata.normalize("NFC", c) not in forms:
                        contents.add(c)
                        forms.add(unicodedata.normalize("NFC", c))
                toks = []
                for k, content in enumerate(sorted(contents)):
                    toks.append({"id": first + k, "content": content, "single_word": False,
                                 "lstrip": rnd.random() < 0.3, "rstrip": rnd.random() < 0.3,
                                 "normalized": rnd.random() < 0.3, "special": rnd.random() < 0.5})
                d["added_tokens"] += toks
                pieces = sorted(contents) + [" ", "  ", "\n", "\t", "hello", "ab", "<", "é", "x y", "\u00a0",
                                             "\u3000", "\u2028", "\u0085", "\u200b", "\x1c"]  # (\u200b, \x1c: no \s)
                texts = ["".join(rnd.choice(pieces) for _ in range(rnd.randint(1, 10))) for _ in range(150)]
                with self.subTest(model=name, round=round_, tokens=toks):
                    self.assertSameOnDerived(d, texts)

    def test_metaspace_on_derived_models(self):
        # Mistral's and older Llama 2 files pre-tokenize with Metaspace (no normalizer): Llama 2's file that way,
        # each prepend_scheme (first: only the input's first piece, not one after an added token), with and
        # without split, the old add_prefix_space form, and Metaspace then a Split
        with open(os.path.join(model_dir("llama2"), "tokenizer.json"), encoding="utf-8") as f:
            base = json.load(f)
        texts = ["Hello world", "<s>Hello world", "Hi</s> there  you", " lead", "trail ", "a  b   c", "\u2581x y",
                 "", " ", "你好 世界 😀", "<s> x</s>y", "x<s>", "12 345 6789"] + CORPUS[:20] + \
            random_strings("llama2", 200, 77)
        ms = {"type": "Metaspace", "replacement": "\u2581"}
        for pre in [dict(ms, prepend_scheme="first", split=False), dict(ms, prepend_scheme="first", split=True),
                    dict(ms, prepend_scheme="always", split=True), dict(ms, prepend_scheme="always", split=False),
                    dict(ms, prepend_scheme="never", split=True), dict(ms, add_prefix_space=True),
                    {"type": "Sequence", "pretokenizers": [
                        dict(ms, prepend_scheme="first", split=False),
                        {"type": "Split", "pattern": {"Regex": "\\d"}, "behavior": "Isolated", "invert": False}]}]:
            with self.subTest(pre_tokenizer=pre):
                self.assertSameOnDerived(dict(base, normalizer=None, pre_tokenizer=pre), texts)

    def test_digits_variants_on_a_derived_model(self):
        # Digits (Command R's pre-tokenizer: test_model_families has it with individual_digits) both ways, first
        # or after another split, on Llama 3.1's files (a vocabulary with tokens of up to three digits, which
        # Command R's has none of): runs of numerals of every script stay whole or fall apart
        with open(os.path.join(model_dir("llama3_1"), "tokenizer.json"), encoding="utf-8") as f:
            base = json.load(f)
        split, blevel = base["pre_tokenizer"]["pretokenizers"]
        texts = ["2026", "x 2026 y", "a1b22c333 d4444", "3.14159 1,000,000", "٠١٢٣ ١٢", "²³ ½ ¾ Ⅻ ①②", "１２３ 𝟙𝟚",
                 "v1.2.3-rc4", "  12  ", "\n7\n"] + CORPUS[:20]
        variants = [[{"type": "Digits", "individual_digits": False}, blevel],
                    [{"type": "Digits", "individual_digits": True}, blevel],
                    [split, {"type": "Digits", "individual_digits": False}, blevel],
                    [{"type": "Digits", "individual_digits": True}, dict(blevel, use_regex=True)]]
        for pre in variants[:2] if SANITIZED else variants:  # (each a 9-MB file loaded twice: slow under ASan)
            with self.subTest(pre_tokenizer=pre):
                mine = self.assertSameOnDerived(dict(base, pre_tokenizer={"type": "Sequence", "pretokenizers": pre}),
                                                texts)
                self.assertEqual(len(mine[0]), 4 if pre[0].get("individual_digits") else 2)  # 2026: "202", "6"
        # without individual_digits (a required field) Hugging Face refuses the file; so does the library
        tmp = t.tmpdir(prefix="xpyd-tok-")
        with open(os.path.join(tmp, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(dict(base, pre_tokenizer={"type": "Digits"}), f)
        p = subprocess.run([os.path.join(t.BIN, "xpyd_tokenize"), "--tokenizer", tmp], input="1", capture_output=True,
                           text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("Digits without individual_digits", p.stderr)

    def test_unicode_normal_forms_around_long_ascii_stretches(self):
        # the library normalizes only what lies between long ASCII stretches (64 bytes or more): combining marks
        # right after such a stretch compose with its last character, Hangul jamo compose across short ones;
        # each of the four forms on Llama 2's files (small: quick to load under ASan) against Hugging Face
        with open(os.path.join(model_dir("llama2"), "tokenizer.json"), encoding="utf-8") as f:
            base = json.load(f)
        rnd = random.Random(17)
        ascii_ = "the quick brown fox, 42 jumps; {code} over\n\tlazy dogs "
        odd = ["e\u0301", "\u0301", "\u0308", "A\u030a", "\u1100\u1161\u11a8", "\u1161", "\u11a8", "\uac00\u11a8",
               "\u212b", "\ufb01", "\u1e9b\u0323", "\u0323\u0307", "\u00e9", "\u3099", "\u304b\u3099", "①", "ｈ",
               "\u0b47\u0b3e", "\u0b3e", "\u0915\u093c", "\U0001d15e", "😀", "\u200d", "\u00a0"]
        texts = []
        for _ in range(120 if SANITIZED else 400):
            parts = []
            for _ in range(rnd.randint(1, 8)):
                k = rnd.choice([0, 1, 5, 62, 63, 64, 65, 130])
                parts.append((ascii_ * 4)[rnd.randint(0, 40):][:k])
                parts.append("".join(rnd.choice(odd) for _ in range(rnd.randint(0, 3))))
            texts.append("".join(parts))
        texts += ["a" * 64 + "\u0301", "a" * 63 + "\u0301" + "b" * 70 + "\u0308", "\u0301" + "x" * 100,
                  "\u1100" + "y" * 64 + "\u1161", "e" * 200 + "\u0301" * 3 + "e" * 64]
        for form in ("NFC", "NFD", "NFKC", "NFKD"):
            with self.subTest(normalizer=form):
                self.assertSameOnDerived(dict(base, normalizer={"type": form}), texts)

    def test_split_and_replace_variants_on_a_derived_model(self):
        # Gemma 3 replaces spaces before its Split on " " (MergedWithPrevious), so its split never cuts: these
        # variants of a SentencePiece-style model (Llama 2's files: smaller to load) make a Split cut (String and
        # Regex patterns, both behaviours) and a Replace match a pattern of two bytes in runs that overlap
        with open(os.path.join(model_dir("llama2"), "tokenizer.json"), encoding="utf-8") as f:
            base = json.load(f)
        texts = ["this is his list", "hello world  and   more", " lead", "trail ", "a1b22c333 d", "x  y", "   ", "", "tab\there",
                 "你好 世界", "😀 😀"] + CORPUS[:20]
        space = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
        variants = [
            # "this is" cut at each "s": "this", "\u2581is" merged (whole words of the vocabulary) against "thi", "s",
            # "\u2581i", "s" isolated
            (space, {"type": "Split", "pattern": {"String": "s"}, "behavior": "MergedWithPrevious", "invert": False}),
            (space, {"type": "Split", "pattern": {"String": "s"}, "behavior": "Isolated", "invert": False}),
            (space, {"type": "Split", "pattern": {"Regex": "\\d+"}, "behavior": "MergedWithPrevious",
                     "invert": False}),
            (space, {"type": "Split", "pattern": {"Regex": "\\d+"}, "behavior": "Isolated", "invert": False}),
            ({"type": "Sequence", "normalizers": [{"type": "Replace", "pattern": {"String": "  "},
                                                    "content": "\u2581"}, space]}, base["pre_tokenizer"]),
        ]
        for norm, pre in variants:
            with self.subTest(normalizer=norm, pre_tokenizer=pre):
                d = dict(base, normalizer=norm, pre_tokenizer=pre)
                self.assertSameOnDerived(d, texts)


    def test_every_split_behaviour_on_a_derived_model(self):
        # a byte-level model (tiny_byte_level) with a Split before ByteLevel: the five behaviours (a match alone,
        # removed, joined to the stretch before or after it, alike neighbours joined), each inverted or not (the
        # stretches between the matches are then the matches: GPT-4o's file keeps its regex's matches that way), on
        # patterns that can match an empty string - Hugging Face's onig cuts the text there too, except where the
        # last match ended
        base = tiny_byte_level()
        rnd = random.Random(23)
        pool = list("abx 1\nq.") + ["xx", "  ", "你", "😀", "\u0301", "'s", "<|endoftext|>"]
        texts = ["abxxc", "the cat sat", "xx", "x", "", " ", "a1b22c333 d", "  lead", "trail  ", "q", "xqx",
                 "你好 世界x", "😀x😀", "x\u0301x", "ab\nxx\n\ncd"] + \
            ["".join(rnd.choice(pool) for _ in range(rnd.randint(1, 14))) for _ in range(60 if SANITIZED else 150)]
        blevel = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
        patterns = [{"String": "x"}, {"Regex": "\\d+"}, {"Regex": "x*"}, {"Regex": "(?=x)|\\b"}, {"String": ""}]
        for pattern in patterns[2:4] if SANITIZED else patterns:  # (each variant two processes: fewer under ASan)
            for behavior in ("Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"):
                for invert in (False, True):
                    split = {"type": "Split", "pattern": pattern, "behavior": behavior, "invert": invert}
                    with self.subTest(split=split):
                        self.assertSameOnDerived(dict(base, pre_tokenizer={"type": "Sequence",
                                                                           "pretokenizers": [split, blevel]}), texts)

    def test_byte_level_add_prefix_space_on_a_derived_model(self):
        # a space before every piece that does not start with one: the input's, each piece between added tokens
        # and each piece a Split before it cut (a byte-level model: GPT-2's regex or none, after a Split)
        base = tiny_byte_level()
        texts = ["hello world", " hello", "", " ", "  two", "<|endoftext|>", "a<|endoftext|>b", "<|endoftext|> x",
                 "x <|endoftext|>", "你好 世界", "\nnew", "1 2 3", "this is his list"] + CORPUS[:20]
        bl = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True}
        cut = {"type": "Split", "pattern": {"String": " "}, "behavior": "Isolated", "invert": False}
        for pre in [dict(bl, use_regex=True), dict(bl, use_regex=False),
                    {"type": "Sequence", "pretokenizers": [cut, dict(bl, use_regex=False)]},
                    {"type": "Sequence", "pretokenizers": [dict(cut, behavior="Removed"), bl]}]:
            with self.subTest(pre_tokenizer=pre):
                mine = self.assertSameOnDerived(dict(base, pre_tokenizer=pre), texts)
                self.assertEqual(mine[0][0], 32)  # "hello world": the space added first (byte 32's token)
        # a file that says false adds none: "h" first
        self.assertEqual(self.assertSameOnDerived(base, ["hello world"])[0][0], ord("h"))

    def test_merges_as_hugging_face_reads_them(self):
        # an old merges.txt's "#version" line carried into the file is skipped (and not ranked); a merge of other
        # than two parts, or of parts or a result outside the vocabulary, refuses the file on both sides
        base = tiny_byte_level()
        versioned = json.loads(json.dumps(base))
        versioned["model"]["merges"].insert(0, "#version: 0.2")
        self.assertSameOnDerived(versioned, ["hello world", "the quick brown fox"] + CORPUS[:10])
        # (at 5 and at 45: the loader reads the merges in batches of 32, and names the first bad one by its rank)
        for at, bad, needle in [(5, "he l lo", "is not \"left right\" (one space)"), (5, "hel", "is not \"left right\""),
                                (5, "zzq qzz", "its left part is not in the vocab"),
                                (45, "zzq qzz", "its left part is not in the vocab"),
                                (45, "hel", "is not \"left right\""),
                                (5, "Ġ" * 400 + " q", "its left part is not in the vocab (ĠĠ")]:
            d = json.loads(json.dumps(base))
            d["model"]["merges"].insert(at, bad)
            tmp = t.tmpdir(prefix="xpyd-tok-")
            with open(os.path.join(tmp, "tokenizer.json"), "w", encoding="utf-8") as f:
                json.dump(d, f, ensure_ascii=False)
            with self.subTest(merge=bad[:20], at=at):
                p = subprocess.run([os.path.join(t.BIN, "xpyd_tokenize"), "--tokenizer", tmp], input=b"hello",
                                   capture_output=True, timeout=60)
                self.assertEqual(p.returncode, 1)
                err = p.stderr.decode("utf-8")  # (a long token quoted in part, cut where a character starts)
                self.assertIn("model merges: item %d%s" % (at, ": " if "vocab" in needle else " "), err)
                self.assertIn(needle, err)
                self.assertLess(len(err), 400)
                theirs = subprocess.run(["node", os.path.join(os.path.dirname(oracle_cache.__file__), "tok_oracle.js"),
                                         os.path.join(tmp, "tokenizer.json")], input='"hello"\n', capture_output=True,
                                        text=True, timeout=120, env=dict(os.environ, NODE_PATH=os.path.join(
                                            t.NPM_DIR, "node_modules")))
                self.assertNotEqual(theirs.returncode, 0)  # Hugging Face refuses it too


if __name__ == "__main__":
    t.main()
