/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_template.c - libFuzzer harness for the chat-template engine (xtpl_*, xtok_chat_render's request side).
 * The first byte picks the surface:
 *   even: the rest is a hostile template: compiled or refused with a reason (and its line), never a crash; one
 *         that compiles renders a fixed conversation within small limits (1 MiB out, 16 MiB memory, 200,000
 *         steps): a text of at most the output limit, or an error with a reason;
 *   odd:  the rest is a hostile request body (messages, tools, kwargs), its numbers' literals kept as the
 *         router keeps them (xtok_json_literals), rendered by a fixed template that uses most of the language
 *         (loops, namespace, macros, filters, string methods, tojson): the same bounds. */
#include "xpyd_tokenizer.h"

#include <assert.h>
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static const char FIXED[] =
    "{%- macro show(m, sep=': ') -%}{{ m.role | upper }}{{ sep }}{{ m.content | trim }}{%- endmacro -%}\n"
    "{%- set ns = namespace(n=0, last='') -%}\n"
    "{{ bos_token }}{% for m in messages if m.role is defined %}\n"
    "  {%- set ns.n = ns.n + 1 %}{% set ns.last = m.role %}\n"
    "  {%- if m.content is string and m.content.startswith('<') %}{{ m.content.split('>')[-1].lstrip('\\n') }}\n"
    "  {%- elif m.content is iterable and m.content is not string %}{% for p in m.content %}{{ p.text | default('') }}"
    "{% endfor %}\n"
    "  {%- else %}{{ show(m) }}{% endif %}\n"
    "  {%- if m.tool_calls %}{% for c in m.tool_calls %}{{ c.function | tojson(indent=1) }}{{ loop.index }}"
    "{% endfor %}{% endif %}\n"
    "{% endfor %}{% if tools %}{{ tools | tojson }}{{ tools | map(attribute='function') | list | length }}{% endif %}"
    "{{ ns.n }}{{ ns.last }}{{ messages[::-1][0].role | default('?') }}{% if add_generation_prompt %}<gen>{% endif %}"
    "{{ messages | map(attribute='role') | unique | list | sort | join(',') }}{{ messages | max(attribute='role') }}"
    "{%- macro wrap(a, b='') %}[{{ caller(a) }}{{ b }}]{% endmacro %}{% set args = [messages | length, '|'] %}"
    "{% call(n) wrap(*args) %}{{ n }}{{ messages[0].content | default('') | string | length }}{% endcall %}"
    "{{ '%s|%-3d|%.2f|%r' % (messages[0].role | default(''), messages | length, 0x10, ns.last) }}"
    "{{ '%(k)s' | format(k=messages[-1].content | default('') | string) }}";

static struct xtpl *fixed;
static const struct xtpl_limits LIM = {1u << 20, 16u << 20, 200000};

static void check_render(const struct xtpl *t, const cJSON *vars)
{
    char *out = NULL, err[512];
    size_t n = 0;
    err[0] = '\0';
    int rc = xtpl_render(t, vars, &LIM, &out, &n, err, sizeof err);
    if (rc == 0) {
        assert(out && n <= LIM.max_output && out[n] == '\0');
        free(out);
    } else {
        assert(!out && err[0]);
    }
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    if (!size)
        return 0;
    if (!fixed) {
        char err[256];
        fixed = xtpl_compile(FIXED, sizeof FIXED - 1, err, sizeof err);
        assert(fixed);
    }
    const char *rest = (const char *)data + 1;
    size_t len = size - 1;
    if (data[0] % 2 == 0) {
        char err[512];
        err[0] = '\0';
        struct xtpl *t = xtpl_compile(rest, len, err, sizeof err);
        if (!t) {
            assert(err[0] && strstr(err, "line"));
            return 0;
        }
        cJSON *vars = cJSON_Parse("{\"messages\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\","
                                  "\"content\":\" hi \"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":["
                                  "{\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1}}}]}],\"tools\":[{\"type\":"
                                  "\"function\",\"function\":{\"name\":\"f\"}}],\"add_generation_prompt\":true,"
                                  "\"bos_token\":\"<s>\",\"x\":[1,2.5,\"s\",{\"k\":[]}]}");
        check_render(t, vars);
        cJSON_Delete(vars);
        xtpl_free(t);
        return 0;
    }
    cJSON *vars = cJSON_ParseWithLength(rest, len);
    xtok_json_literals(vars, rest, len); /* its numbers' literals kept beside cJSON's doubles: read by the render */
    if (cJSON_IsObject(vars))
        check_render(fixed, vars);
    cJSON_Delete(vars);
    return 0;
}
