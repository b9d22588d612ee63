/* SPDX-License-Identifier: Apache-2.0 */
/* state.c - the router's one global (g_rt: configuration, pools, endpoints, counters; set up by main.c) and
 * its constant tables. A leaf: every module reads these, and this file calls nobody. */
#include "router.h"
#include "tokenize.h"

#include "xpyd_util.h"

#include <stdio.h>
#include <string.h>

struct router *g_rt;

/* Every way a request can fail: the `reason` label of xpyd_request_errors_total and the access log, and the
 * HTTP status the client gets when it happens before the first byte. */
const struct rt_fail_row rt_fail_table[RF_COUNT] = {
    [RF_NONE] = {"none", 200, RT_OUT_OK, -1},
    [RF_BAD_REQUEST] = {"bad_request", 400, RT_OUT_CLIENT_ERROR, -1},
    [RF_BODY_TOO_LARGE] = {"body_too_large", 413, RT_OUT_CLIENT_ERROR, -1},
    [RF_NO_PREFILL] = {"no_prefill_available", 503, RT_OUT_ERROR, -1},
    [RF_NO_DECODE] = {"no_decode_available", 503, RT_OUT_ERROR, -1},
    [RF_CONTEXT_TOO_LONG] = {"context_too_long", 503, RT_OUT_CLIENT_ERROR, -1},
    [RF_PREFILL_CONNECT] = {"prefill_connect", 502, RT_OUT_ERROR, RT_CAUSE_CONNECT},
    [RF_PREFILL_TIMEOUT] = {"prefill_timeout", 504, RT_OUT_ERROR, RT_CAUSE_TIMEOUT},
    [RF_PREFILL_STATUS] = {"prefill_status", 502, RT_OUT_ERROR, RT_CAUSE_STATUS},
    [RF_PREFILL_BAD_RESPONSE] = {"prefill_bad_response", 502, RT_OUT_ERROR, RT_CAUSE_BAD_RESPONSE},
    [RF_DECODE_CONNECT] = {"decode_connect", 502, RT_OUT_ERROR, RT_CAUSE_CONNECT},
    [RF_DECODE_TIMEOUT] = {"decode_timeout", 504, RT_OUT_ERROR, RT_CAUSE_TIMEOUT},
    [RF_DECODE_STATUS] = {"decode_status", 502, RT_OUT_ERROR, RT_CAUSE_STATUS},
    [RF_DECODE_BROKEN_STREAM] = {"decode_broken_stream", 502, RT_OUT_ERROR, RT_CAUSE_BROKEN_STREAM},
    [RF_RESPONSE_TOO_LARGE] = {"response_too_large", 502, RT_OUT_ERROR, RT_CAUSE_BAD_RESPONSE},
    [RF_CLIENT_DISCONNECT] = {"client_disconnect", 499, RT_OUT_CLIENT_ABORT, -1},
    [RF_QUEUE_FULL] = {"queue_full", 429, RT_OUT_OVERLOADED, -1},
    [RF_QUEUE_TIMEOUT] = {"queue_timeout", 503, RT_OUT_OVERLOADED, -1},
    [RF_UNAUTHORIZED] = {"unauthorized", 401, RT_OUT_CLIENT_ERROR, -1},
    [RF_METHOD_NOT_ALLOWED] = {"method_not_allowed", 405, RT_OUT_CLIENT_ERROR, -1},
    [RF_DRAINING] = {"draining", 503, RT_OUT_OVERLOADED, -1},
    [RF_DECODE_PREEMPTED] = {"decode_preempted", 502, RT_OUT_ERROR, RT_CAUSE_BROKEN_STREAM},
    [RF_LOOP_DETECTED] = {"loop_detected", 508, RT_OUT_ERROR, -1},
    [RF_BODY_MEMORY] = {"body_memory_full", 503, RT_OUT_OVERLOADED, -1},
};

const char *const rt_outcome_names[RT_OUT_COUNT] = {"ok", "error", "client_error", "client_abort", "overloaded"};
const char *const rt_tok_fallback_names[RT_TF_COUNT] = {"template", "busy",   "invalid_text",    "shape",
                                                         "media",    "render", "request_template", "stalled"}; /* tokenize.h */
const char *const rt_cause_names[RT_CAUSE_COUNT] = {"connect", "timeout", "status", "broken_stream", "bad_response"};

void rt_count_instance_error(int role, int idx, int fail)
{
    int cause = fail > RF_NONE && fail < RF_COUNT ? rt_fail_table[fail].cause : -1;
    if (idx < 0 || idx >= 4096 || cause < 0)
        return;
    atomic_fetch_add(&g_rt->ctr.instance_errors[role][idx][cause], 1);
}

int rt_body_memory_reserve(int64_t n)
{
    int64_t cur = atomic_load(&g_rt->ctr.body_bytes);
    do {
        if (cur + n > g_rt->cfg.max_body_memory_bytes)
            return 0;
    } while (!atomic_compare_exchange_weak(&g_rt->ctr.body_bytes, &cur, cur + n));
    return 1;
}

void rt_body_memory_add(int64_t n)
{
    atomic_fetch_add(&g_rt->ctr.body_bytes, n);
}

void rt_body_memory_release(int64_t n)
{
    atomic_fetch_sub(&g_rt->ctr.body_bytes, n);
}

int rt_rank_removed(int role, int idx)
{
    struct xb_instance_stats st;
    return xb_stats(g_rt->pools[role], idx, &st) != 0 || st.removed;
}
