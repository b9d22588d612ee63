/* SPDX-License-Identifier: Apache-2.0 */
/* sim_chat.h - the simulated engine's chat prompt: the request as vLLM passes it to the model's chat template,
 * rendered (sim_chat.c). */
#ifndef XPYD_SIM_CHAT_H
#define XPYD_SIM_CHAT_H

#include <stddef.h>

struct cJSON;
struct xtok_chat;

/* The prompt text vLLM renders for a chat request body (root). 0, or -1 with the template's error in err. */
int sim_chat_render(const struct xtok_chat *chat, const struct cJSON *root, char **text, size_t *n, char *err,
                    size_t errlen);

#endif
