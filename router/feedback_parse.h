/* SPDX-License-Identifier: Apache-2.0 */
/* feedback_parse.h - vLLM's load series read out of an engine's Prometheus page, and its context length out of
 * its model list (pure: probe.c fetches, this reads; tests/fuzz/fuzz_feedback.c and
 * tests/unit/test_feedback_parse.c exercise it). */
#ifndef XPYD_FEEDBACK_PARSE_H
#define XPYD_FEEDBACK_PARSE_H

#include <stddef.h>

/* vLLM's load series read from one engine's /metrics. */
struct engine_load {
    double waiting;  /* vllm:num_requests_waiting */
    double running;  /* vllm:num_requests_running */
    double kv_usage; /* vllm:kv_cache_usage_perc, else vllm:gpu_cache_usage_perc (0..1) */
    long num_gpu_blocks, block_size; /* vllm:cache_config_info's labels; 0 when absent */
};

/* Parses a Prometheus page for engine label `engine` (every engine when engine < 0: counts summed, the
 * highest KV usage taken) into *out; returns how many series matched. */
int probe_parse_engine_metrics(const char *page, size_t len, int engine, struct engine_load *out);

/* An engine's GET /v1/models answer: the largest `max_model_len` of its models (vLLM's and SGLang's model cards
 * carry it; vLLM's adapter cards leave it null), a positive integer below 2^40; 0 when none is given or the
 * body is not strict JSON of that shape (`{"data": [{..., "max_model_len": N}, ...]}`). */
long probe_parse_models_max_len(const char *body, size_t len);
/* The same answer's LoRA adapters: fn(arg, id, its length) for each card whose `parent` is a string (vLLM lists
 * an adapter with its base model as parent; the base model's parent is null), its id decoded. The number of
 * adapters, or 0 for a body that is not strict JSON of that shape. */
size_t probe_parse_models_adapters(const char *body, size_t len, void (*fn)(void *arg, const char *id, size_t n),
                                   void *arg);

#endif
