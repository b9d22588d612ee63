/* SPDX-License-Identifier: Apache-2.0 */
/* prompt.h - what the router reads of a client's request: the checks it depends on, the prompt's size in
 * tokens (an estimate for text) and its prefix-block hashes (xb_prefix.h), read in place from the body
 * (body_src.h, json_view.h): never a tree, and a long prompt decoded and hashed as it is read. Pure. */
#ifndef XPYD_PROMPT_H
#define XPYD_PROMPT_H

#include "body_src.h"

#include <stddef.h>
#include <stdint.h>

/* The largest max_tokens / max_completion_tokens accepted (a bound on the cost arithmetic). */
#define RW_MAX_TOKENS_LIMIT 1000000000000LL

/* What the router itself depends on in a client body. NULL when fine (and *stream, *max_tokens set; 16 when
 * the client gave no limit), else the message for a 400. */
const char *rw_validate(const struct rw_src *body, int chat, int *stream, int64_t *max_tokens);
/* The output tokens a rank's max_model_len must leave room for beyond the prompt, as vLLM checks a request:
 * max_tokens (max_completion_tokens) as the client set it; absent, a completion's 16 (vLLM's default); a chat's
 * absent or null, or a completion's explicit null: 1 (vLLM then gives the request what the context has left,
 * and refuses only a prompt of max_model_len tokens or more). max_tokens: what rw_validate found. */
int64_t rw_room_tokens(const struct rw_src *body, int chat, int64_t max_tokens);
/* Prompt size in tokens: token-id arrays exactly, text (decoded bytes) by bytes_per_token, chat messages + 4
 * each. */
int64_t rw_estimate_prompt(const struct rw_src *body, int chat, double bytes_per_token);
/* Chained prefix-block hashes of the request's prompt (xb_prefix.h) into *out (malloc'd; NULL when none):
 * token-id prompts by ids, block_tokens per block; text prompts by their decoded bytes, block_tokens ×
 * bytes_per_token per block; chat requests over a canonical serialization of the messages in order (role,
 * name, content text, other content parts and tool calls as their JSON bytes, tool_call_id), so an earlier
 * turn is a prefix of the next. extra (NULL: none): what else names the first block and the others, as
 * xb_hasher_extra (rt_kv_extras: the request's cache_salt). Returns the number of blocks. */
size_t rw_prefix_blocks(const struct rw_src *body, int chat, size_t block_tokens, double bytes_per_token,
                        const uint64_t *extra, uint64_t **out);
/* The chained block hashes of a prompt's token ids, block_tokens per block, exactly as rw_prefix_blocks hashes the
 * same ids sent as a token-id prompt (so a text prompt the router tokenized and its ids share their blocks). */
size_t rw_id_blocks(const uint32_t *ids, size_t n, size_t block_tokens, const uint64_t *extra, uint64_t **out);
/* 1 when a completion prompt is token ids (an array of numbers, or of arrays): counted exactly as it is; then
 * *longest is its longest prompt (its ids, or a batch's longest array of them), else 0. */
int rw_prompt_is_ids(const struct rw_src *body, int64_t *longest);
/* A completion prompt that is text (a string, or an array of up to max strings): its decoded bytes, one after
 * another, in *text (malloc'd), each one's length in (*lens)[] (malloc'd, one per text); returns how many. 0
 * (nothing allocated) for any other shape (token ids, mixed arrays, more than max strings). */
size_t rw_prompt_texts(const struct rw_src *body, char **text, size_t **lens, size_t max);
/* A top-level string member's decoded text (malloc'd), or NULL when absent or not a string. */
char *rw_string_member(const struct rw_src *body, const char *key);

#endif
