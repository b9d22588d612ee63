/* SPDX-License-Identifier: Apache-2.0 */
/* rewrite.h - what the router reads from and patches in engines' JSON answers (a prefill's answer, a decode's
 * events and usage), as pure functions (no router state), unit-tested and fuzzed on their own
 * (tests/fuzz/fuzz_rewrite.c, fuzz_relay.c). A client's request body is body_src.h's and prompt.h's. */
#ifndef XPYD_REWRITE_H
#define XPYD_REWRITE_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

/* Serialises o (never NULL: aborts on OOM); *len its length. */
char *rw_print(const cJSON *o, size_t *len);
/* A continuation's usage as one engine would have reported it: the delivered tokens the continuation read as
 * prompt move back to completion_tokens (total unchanged). 1 when a usage object was patched. */
int rw_patch_usage_continuation(cJSON *o, long delivered);

/* What the router keeps from a prefill's (non-streamed) answer. */
struct rw_prefill_answer {
    char *kv_params;       /* kv_transfer_params, its bytes as the engine wrote them (a checked JSON object): what
                            * the decode receives (owned), or NULL. Text, not a tree: held for every waiting
                            * stream, and copied rather than reprinted (a reprint costs a printf per number) */
    int64_t prompt_tokens; /* usage.prompt_tokens, or -1 */
    long cached_tokens;    /* usage.prompt_tokens_details.cached_tokens, or -1 */
    char *id;              /* owned, or NULL */
    char *first_text;      /* choices[0].text or .message.content (owned), or NULL */
};
/* 0, or -1 when the answer is not one strict JSON object (json_view.h; a repeated key reads as its last).
 * Counts out of range are ignored (-1). */
int rw_absorb_prefill(const char *json, size_t len, struct rw_prefill_answer *out);
void rw_prefill_answer_free(struct rw_prefill_answer *a);
/* A decode event's usage: prompt_tokens_details.cached_tokens set to the prefill's (cached >= 0), or the
 * details removed (cached < 0: the truth is unknown). 1 when o changed. */
int rw_patch_usage(cJSON *o, long cached_tokens);
/* choices[0].text, or choices[0].delta.content, or NULL. */
const char *rw_event_text(const cJSON *o);

#endif
