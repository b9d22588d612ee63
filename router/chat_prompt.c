/* SPDX-License-Identifier: Apache-2.0 */
/* chat_prompt.c - a client's chat request as vLLM hands it to the chat template (chat_prompt.h), so that the
 * router's count of its prompt is the engine's. What vLLM does (vllm/entrypoints/chat_utils.py,
 * _parse_chat_message_content and _postprocess_messages; the tools through its pydantic models):
 *  - content: null is no text, a string one text part; parts of type text, input_text, output_text, refusal and
 *    thinking are text (their "text", "refusal" or "thinking" member); a template that reads content as a string
 *    gets the texts joined with "\n", one that loops over parts (the "openai" format) gets [{"type": "text",
 *    "text": ...}] parts; a tool message's all-text parts are always joined. Media parts put model-specific
 *    placeholders in the prompt: such a request is not counted here (RT_CHAT_MEDIA).
 *  - the message keeps role and content, then an assistant's tool_calls (when not null; an empty list is
 *    dropped; each call's arguments, a JSON string, parsed into an object, {} when it is not JSON) and its
 *    "reasoning" (also as reasoning_content), a tool message's tool_call_id, a string name, a string task;
 *  - tools: {"type", "function": {"name", "description", "parameters", ...}, ...} with description and
 *    parameters null when absent, as model_dump() writes them;
 *  - add_generation_prompt true unless the body says otherwise; continue_final_message, documents and
 *    chat_template_kwargs as given. */
#include "chat_prompt.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static const char *part_text(const cJSON *part)
{
    static const char *const kinds[][2] = {{"text", "text"}, {"input_text", "text"}, {"output_text", "text"},
                                           {"refusal", "refusal"}, {"thinking", "thinking"}};
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
    if (cJSON_IsString(part))
        return part->valuestring;
    for (size_t k = 0; cJSON_IsString(type) && k < sizeof kinds / sizeof *kinds; k++)
        if (!strcmp(type->valuestring, kinds[k][0])) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, kinds[k][1]);
            return cJSON_IsString(t) ? t->valuestring : "";
        }
    return NULL;
}

static void add_copy(cJSON *to, const char *key, const cJSON *v)
{
    cJSON_AddItemToObject(to, key, cJSON_Duplicate(v, 1));
}

/* One message as vLLM's conversation holds it; NULL with *why when it cannot be counted. */
static cJSON *message(const cJSON *m, int openai, int *why)
{
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content"), *it;
    if (!cJSON_IsString(role) || (content && !cJSON_IsNull(content) && !cJSON_IsString(content) &&
                                  !cJSON_IsArray(content))) {
        *why = RT_CHAT_SHAPE;
        return NULL;
    }
    int tool = !strcmp(role->valuestring, "tool");
    cJSON *out = cJSON_CreateObject(), *parts = cJSON_CreateArray();
    cJSON_AddStringToObject(out, "role", role->valuestring);
    size_t total = 0;
    if (cJSON_IsString(content)) {
        cJSON_AddItemToArray(parts, cJSON_CreateString(content->valuestring));
        total = strlen(content->valuestring);
    } else if (cJSON_IsArray(content)) {
        cJSON_ArrayForEach(it, content)
        {
            const char *t = part_text(it);
            if (!t) { /* an image, audio, video...: the model's own placeholders */
                cJSON_Delete(out);
                cJSON_Delete(parts);
                *why = RT_CHAT_MEDIA;
                return NULL;
            }
            cJSON_AddItemToArray(parts, cJSON_CreateString(t));
            total += strlen(t) + 1;
        }
    }
    if (openai && !tool) {
        cJSON *list = cJSON_AddArrayToObject(out, "content");
        cJSON_ArrayForEach(it, parts)
        {
            cJSON *p = cJSON_CreateObject();
            cJSON_AddStringToObject(p, "type", "text");
            cJSON_AddStringToObject(p, "text", it->valuestring);
            cJSON_AddItemToArray(list, p);
        }
    } else {
        char *joined = malloc(total + 1), *w = joined;
        if (!joined) {
            cJSON_Delete(out);
            cJSON_Delete(parts);
            *why = RT_CHAT_SHAPE;
            return NULL;
        }
        *w = '\0';
        size_t k = 0;
        cJSON_ArrayForEach(it, parts)
        {
            if (k++)
                *w++ = '\n';
            size_t l = strlen(it->valuestring);
            memcpy(w, it->valuestring, l + 1);
            w += l;
        }
        cJSON_AddStringToObject(out, "content", joined);
        free(joined);
    }
    cJSON_Delete(parts);
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (!strcmp(role->valuestring, "assistant")) {
        if (cJSON_IsArray(calls) && cJSON_GetArraySize(calls) > 0) {
            cJSON *list = cJSON_AddArrayToObject(out, "tool_calls");
            cJSON_ArrayForEach(it, calls)
            {
                cJSON *c = cJSON_Duplicate(it, 1);
                cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
                cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
                if (cJSON_IsObject(fn) && !cJSON_IsObject(args) && !cJSON_IsArray(args)) {
                    /* a JSON string: its value (json.loads); not JSON, or not a string: {} */
                    cJSON *parsed = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
                    if (!parsed)
                        parsed = cJSON_CreateObject();
                    if (args)
                        cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", parsed);
                    else
                        cJSON_AddItemToObject(fn, "arguments", parsed);
                }
                cJSON_AddItemToArray(list, c);
            }
        } else if (calls && !cJSON_IsNull(calls) && !cJSON_IsArray(calls)) {
            add_copy(out, "tool_calls", calls);
        }
        const cJSON *reasoning = cJSON_GetObjectItemCaseSensitive(m, "reasoning");
        if (reasoning && !cJSON_IsNull(reasoning)) {
            add_copy(out, "reasoning", reasoning);
            add_copy(out, "reasoning_content", reasoning);
        }
    } else if (tool) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(m, "tool_call_id");
        if (id)
            add_copy(out, "tool_call_id", id);
    }
    static const char *const keep[] = {"name", "task"};
    for (int k = 0; k < 2; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, keep[k]);
        if (cJSON_IsString(v))
            add_copy(out, keep[k], v);
    }
    return out;
}

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
            add_copy(f, it->string, it);
    cJSON_ArrayForEach(it, t)
        if (strcmp(it->string, "type") && strcmp(it->string, "function"))
            add_copy(out, it->string, it);
    return out;
}

cJSON *rt_chat_as_vllm(const cJSON *req, int openai_content, int *why)
{
    const cJSON *it;
    *why = RT_CHAT_SHAPE;
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(req, "messages");
    if (!cJSON_IsArray(msgs))
        return NULL;
    cJSON *out = cJSON_CreateObject(), *list = cJSON_AddArrayToObject(out, "messages");
    cJSON_ArrayForEach(it, msgs)
    {
        cJSON *m = message(it, openai_content, why);
        if (!m) {
            cJSON_Delete(out);
            return NULL;
        }
        cJSON_AddItemToArray(list, m);
    }
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(req, "tools");
    if (cJSON_IsArray(tools)) {
        cJSON *tl = cJSON_AddArrayToObject(out, "tools");
        cJSON_ArrayForEach(it, tools)
            cJSON_AddItemToArray(tl, tool(it));
    }
    static const char *const asis[] = {"add_generation_prompt", "continue_final_message", "documents",
                                       "chat_template_kwargs"};
    for (int k = 0; k < 4; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(req, asis[k]);
        if (v && !cJSON_IsNull(v))
            add_copy(out, asis[k], v);
    }
    *why = 0;
    return out;
}
