/* SPDX-License-Identifier: Apache-2.0 */
/* chat_prompt.h - a chat request as vLLM passes it to the model's chat template (chat_prompt.c), for the router
 * to render and count the prompt the engine will compute (tokenize.c). Pure; any thread. */
#ifndef XPYD_CHAT_PROMPT_H
#define XPYD_CHAT_PROMPT_H

#include "json_view.h"

#include <stddef.h>

struct cJSON;

enum { RT_CHAT_SHAPE = 1, RT_CHAT_MEDIA }; /* why a request cannot be rendered here */

/* The top-level members of a chat request's body (checked JSON: views, json_view.h) the template's input is made
 * of, each the last of a repeated key (json.loads); absent views where the body has none. */
struct rt_chat_src {
    struct jv messages, tools, add_generation_prompt, continue_final_message, documents, chat_template_kwargs,
        chat_template;
};
/* {"chat_template", "chat_template_kwargs"} as the body gives them (what picks the template:
 * xtok_chat_for_request); the caller frees it. NULL when it cannot be made. */
struct cJSON *rt_chat_template_args(const struct rt_chat_src *s);
/* The body as vLLM's template input: {"messages", "tools", "add_generation_prompt", "continue_final_message",
 * "documents", "chat_template_kwargs"} (for xtok_chat_render; the caller frees it). openai_content: the template
 * loops over content parts (xtok_chat_openai_content). NULL with *why when it cannot be. */
struct cJSON *rt_chat_as_vllm(const struct rt_chat_src *s, int openai_content, int *why);

#endif
