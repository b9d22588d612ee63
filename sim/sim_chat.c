/* SPDX-License-Identifier: Apache-2.0 */
/* sim_chat.c - xpyd_sim --tokenizer: a chat request's prompt as vLLM builds it (sim_chat.h): the messages as
 * vLLM's chat_utils passes them to the model's chat template (content null -> no text, a string -> one text part,
 * text parts joined with "\n" for a template that reads content as a string, kept as {"type": "text"} parts for
 * one that loops over them; an assistant's tool_calls with string arguments parsed as JSON ({} when not JSON), an
 * empty list dropped; tool_call_id, name), the tools as vLLM's pydantic models dump them (type, function {name,
 * description, parameters} with nulls for the absent ones), add_generation_prompt true by default, then
 * rendered (libxpyd_tokenizer's template engine, as vLLM renders through transformers) and encoded with the
 * model's tokenizer, with special tokens only when the body says add_special_tokens: true. The simulator's own
 * model of the engine: the router's counterpart (router/chat_prompt.c) is separate code. */
#include "sim_chat.h"

#include "xpyd_tokenizer.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

/* a member as vLLM's json.loads reads the body: the last of a repeated key (cJSON's own lookup finds the first) */
static const cJSON *member(const cJSON *o, const char *key)
{
    const cJSON *found = NULL, *it;
    if (cJSON_IsObject(o))
        cJSON_ArrayForEach(it, o) if (it->string && !strcmp(it->string, key)) found = it;
    return found;
}

/* A message's content as vLLM's _parse_chat_message_content_parts reads it: a string is one text part; a part that
 * is a string is text, a text/input_text/output_text part its "text", refusal and thinking parts theirs. For a
 * template reading content as a string (parts_mode 0) only non-empty texts are kept; for one looping over parts,
 * a text or refusal part without its text is dropped, other kinds kept with a null text, "" kept. as_list: the
 * kept texts as [{"type": "text", "text": ...}] parts, else joined with "\n" (a tool's always are). */
static cJSON *text_of(const cJSON *content, int parts_mode, int as_list)
{
    cJSON *kept = cJSON_CreateArray();
    const cJSON *it;
    cJSON *one = cJSON_IsString(content) ? cJSON_CreateString(content->valuestring) : NULL;
    const cJSON *list = one ? NULL : content;
    for (const cJSON *p = one ? one : (cJSON_IsArray(list) ? list->child : NULL); p; p = one ? NULL : p->next) {
        const cJSON *type = member(p, "type");
        const char *kind = cJSON_IsString(p) ? "text" : cJSON_IsString(type) ? type->valuestring : "";
        const char *key = !strcmp(kind, "refusal") ? "refusal" : !strcmp(kind, "thinking") ? "thinking" : "text";
        const cJSON *t = cJSON_IsString(p) ? p : member(p, key);
        if (cJSON_IsString(t)) {
            if (parts_mode || t->valuestring[0])
                cJSON_AddItemToArray(kept, cJSON_CreateString(t->valuestring));
        } else if (parts_mode && strcmp(kind, "text") && strcmp(kind, "refusal")) {
            cJSON_AddItemToArray(kept, cJSON_CreateNull());
        }
    }
    cJSON_Delete(one);
    if (as_list) {
        cJSON *out = cJSON_CreateArray();
        cJSON_ArrayForEach(it, kept)
        {
            cJSON *p = cJSON_CreateObject();
            cJSON_AddStringToObject(p, "type", "text");
            cJSON_AddItemToObject(p, "text", cJSON_Duplicate(it, 0));
            cJSON_AddItemToArray(out, p);
        }
        cJSON_Delete(kept);
        return out;
    }
    size_t total = 1;
    cJSON_ArrayForEach(it, kept) total += (cJSON_IsString(it) ? strlen(it->valuestring) : 0) + 1;
    char *s = calloc(1, total);
    cJSON_ArrayForEach(it, kept)
    {
        if (it != kept->child)
            strcat(s, "\n");
        if (cJSON_IsString(it))
            strcat(s, it->valuestring);
    }
    cJSON *out = cJSON_CreateString(s ? s : "");
    free(s);
    cJSON_Delete(kept);
    return out;
}

static cJSON *conversation(const cJSON *msgs, int as_parts)
{
    cJSON *out = cJSON_CreateArray();
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs)
    {
        const cJSON *role = member(m, "role");
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "role", cJSON_IsString(role) ? role->valuestring : "");
        int tool = cJSON_IsString(role) && !strcmp(role->valuestring, "tool");
        cJSON_AddItemToObject(x, "content", text_of(member(m, "content"), as_parts, as_parts && !tool));
        const cJSON *calls = member(m, "tool_calls"), *c;
        if (cJSON_IsString(role) && !strcmp(role->valuestring, "assistant") && cJSON_IsArray(calls) &&
            cJSON_GetArraySize(calls)) {
            cJSON *list = cJSON_AddArrayToObject(x, "tool_calls");
            cJSON_ArrayForEach(c, calls)
            {
                cJSON *call = cJSON_Duplicate(c, 1), *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
                cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments"); /* (the one replaced below) */
                if (cJSON_IsObject(fn) && cJSON_IsString(args)) {
                    cJSON *v = cJSON_Parse(args->valuestring);
                    xtok_json_literals(v, args->valuestring, strlen(args->valuestring)); /* 1.0 a float */
                    cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", v ? v : cJSON_CreateObject());
                } else if (cJSON_IsObject(fn) && !cJSON_IsObject(args) && !cJSON_IsArray(args)) {
                    cJSON_DeleteItemFromObjectCaseSensitive(fn, "arguments");
                    cJSON_AddItemToObject(fn, "arguments", cJSON_CreateObject());
                }
                cJSON_AddItemToArray(list, call);
            }
        }
        const cJSON *reasoning = member(m, "reasoning");
        if (cJSON_IsString(role) && !strcmp(role->valuestring, "assistant") && reasoning && !cJSON_IsNull(reasoning)) {
            cJSON_AddItemToObject(x, "reasoning", cJSON_Duplicate(reasoning, 1));
            cJSON_AddItemToObject(x, "reasoning_content", cJSON_Duplicate(reasoning, 1));
        }
        const cJSON *id = member(m, "tool_call_id");
        if (tool && id)
            cJSON_AddItemToObject(x, "tool_call_id", cJSON_Duplicate(id, 1));
        static const char *const keep[] = {"name", "task"};
        for (int k = 0; k < 2; k++) {
            const cJSON *v = member(m, keep[k]);
            if (cJSON_IsString(v))
                cJSON_AddItemToObject(x, keep[k], cJSON_Duplicate(v, 1));
        }
        cJSON_AddItemToArray(out, x);
    }
    return out;
}

static cJSON *tools_dumped(const cJSON *tools)
{
    cJSON *out = cJSON_CreateArray();
    const cJSON *t, *it;
    cJSON_ArrayForEach(t, tools)
    {
        cJSON *x = cJSON_CreateObject(), *f;
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type"), *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        cJSON_AddItemToObject(x, "type", type ? cJSON_Duplicate(type, 1) : cJSON_CreateString("function"));
        f = cJSON_AddObjectToObject(x, "function");
        static const char *const fields[] = {"name", "description", "parameters"};
        for (int k = 0; k < 3; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(fn, fields[k]);
            cJSON_AddItemToObject(f, fields[k], v ? cJSON_Duplicate(v, 1) : cJSON_CreateNull());
        }
        cJSON_ArrayForEach(it, fn) if (strcmp(it->string, "name") && strcmp(it->string, "description") &&
                                       strcmp(it->string, "parameters"))
            cJSON_AddItemToObject(f, it->string, cJSON_Duplicate(it, 1));
        cJSON_ArrayForEach(it, t) if (strcmp(it->string, "type") && strcmp(it->string, "function"))
            cJSON_AddItemToObject(x, it->string, cJSON_Duplicate(it, 1));
        cJSON_AddItemToArray(out, x);
    }
    return out;
}

int sim_chat_render(const struct xtok_chat *chat, const cJSON *root, char **text, size_t *n, char *err,
                    size_t errlen)
{
    cJSON *req = cJSON_CreateObject();
    int parts = xtok_chat_openai_content(chat);
    cJSON_AddItemToObject(req, "messages", conversation(member(root, "messages"), parts));
    const cJSON *tools = member(root, "tools");
    if (cJSON_IsArray(tools))
        cJSON_AddItemToObject(req, "tools", tools_dumped(tools));
    static const char *const asis[] = {"add_generation_prompt", "continue_final_message", "documents",
                                       "chat_template_kwargs"};
    for (int k = 0; k < 4; k++) {
        const cJSON *v = member(root, asis[k]);
        if (v && !cJSON_IsNull(v))
            cJSON_AddItemToObject(req, asis[k], cJSON_Duplicate(v, 1));
    }
    int rc = xtok_chat_render(chat, req, NULL, text, n, err, errlen);
    cJSON_Delete(req);
    return rc;
}
