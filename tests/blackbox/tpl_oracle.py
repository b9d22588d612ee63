#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The chat-template oracle: Debian's python3-jinja2 configured as transformers configures it for
apply_chat_template (transformers/utils/chat_template_utils.py: an ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks, the loopcontrols extension and its generation tag; tojson as json.dumps with ensure_ascii=False;
raise_exception and strftime_now as globals), fed as vLLM feeds it (the special tokens, then messages, tools,
documents, add_generation_prompt, continue_final_message, and the request's chat_template_kwargs over them).
Reads lines of {"template": ..., "special": {...}, "request": {...}} and writes, per line, the rendered text as a
JSON string, or {"error": "..."} when rendering fails (continue_final_message is cut as transformers cuts it).
A request's own template (chat_template, or chat_template_kwargs' chat_template, which wins: vLLM updates
apply_chat_template's arguments with the kwargs) is refused as vLLM refuses it unless the line says "trust": true,
then used - picked by name where the line gives the model's named templates ("named": {name: source}, in place of
"template") as transformers' get_chat_template picks among them."""
import json
import sys
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


class Generation(Extension):
    """transformers' AssistantTracker as apply_chat_template runs it without return_assistant_tokens_mask: the
    {% generation %} ... {% endgeneration %} block renders its body as it is."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, Generation])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = strftime_now
compiled = {}


def template_of(case, req):
    kwargs = req.get("chat_template_kwargs") or {}
    own = kwargs.get("chat_template")
    if own is None:
        own = req.get("chat_template")
    if own is not None and not case.get("trust"):  # vLLM's _validate_chat_template
        raise ValueError("Chat template is passed with request, but --trust-request-chat-template is not set. "
                         "Refused request with untrusted chat template.")
    named = case.get("named")
    if named is None:
        return own if own is not None else case["template"]
    if own is not None:  # transformers: a name among the model's templates, else the template itself
        return named.get(own, own)
    if req.get("tools") is not None and "tool_use" in named:
        return named["tool_use"]
    return named["default"]


def render(case):
    req = case["request"]
    src = template_of(case, req)
    if src not in compiled:
        compiled[src] = env.from_string(src)
    add_gen = req.get("add_generation_prompt", True)
    cont = req.get("continue_final_message", False)
    if cont and add_gen and req.get("add_generation_prompt") is True:
        raise ValueError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    if cont:
        add_gen = False
    kwargs = dict(case.get("special", {}))
    kwargs.update(messages=req["messages"], tools=req.get("tools"), documents=req.get("documents"),
                  add_generation_prompt=add_gen, continue_final_message=cont)
    kwargs.update({k: v for k, v in (req.get("chat_template_kwargs") or {}).items() if k != "chat_template"})
    text = compiled[src].render(**kwargs)
    if cont:
        final = req["messages"][-1]["content"]
        if isinstance(final, list):
            final = [b["text"] for b in final if "text" in b][-1]
        loc = text.rindex(final.strip())
        if text[loc:loc + len(final.lstrip())] == final:
            text = text[:loc + len(final.lstrip())]
        else:
            text = text[:loc + len(final.strip())]
    return text


for line in sys.stdin:
    case = json.loads(line)
    try:
        out = render(case)
    except Exception as e:  # the renderer's failure is the answer to compare
        out = {"error": "%s: %s" % (type(e).__name__, e)}
    print(json.dumps(out, ensure_ascii=False), flush=True)
