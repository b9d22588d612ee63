/* SPDX-License-Identifier: Apache-2.0 */
/* probe.h - background checks of every engine endpoint, run on the router's main event loop: active health
 * checks with hysteresis (GET /health) and, optionally, engine load feedback (GET /metrics). */
#ifndef XPYD_PROBE_H
#define XPYD_PROBE_H

#include <stddef.h>

struct event_base;
struct probe;

/* Starts the periodic checks configured in g_rt->cfg (either may be off). NULL when both are off. */
struct probe *probe_start(struct event_base *base);
void probe_stop(struct probe *p);

/* vLLM's load series read from one engine's /metrics. */
struct engine_load {
    double waiting;  /* vllm:num_requests_waiting */
    double running;  /* vllm:num_requests_running */
    double kv_usage; /* vllm:kv_cache_usage_perc, else vllm:gpu_cache_usage_perc (0..1) */
    long num_gpu_blocks, block_size; /* vllm:cache_config_info's labels; 0 when absent */
};

/* Parses a Prometheus page for engine label `engine` (every engine when engine < 0: counts summed, the
 * highest KV usage taken) into *out; returns how many series matched. Exposed for unit tests. */
int probe_parse_engine_metrics(const char *page, size_t len, int engine, struct engine_load *out);

#endif
