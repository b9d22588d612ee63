#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Python's printf-style formatting in chat templates (`'%s' % x`, jinja's `format` filter: vLLM's Llama 3.2 and
Llama 4 "pythonic" tool templates write tool-call arguments with `"%s" | format(v)`) and jinja's number literals
(0x1F, 0o17, 0b101, 1_000), each against python3-jinja2 as transformers configures it: seeded random conversion
specs (flags, width, precision, `*`, every conversion character, values of every type), mapping keys, and the
errors Python raises; the str methods and the round filter beyond test_chat_template's (padding, partition,
removeprefix, index, istitle, expandtabs; round's three methods, negative precisions, ties to even) and
loop.changed."""
import os
import random

import xpyd_testlib as t
from test_chat_template import render_file, render_many, same, specials, theirs_many

VALUES = ["5", "-7", "0", "3.75", "-2.5", "1e20", "1e-7", "true", "false", "'ab'", "'日本語'", "none", "[1, 'a']",
          "{'k': 'v'}", "(1, 2)", "255", "65", "'x'", "1e300", "-0.0", "0x1F600"]
CONVERSIONS = list("srdiuoxXeEfFgGca%q")
FLAGS = ["", "-", "+", " ", "#", "0", "-0", "+0", "#0", "- ", "+#"]


def random_formats(n, seed):
    rnd = random.Random(seed)
    out = []
    while len(out) < n:
        spec = "%" + rnd.choice(FLAGS) + rnd.choice(["", "5", "12", "1", "*"]) + \
            rnd.choice(["", ".0", ".2", ".10", ".*"]) + rnd.choice(CONVERSIONS)
        stars = spec.count("*")
        args = [rnd.choice(["3", "-4", "12"]) for _ in range(stars)] + \
            ([] if spec.endswith("%") else [rnd.choice(VALUES)])
        if spec.endswith("c") and args and args[-1] in ("0", "false", "-0.0"):
            continue  # chr(0): the router refuses a prompt holding a NUL byte (jinja prints it)
        form = rnd.random()
        if form < 0.4:
            out.append("{{ '[%s]' %% (%s) }}" % (spec, ", ".join(args) + ("," if len(args) == 1 else "")))
        elif form < 0.7:
            out.append("{{ '[%s]' | format(%s) }}" % (spec, ", ".join(args)))
        elif len(args) == 1:
            out.append("{{ '[%s]' %% %s }}" % (spec, args[0]))
        else:
            out.append("{{ '[%s|%%s]' %% (%s, 'extra') }}" % (spec, ", ".join(args)))
    return out


FIXED = [
    "{{ '%(a)s-%(b)05.1f' % {'a': 'x', 'b': 2.25} }}", "{{ '%(a)s' | format(a=3) }}", "{{ 'abc' % {'a': 1} }}",
    "{{ 'abc' % [1] }}", "{{ '%s' % [1, 2] }}", "{{ '%.3s|%-6s|%6s' % ('日本語テキスト', 'é', 'ü') }}",
    "{{ '%c%c' % (0x1F600, 'z') }}", "{{ '%s' | format(messages[0]) }}", "{{ '%d' % 1e30 }}", "{{ '%f' % (1/3) }}",
    "{{ '%r' | format('it\\'s') }}{{ '%a' % 'é' }}", "{{ '%hd %ld' % (1, 2) }}", "{{ '%%|%s%%' % 5 }}{{ ' ' % nope }}",
    # a pythonic tool call, as vLLM's Llama 3.2/4 templates write one
    "{% for c in calls %}{{ c.name }}({% for k in c.arguments %}{{ k }}={{ '%s' | format(c.arguments[k]) }}"
    "{% if not loop.last %}, {% endif %}{% endfor %}){% endfor %}",
    "{{ 0x1F }} {{ 0o17 }} {{ 0b101 }} {{ 1_000 }} {{ 1_0.5_0 }} {{ 0X1f }} {{ 1e1_0 }} {{ 0x_1 }} {{ 00 }} {{ 0_0 }}",
    "{{ 9223372036854775807 }} {{ 1_2e1_0 }} {{ 2.5E-3 }} {{ 1.e5 }}",
    # what Python refuses (RENDERS: the cases before)
    "{{ 'abc' % 5 }}", "{{ '%s' % () }}", "{{ '%s %s' % (1,) }}", "{{ '%s' % (1, 2) }}", "{{ '%' % () }}", "{{ '%(a' % {'a': 1} }}",
    "{{ '%5%' % () }}", "{{ '%d' % '3' }}", "{{ '%x' % 2.0 }}", "{{ '%(x)s' % {'y': 1} }}", "{{ '%s' | format(1, a=2) }}",
    "{{ '%c' % 0x110000 }}", "{{ '%d' % (1e300 * 1e300) }}",
]
RENDERS = 16
BAD_SYNTAX = ["{{ 012 }}", "{{ 1__0 }}", "{{ 1_ }}", "{{ 0x }}", "{{ 0b2 }}", "{{ 0_1 }}"]


STRINGS = ["'x'", "'-42'", "'+7'", "'日本'", "''", "'a,b,c'", "'Hello World'", "'hello World'", "'ǅungla'", "'ABC'",
           "'a\\tbc\\tdef\\n\\tg'", "'١٢٣'", "'12'", "'½'", "' '"]
METHODS = ["zfill(%d)", "ljust(%d)", "rjust(%d)", "center(%d)", "ljust(%d, '*')", "center(%d, '日')", "rjust(%d, 'ab')",
           "partition(',')", "rpartition(',')", "partition('')", "removeprefix('a')", "removesuffix('c')",
           "removeprefix('')", "index('b')", "rindex(',')", "index('q')", "isdecimal()", "istitle()", "expandtabs()",
           "expandtabs(%d)", "zfill('3')", "center()"]
NUMBERS = ["3.14159", "2.5", "3.5", "-2.5", "2.675", "7", "-7", "1250", "1350", "true", "0.5", "1e20", "'x'", "none",
           "-0.0", "1.005", "125.0", "-150.0"]
ROUNDS = ["", "(2)", "(0)", "(1)", "(-1)", "(-2)", "(3, 'floor')", "(1, 'ceil')", "(method='floor')", "(-1, 'floor')",
          "(2, 'bogus')", "(precision=1)"]


def random_methods(n, seed):
    """str methods (padding, partition, prefixes, index, tests, tabs) and the round filter, seeded"""
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        m = rnd.choice(METHODS)
        if "%d" in m:
            m = m % rnd.choice([0, 1, 3, 4, 5, 8, -2])
        out.append("{{ %s.%s }}" % (rnd.choice(STRINGS), m))
        out.append("{{ %s | round%s }}" % (rnd.choice(NUMBERS), rnd.choice(ROUNDS)))
    return out


CHANGED = ["{% for x in [1,1,2,2,1] %}{{ loop.changed(x) }}{% endfor %}",
           "{% for x in [1,1,2] %}{{ loop.changed(x, loop.index0 // 2) }}{% endfor %}",
           "{% for x in 'aab' %}{{ loop.changed() }}{% endfor %}",
           "{% for x in [[1], [1], (1,)] %}{{ loop.changed(x) }}{% endfor %}",
           "{% for a in [1,2] %}{% for b in [1,1] %}{{ loop.changed(b) }}{% endfor %}{% endfor %}"]


class Formatting(t.TestCase):
    def render_all(self, templates, req):
        return render_many(templates, req)

    def test_percent_and_format_against_jinja2(self):
        req = {"messages": [{"role": "user", "content": "hi"}],
               "chat_template_kwargs": {"calls": [{"name": "get_weather", "arguments": {"city": "Paris", "days": 2,
                                                                                         "units": None}}]}}
        templates = FIXED + random_formats(400, 11)
        want = theirs_many(templates, specials("llama3_1"), req)
        mine = self.render_all(templates, req)
        bad = [(s, a, b) for s, a, b in zip(templates, mine, want) if not same(a, b)]
        self.assertFalse(bad, "%d of %d differ from jinja2, e.g. %r" % (len(bad), len(templates), bad[:3]))
        self.assertEqual(mine[13], "get_weather(city=Paris, days=2, units=None)")
        self.assertGreater(sum(isinstance(w, str) for w in want), 200)  # most render: not a comparison of errors
        for src, m in zip(templates[:RENDERS], mine):
            self.assertIsInstance(m, str, src)  # the fixed cases before "what Python refuses" all render
        for src, m in zip(FIXED[RENDERS:], mine[RENDERS:]):
            self.assertIn("error", m, src)

    def test_a_negative_literal_to_a_power_as_jinja_compiles_it(self):
        # jinja folds -2 into a constant and writes Python `(-2 ** x)`, which Python reads as -(2 ** x); with
        # constants only, the power folds whole as (-2) ** 2; an integer -0 is written 0
        srcs = ["{{ -2 ** y }}", "{{ -2 ** (not x) }}", "{{ -2.5 ** y }}", "{{ -true ** y }}", "{{ -2 ** y ** 2 }}",
                "{{ -(2) ** y }}", "{{ -2 ** (1 + 1) }}", "{{ -2 ** false }}", "{{ -0 ** z }}", "{{ -0.0 ** z }}",
                "{{ (-2) ** y }}", "{{ -x[0] ** y }}"]
        req = {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"x": [3], "y": 2, "z": 0}}
        want = theirs_many(srcs, {}, req)
        self.assertEqual(want[:4], ["-4", "-1", "-6.25", "-1"])
        self.assertEqual(self.render_all(srcs, req), want)

    def test_string_methods_round_and_loop_changed_against_jinja2(self):
        req = {"messages": [{"role": "user", "content": "hi"}]}
        templates = CHANGED + random_methods(250, 5)
        want = theirs_many(templates, {}, req)
        mine = self.render_all(templates, req)
        bad = [(s, a, b) for s, a, b in zip(templates, mine, want) if not same(a, b)]
        self.assertFalse(bad, "%d of %d differ from jinja2, e.g. %r" % (len(bad), len(templates), bad[:3]))
        self.assertEqual(mine[0], "TrueFalseTrueFalseTrue")
        self.assertGreater(sum(isinstance(w, str) for w in want), 300)

    def test_number_literals_jinja_refuses_are_refused_at_load(self):
        req = {"messages": [{"role": "user", "content": "hi"}]}
        want = theirs_many(BAD_SYNTAX, {}, req)
        d = t.tmpdir()
        for i, (src, w) in enumerate(zip(BAD_SYNTAX, want)):
            m = render_file(src, req, os.path.join(d, "b%d.jinja" % i))
            with self.subTest(template=src):
                self.assertIn("TemplateSyntaxError", w["error"])
                self.assertIn("at load", m["error"])


if __name__ == "__main__":
    t.main()
