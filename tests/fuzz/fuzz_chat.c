/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_chat.c - libFuzzer harness: a chat request's body made the chat template's input as vLLM makes it
 * (router/chat_prompt.c), read in place from hostile bodies: no crash, nothing leaked, and against an independent
 * parser, cJSON: every message kept, in order, and a message's role and string content (joined text for a
 * template that reads content as a string) decoded as cJSON decodes them. */
#include "chat_prompt.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char *const KEYS[] = {"messages", "tools", "add_generation_prompt", "continue_final_message",
                                   "documents", "chat_template_kwargs", "chat_template"};

/* a member named key once only (a repeated one: cJSON reads the first, json.loads and the router the last) */
static const cJSON *once(const cJSON *o, const char *key)
{
    const cJSON *found = NULL, *x;
    int n = 0;
    cJSON_ArrayForEach(x, o)
        if (x->string && !strcmp(x->string, key))
            found = x, n++;
    return n == 1 ? found : NULL;
}

static void check(const cJSON *given, const cJSON *out, int openai, int nul)
{
    const cJSON *in = once(given, "messages"), *got = cJSON_GetObjectItemCaseSensitive(out, "messages");
    if (!cJSON_IsArray(in) || !cJSON_IsArray(got) || cJSON_GetArraySize(in) != cJSON_GetArraySize(got))
        abort();
    const cJSON *a = in->child, *b = got->child;
    for (; a && b; a = a->next, b = b->next) {
        const cJSON *role = once(a, "role"), *content = once(a, "content");
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(b, "role"), *c = cJSON_GetObjectItemCaseSensitive(b, "content");
        if (!cJSON_IsString(role)) /* repeated: which one is taken is checked through the content no further */
            continue;
        if (!cJSON_IsString(r) || strcmp(role->valuestring, r->valuestring))
            abort();
        if (nul) /* cJSON's strings end at a \u0000 ("tool\u0000x" reads "tool"): which role it is, unsaid */
            continue;
        int as_string = !openai || !strcmp(role->valuestring, "tool");
        if (as_string && cJSON_IsString(content) && (!cJSON_IsString(c) || strcmp(content->valuestring, c->valuestring)))
            abort();
        if (!as_string && cJSON_IsString(content)) { /* one text part holding it */
            const cJSON *part = cJSON_IsArray(c) ? c->child : NULL;
            const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (!cJSON_IsString(text) || strcmp(text->valuestring, content->valuestring) || part->next)
                abort();
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *s = (const char *)data;
    if (jv_check(s, size, NULL, NULL) != 0)
        return 0;
    struct jv body = jv_at(s, s + size);
    if (jv_type(body) != JV_OBJECT)
        return 0;
    struct rt_chat_src src;
    struct jv *at[] = {&src.messages, &src.tools, &src.add_generation_prompt, &src.continue_final_message,
                       &src.documents, &src.chat_template_kwargs, &src.chat_template};
    for (size_t i = 0; i < sizeof KEYS / sizeof *KEYS; i++)
        *at[i] = jv_get(body, KEYS[i]);
    cJSON_Delete(rt_chat_template_args(&src));
    cJSON *given = memchr(s, 0, size) ? NULL : cJSON_ParseWithLength(s, size); /* NULL: a lone surrogate */
    for (int openai = 0; openai < 2; openai++) {
        int why = 0;
        cJSON *out = rt_chat_as_vllm(&src, openai, &why);
        if (!out && why != RT_CHAT_SHAPE && why != RT_CHAT_MEDIA)
            abort(); /* a refusal says why */
        if (out && given && once(given, "messages"))
            check(given, out, openai, memmem(s, size, "\\u0000", 6) != NULL);
        cJSON_Delete(out);
    }
    cJSON_Delete(given);
    return 0;
}
