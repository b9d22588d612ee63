/* SPDX-License-Identifier: Apache-2.0 */
/* chat_prompt.h - a chat request as vLLM passes it to the model's chat template (chat_prompt.c), for the router
 * to render and count the prompt the engine will compute (tokenize.c). Pure; any thread. */
#ifndef XPYD_CHAT_PROMPT_H
#define XPYD_CHAT_PROMPT_H

#include <stddef.h>

struct cJSON;

enum { RT_CHAT_SHAPE = 1, RT_CHAT_MEDIA }; /* why a request cannot be rendered here */

/* The body (a chat completion request, parsed) as vLLM's template input: {"messages", "tools",
 * "add_generation_prompt", "continue_final_message", "documents", "chat_template_kwargs"} (for xtok_chat_render;
 * the caller frees it). openai_content: the template loops over content parts (xtok_chat_openai_content). NULL
 * with *why when it cannot be. */
struct cJSON *rt_chat_as_vllm(const struct cJSON *body, int openai_content, int *why);

#endif
