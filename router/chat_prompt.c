/* SPDX-License-Identifier: Apache-2.0 */
/* chat_prompt.c - a client's chat request as vLLM hands it to the chat template (chat_prompt.h), so that the
 * router's count of its prompt is the engine's. What vLLM does (vllm/entrypoints/chat_utils.py,
 * _parse_chat_message_content and _postprocess_messages; the tools through its pydantic models):
 *  - content: null is no text, a string one text part; a part that is a string is text, parts of type text,
 *    input_text, output_text, refusal and thinking are text (their "text", "refusal" or "thinking" member); a
 *    template that reads content as a string gets the non-empty texts joined with "\n", one that loops over parts
 *    (the "openai" format) gets [{"type": "text", "text": ...}] parts ("" kept, a text or refusal part without its
 *    text dropped, another kind kept with a null text); a tool message's parts are always joined. Media parts put
 *    model-specific placeholders in the prompt: such a request is not counted here (RT_CHAT_MEDIA).
 *  - the message keeps role and content, then an assistant's tool_calls (when not null; an empty list is
 *    dropped; each call's arguments, a JSON string, parsed into an object, {} when it is not JSON) and its
 *    "reasoning" (also as reasoning_content), a tool message's tool_call_id, a string name, a string task;
 *  - tools: {"type", "function": {"name", "description", "parameters", ...}, ...} with description and
 *    parameters null when absent, as model_dump() writes them;
 *  - add_generation_prompt true unless the body says otherwise; continue_final_message, documents and
 *    chat_template_kwargs as given.
 * The body is read where it lies (json_view.h: it was checked when it arrived), each member once, the last of a
 * repeated key as json.loads takes it: only what the template reads is made a tree, a message's text decoded
 * once into its node. A conversation is mostly its texts: parsing the whole body into a tree first (cJSON) cost
 * a 188 KB conversation 149 us here and copying its texts into vLLM's shape 18 more, several times the render
 * and the cached encode together (bench/journal/2026-12.md). */
#include "chat_prompt.h"

#include "xpyd_tokenizer.h"
#include "xpyd_util.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

/* a string node that owns d (malloc'd; freed with the node, or now when there is none) */
static cJSON *owning(char *d)
{
    cJSON *n = d ? cJSON_CreateStringReference(d) : NULL;
    if (!n) {
        free(d);
        return NULL;
    }
    n->type &= ~cJSON_IsReference; /* d is the node's: cJSON_Delete frees it */
    return n;
}

/* the decoded string s as a node (the decoding is its one copy) */
static cJSON *str_node(struct jv s)
{
    return owning(jv_str_dup(s));
}

/* a member kept as it is: its bytes parsed (a small value: a call, a name, the kwargs); NULL when cJSON cannot
 * hold it (a lone surrogate: Python's json takes it, cJSON does not) */
static cJSON *copy_of(struct jv v)
{
    cJSON *c = cJSON_ParseWithLength(v.p, v.n);
    xtok_json_literals(c, v.p, v.n); /* its numbers as json.loads reads them: 1.0 a float */
    return c;
}

static int add_copy(cJSON *to, const char *key, struct jv v)
{
    cJSON *c = copy_of(v);
    if (!c)
        return -1;
    cJSON_AddItemToObject(to, key, c);
    return 0;
}

/* content given as parts, read as vLLM's _parse_chat_message_content_parts reads them, into parts (string or null
 * nodes): a part that is a string is text; a text, input_text or output_text part its "text", a refusal or thinking
 * part its "refusal" or "thinking"; any other type is media (*why RT_CHAT_MEDIA). Read for a template that takes
 * content as a string (openai 0), a part whose text is absent, null or "" is dropped (vLLM keeps the truthy ones);
 * for one that loops over parts, a text or refusal part without it is dropped, another kind kept with a null text,
 * and "" kept. A text member of another JSON type is not counted here (vLLM fails on it). */
static int text_parts(struct jv content, cJSON *parts, int openai, int *why)
{
    static const char *const kinds[][2] = {{"text", "text"}, {"refusal", "refusal"}, {"input_text", "text"},
                                           {"output_text", "text"}, {"thinking", "thinking"}};
    struct jv_iter it;
    struct jv part;
    jv_iter_init(&it, content);
    while (jv_next(&it, NULL, &part)) {
        struct jv t = part;
        int drop_none = 1; /* text and refusal parts without their text */
        if (jv_type(part) != JV_STRING) {
            struct jv type = jv_get(part, "type");
            size_t k = 0;
            while (k < sizeof kinds / sizeof *kinds &&
                   !(jv_type(type) == JV_STRING && jv_str_eq(type, kinds[k][0], strlen(kinds[k][0]))))
                k++;
            if (k == sizeof kinds / sizeof *kinds) { /* an image, audio, video...: the model's own placeholders */
                *why = RT_CHAT_MEDIA;
                return -1;
            }
            t = jv_get(part, kinds[k][1]);
            drop_none = k < 2;
        }
        enum jv_type tt = jv_type(t);
        cJSON *n = NULL;
        if (tt == JV_STRING) {
            if (!openai && jv_str_len(t) == 0)
                continue;
            n = str_node(t);
        } else if (tt == JV_NONE || tt == JV_NULL) {
            if (!openai || drop_none)
                continue;
            n = cJSON_CreateNull();
        } else {
            return -1;
        }
        if (!n)
            return -1;
        cJSON_AddItemToArray(parts, n);
    }
    return 0;
}

/* the texts of parts joined with "\n" (a string node), NULL when one is null (vLLM fails joining it) */
static cJSON *joined(const cJSON *parts)
{
    size_t total = 1;
    const cJSON *x;
    cJSON_ArrayForEach(x, parts)
    {
        if (!cJSON_IsString(x))
            return NULL;
        total += strlen(x->valuestring) + 1;
    }
    char *w = XPYD_XALLOC(malloc(total)), *all = w;
    *w = '\0';
    cJSON_ArrayForEach(x, parts)
    {
        if (x != parts->child)
            *w++ = '\n';
        size_t l = strlen(x->valuestring);
        memcpy(w, x->valuestring, l + 1);
        w += l;
    }
    return owning(all);
}

/* an assistant's tool calls (a list): each call's arguments, a JSON string, parsed into an object (its value as
 * json.loads gives it; {} when it is not JSON or not a string) */
static cJSON *tool_calls(struct jv calls)
{
    cJSON *list = copy_of(calls), *c;
    cJSON_ArrayForEach(c, list)
    {
        cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        if (cJSON_IsObject(fn) && !cJSON_IsObject(args) && !cJSON_IsArray(args)) {
            cJSON *parsed = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
            if (parsed)
                xtok_json_literals(parsed, args->valuestring, strlen(args->valuestring));
            if (!parsed)
                parsed = cJSON_CreateObject();
            if (args)
                cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", parsed);
            else
                cJSON_AddItemToObject(fn, "arguments", parsed);
        }
    }
    return list;
}

/* One message as vLLM's conversation holds it, the one at p (the messages' own bytes end by e; *end: past it);
 * NULL with *why when it cannot be counted. Its members are read as they come (a message's length would be a
 * pass over its text of its own). */
static cJSON *message(const char *p, const char *e, const char **end, int openai, int *why)
{
    *why = RT_CHAT_SHAPE;
    struct jv role = {0}, content = {0}, calls = {0}, reasoning = {0}, call_id = {0}, name = {0}, task = {0}, k, v;
    struct jv_iter mi;
    jv_iter_open(&mi, p, e);
    if (!mi.obj)
        return NULL;
    while (jv_next(&mi, &k, &v)) { /* its members read once, the last of a repeated key */
        struct jv *at = jv_str_eq(k, "role", 4)           ? &role
                        : jv_str_eq(k, "content", 7)      ? &content
                        : jv_str_eq(k, "tool_calls", 10)  ? &calls
                        : jv_str_eq(k, "reasoning", 9)    ? &reasoning
                        : jv_str_eq(k, "tool_call_id", 12) ? &call_id
                        : jv_str_eq(k, "name", 4)         ? &name
                        : jv_str_eq(k, "task", 4)         ? &task
                                                          : NULL;
        if (at)
            *at = v;
    }
    *end = jv_iter_end(&mi);
    enum jv_type ct = jv_type(content);
    if (jv_type(role) != JV_STRING ||
        (ct != JV_NONE && ct != JV_NULL && ct != JV_STRING && ct != JV_ARRAY))
        return NULL;
    int tool = jv_str_eq(role, "tool", 4), assistant = jv_str_eq(role, "assistant", 9);
    cJSON *out = cJSON_CreateObject();
    cJSON *r = str_node(role);
    if (!out || !r) {
        cJSON_Delete(out);
        cJSON_Delete(r);
        return NULL;
    }
    cJSON_AddItemToObject(out, "role", r);
    if (openai && !tool) { /* [{"type": "text", "text": ...}] */
        cJSON *parts = cJSON_CreateArray(), *list = cJSON_AddArrayToObject(out, "content"), *x;
        int rc = parts && list ? 0 : -1;
        if (!rc && ct == JV_STRING)
            rc = cJSON_AddItemToArray(parts, str_node(content)) ? 0 : -1;
        else if (!rc && ct == JV_ARRAY)
            rc = text_parts(content, parts, 1, why);
        while (!rc && (x = cJSON_DetachItemFromArray(parts, 0))) {
            cJSON *part = cJSON_CreateObject();
            cJSON_AddStringToObject(part, "type", "text");
            cJSON_AddItemToObject(part, "text", x);
            cJSON_AddItemToArray(list, part);
        }
        cJSON_Delete(parts);
        if (rc) {
            cJSON_Delete(out);
            return NULL;
        }
    } else { /* one string: a tool's parts are joined even for a template of parts (vLLM) */
        cJSON *text = NULL;
        if (ct == JV_STRING) { /* the string itself: no copy but its decoding */
            text = str_node(content);
        } else if (ct == JV_ARRAY) {
            cJSON *parts = cJSON_CreateArray();
            if (parts && text_parts(content, parts, openai, why) == 0)
                text = joined(parts); /* NULL: a null text (vLLM fails joining it) */
            cJSON_Delete(parts);
        } else { /* absent or null: no text */
            text = cJSON_CreateString("");
        }
        if (!text) {
            cJSON_Delete(out);
            return NULL;
        }
        cJSON_AddItemToObject(out, "content", text);
    }
    int rc = 0;
    if (assistant) {
        enum jv_type t = jv_type(calls);
        if (t == JV_ARRAY) { /* an empty list is dropped */
            cJSON *list = tool_calls(calls);
            if (!list)
                rc = -1;
            else if (list->child)
                cJSON_AddItemToObject(out, "tool_calls", list);
            else
                cJSON_Delete(list);
        } else if (t != JV_NONE && t != JV_NULL) {
            rc |= add_copy(out, "tool_calls", calls);
        }
        if (jv_type(reasoning) != JV_NONE && jv_type(reasoning) != JV_NULL) {
            rc |= add_copy(out, "reasoning", reasoning);
            rc |= add_copy(out, "reasoning_content", reasoning);
        }
    } else if (tool && call_id.p) {
        rc |= add_copy(out, "tool_call_id", call_id);
    }
    if (jv_type(name) == JV_STRING)
        rc |= add_copy(out, "name", name);
    if (jv_type(task) == JV_STRING)
        rc |= add_copy(out, "task", task);
    if (rc) {
        cJSON_Delete(out);
        return NULL;
    }
    return out;
}

/* a tool as vLLM's pydantic model dumps it (t: its bytes parsed) */
static cJSON *tool(const cJSON *t)
{
    cJSON *out = cJSON_CreateObject(), *it;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
    cJSON_AddItemToObject(out, "type", type ? cJSON_Duplicate(type, 1) : cJSON_CreateString("function"));
    cJSON *f = cJSON_AddObjectToObject(out, "function");
    static const char *const declared[] = {"name", "description", "parameters"};
    for (int k = 0; k < 3; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(fn, declared[k]);
        cJSON_AddItemToObject(f, declared[k], v ? cJSON_Duplicate(v, 1) : cJSON_CreateNull());
    }
    cJSON_ArrayForEach(it, fn) /* pydantic's extra="allow": other members follow the declared ones */
        if (strcmp(it->string, "name") && strcmp(it->string, "description") && strcmp(it->string, "parameters"))
            cJSON_AddItemToObject(f, it->string, cJSON_Duplicate(it, 1));
    cJSON_ArrayForEach(it, t)
        if (strcmp(it->string, "type") && strcmp(it->string, "function"))
            cJSON_AddItemToObject(out, it->string, cJSON_Duplicate(it, 1));
    return out;
}

cJSON *rt_chat_template_args(const struct rt_chat_src *s)
{
    cJSON *out = cJSON_CreateObject();
    if (!out || (s->chat_template.p && add_copy(out, "chat_template", s->chat_template) != 0) ||
        (s->chat_template_kwargs.p && add_copy(out, "chat_template_kwargs", s->chat_template_kwargs) != 0)) {
        cJSON_Delete(out);
        return NULL;
    }
    return out;
}

cJSON *rt_chat_as_vllm(const struct rt_chat_src *s, int openai_content, int *why)
{
    *why = RT_CHAT_SHAPE;
    if (jv_type(s->messages) != JV_ARRAY)
        return NULL;
    cJSON *out = cJSON_CreateObject(), *list = cJSON_AddArrayToObject(out, "messages");
    if (!list) {
        cJSON_Delete(out);
        return NULL;
    }
    /* the messages one after the other, each read as it comes (json_view.h: jv_iter_open) */
    const char *p = s->messages.p + 1, *e = s->messages.p + s->messages.n - 1; /* inside the brackets */
    for (;;) {
        while (p < e && (jv_is_ws(*p) || *p == ','))
            p++;
        if (p >= e)
            break;
        cJSON *x = message(p, e, &p, openai_content, why);
        if (!x) {
            cJSON_Delete(out);
            return NULL;
        }
        cJSON_AddItemToArray(list, x);
    }
    if (jv_type(s->tools) == JV_ARRAY) {
        cJSON *given = copy_of(s->tools), *tl = cJSON_AddArrayToObject(out, "tools"), *t;
        if (!given || !tl) {
            cJSON_Delete(given);
            cJSON_Delete(out);
            return NULL;
        }
        cJSON_ArrayForEach(t, given)
            cJSON_AddItemToArray(tl, tool(t));
        cJSON_Delete(given);
    }
    const struct jv asis[] = {s->add_generation_prompt, s->continue_final_message, s->documents,
                              s->chat_template_kwargs};
    static const char *const names[] = {"add_generation_prompt", "continue_final_message", "documents",
                                        "chat_template_kwargs"};
    for (int k = 0; k < 4; k++)
        if (asis[k].p && jv_type(asis[k]) != JV_NULL && add_copy(out, names[k], asis[k]) != 0) {
            cJSON_Delete(out);
            return NULL;
        }
    *why = 0;
    return out;
}
