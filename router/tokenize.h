/* SPDX-License-Identifier: Apache-2.0 */
/* tokenize.h - --tokenizer: the router counts a completion prompt's tokens with the model's own tokenizer
 * (libxpyd_tokenizer), on a pool of threads of its own, and hashes the prompt's prefix blocks over its token
 * ids. The request waits (state NEW, nothing picked, nothing charged) until its ids are back on its own event
 * loop; a client leaving meanwhile ends it at once and the ids are dropped when they arrive. */
#ifndef XPYD_TOKENIZE_H
#define XPYD_TOKENIZE_H

#include <stddef.h>
#include <stdint.h>

struct router;
struct rthread;
struct request;

/* Where a request's prompt_tokens come from (access log prompt_src=). */
enum rt_prompt_src { RT_PS_ESTIMATE = 0, RT_PS_IDS, RT_PS_TOKENIZER, RT_PS_ENGINE };
extern const char *const rt_prompt_src_names[4];

/* Why a prompt was not tokenized with --tokenizer on (xpyd_tokenizer_fallbacks_total{reason}). */
enum rt_tok_fallback { RT_TF_TEMPLATE = 0, RT_TF_BUSY, RT_TF_INVALID, RT_TF_SHAPE, RT_TF_MEDIA, RT_TF_RENDER,
                       RT_TF_REQUEST_TEMPLATE, RT_TF_STALLED, RT_TF_COUNT };
extern const char *const rt_tok_fallback_names[RT_TF_COUNT];

/* Loads --tokenizer and starts its threads (nothing when it is empty). -1 with the reason on stderr. */
int rt_tok_setup(struct router *rt);
/* Stops the threads (jobs in flight finish; their results are delivered or dropped). */
void rt_tok_stop(void);
/* A router thread's inbox of finished jobs (called by rt_thread_new / rt_thread_free on that thread). */
void rt_tok_thread_init(struct rthread *t);
void rt_tok_thread_free(struct rthread *t);

/* 1 when r's prompt is for the tokenizer (--tokenizer on, a completion prompt that is not token ids): its prefix
 * blocks are then left to rt_tok_start. */
int rt_tok_wants(const struct request *r);
/* How a tokenized request goes on, on its own thread (request.c): refusal is NULL, or the 400's message when the
 * exact count fits no rank's max_model_len. */
typedef void (*rt_tok_go)(struct request *r, const char *refusal);
/* At a request's start (req_begin): 1 when its prompt went to be tokenized (it goes on by itself, through go,
 * when its ids are back); 0 when it goes on now with the byte estimate. */
int rt_tok_start(struct request *r, rt_tok_go go);
/* An exact count (the tokenizer's, or a prompt of token ids) that no rank can hold with the output tokens it
 * must leave room for (rw_room_tokens): 1, with vLLM's words for the client's 400 in msg. */
int rt_tok_too_long(const struct request *r, char *msg, size_t size);
/* vLLM's truncate_prompt_tokens (an integer >= -1; anything else: none, the engine judges it) read from the body
 * into r->truncate, and the counts made so far (the estimate, a token-id prompt's) cut to it: vLLM keeps a
 * prompt's last k tokens (its special tokens kept around them), -1 meaning max_model_len. */
void rt_tok_truncation_in(struct request *r);
/* The length prompts are cut to: k, or for -1 the smallest max_model_len the pools know; -1 when none. */
int64_t rt_tok_truncation(const struct request *r);
/* The request ended while its prompt was being tokenized: the ids will be dropped. */
void rt_tok_detach(struct request *r);
/* The prefill reported prompt_tokens for r: counted as a mismatch when the router's own count differs. */
void rt_tok_check(struct request *r, int64_t engine_prompt_tokens);
/* The tokenization cache's size and hit counts into the counters (after each prompt). */
void rt_tok_refresh_metrics(void);

#endif
