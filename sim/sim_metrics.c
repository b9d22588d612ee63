/* SPDX-License-Identifier: Apache-2.0 */
/* sim_metrics.c - xpyd_sim's /metrics: vLLM's series (per DP rank) and the simulator's own counters. */
#include "sim_internal.h"
#include "xpyd_reply.h"

#include "xpyd_oai.h"
#include "xpyd_sse.h"
#include "xpyd_util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <netinet/in.h>
#include <evhtp/evhtp.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static void metric_head(struct evbuffer *b, const char *name, const char *type, const char *help)
{
    evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void sim_on_metrics(evhtp_request_t *req, void *arg)
{
    struct sim *s = sim_rank_of(arg)->sim;
    struct evbuffer *b = XPYD_XALLOC(evbuffer_new());
    int lo = 0, hi = s->nranks;
    if (!s->cfg.dp_internal && s->nranks > 1) { /* external: each port reports its own rank */
        lo = sim_rank_of(arg)->idx;
        hi = lo + 1;
    }
    const char *m = s->model_json;
    struct {
        const char *name, *type, *help;
        int which;
    } per_rank[] = {
        {"vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", 0},
        {"vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", 1},
        {"vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", 2},
        {"vllm:gpu_cache_usage_perc", "gauge", "GPU KV-cache usage (older name).", 2},
        {"vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", 3},
        {"vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", 4},
        {"vllm:request_success_total", "counter", "Count of successfully processed requests.", 5},
        {"xpyd_sim:requests_total", "counter", "Requests admitted by the simulator.", 6},
        {"xpyd_sim:requests_aborted_total", "counter", "Requests aborted (client disconnect or abort_request).", 7},
        {"vllm:prefix_cache_queries_total", "counter",
         "Prefix cache queries, in terms of number of queried tokens.", 8},
        {"vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.", 9},
    };
    for (size_t i = 0; i < sizeof per_rank / sizeof per_rank[0]; i++) {
        metric_head(b, per_rank[i].name, per_rank[i].type, per_rank[i].help);
        for (int k = lo; k < hi; k++) {
            struct sim_rank *rk = &s->ranks[k];
            double cap = s->cfg.kv_capacity_tokens > 0 ? (double)s->cfg.kv_capacity_tokens
                                                       : (double)s->cfg.max_batch * (double)s->cfg.max_model_len;
            double v = 0;
            switch (per_rank[i].which) {
            case 0: v = (double)rk->running; break;
            case 1: v = (double)rk->waiting_n; break;
            case 2: v = cap > 0 ? (double)rk->kv_tokens_running / cap : 0; break;
            case 3: v = (double)rk->prompt_tokens_total; break;
            case 4: v = (double)rk->generation_tokens_total; break;
            case 5: v = (double)rk->success_total; break;
            case 6: v = (double)rk->requests_total; break;
            case 7: v = (double)rk->aborted_total; break;
            case 8: v = (double)rk->prefix_queries; break;
            default: v = (double)rk->prefix_hits; break;
            }
            evbuffer_add_printf(b, "%s{engine=\"%d\",model_name=\"%s\"} %.17g\n", per_rank[i].name, k, m, v);
        }
    }
    metric_head(b, "vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig.");
    evbuffer_add_printf(b, "vllm:cache_config_info{block_size=\"%ld\",enable_prefix_caching=\"%s\",num_gpu_blocks=\"%ld\"} 1.0\n",
                        s->cfg.block_size, s->cfg.prefix_caching ? "True" : "False", s->cfg.num_gpu_blocks);
    metric_head(b, "xpyd_sim:handoffs_total", "counter", "KV handoffs on the decode side, by mode and result.");
    for (int mo = 0; mo < SIM_NHANDOFFS; mo++)
        for (int res = 0; res < HO_NRESULTS; res++)
            if (mo != SIM_HANDOFF_NONE)
            evbuffer_add_printf(b, "xpyd_sim:handoffs_total{mode=\"%s\",result=\"%s\"} %" PRIu64 "\n",
                                sim_handoff_name(mo), ho_result_names[res], s->handoffs[mo][res]);
    struct {
        const char *name, *type, *help;
        uint64_t v;
    } g[] = {
        {"xpyd_sim:kv_leases_active", "gauge", "KV leases held by this prefill, waiting to be pulled.",
         (uint64_t)s->leases.count},
        {"xpyd_sim:kv_leases_created_total", "counter", "KV leases created.", s->leases_created},
        {"xpyd_sim:kv_leases_released_total", "counter", "KV leases pulled by a decode and freed.",
         s->leases_released},
        {"xpyd_sim:kv_leases_expired_total", "counter", "KV leases that expired unpulled (stranded KV).",
         s->leases_expired},
        {"xpyd_sim:kv_leases_aborted_total", "counter", "KV leases dropped because their request was aborted.",
         s->leases_aborted},
        {"xpyd_sim:kv_leases_cancelled_total", "counter",
         "KV leases freed because their decode was aborted before pulling (/kv/release).", s->leases_cancelled},
        {"xpyd_sim:kv_release_notices_total", "counter", "Releases this decode sent for KV it never pulled.",
         s->release_notices},
        {"xpyd_sim:kv_bytes_sent_total", "counter", "KV bytes served to decodes or written to the store.",
         s->kv_bytes_sent},
        {"xpyd_sim:kv_bytes_received_total", "counter", "KV bytes pulled or read from the store.",
         s->kv_bytes_received},
        {"xpyd_sim:abort_requests_total", "counter", "Requests cancelled through /abort_request.",
         s->aborts_requested},
        {"xpyd_sim:kv_xpyd_releases_total", "counter", "KV leases released by an xpyd notification.",
         s->xt_releases},
        {"xpyd_sim:abort_request_calls_total", "counter", "POST /abort_request calls received (found or not).",
         s->abort_calls},
        {"xpyd_sim:stream_backpressure_waits_total", "counter",
         "Token steps put off because a stream's reader was not taking its bytes (--stream-buffer-bytes).",
         s->stream_waits},
    };
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
        metric_head(b, g[i].name, g[i].type, g[i].help);
        evbuffer_add_printf(b, "%s %" PRIu64 "\n", g[i].name, g[i].v);
    }
    uint64_t pending = 0; /* streamed bytes written by the engine that its peer has not taken yet */
    for (struct sreq *q = LIST_FIRST(&s->all); q; q = LIST_NEXT(q, all)) {
        if (q->stream_started && q->ereq) {
            struct bufferevent *bev = evhtp_connection_get_bev(evhtp_request_get_connection(q->ereq));
            if (bev)
                pending += evbuffer_get_length(bufferevent_get_output(bev));
        }
    }
    metric_head(b, "xpyd_sim:stream_bytes_pending", "gauge",
                "Streamed bytes waiting in this engine because its reader (the router) is not taking them.");
    evbuffer_add_printf(b, "xpyd_sim:stream_bytes_pending %" PRIu64 "\n", pending);
    metric_head(b, "xpyd_sim:faults_injected_total", "counter", "Faults injected, by kind.");
    evbuffer_add_printf(b, "xpyd_sim:faults_injected_total{kind=\"fail_rate\"} %" PRIu64 "\n", s->faults_fail_rate);
    evbuffer_add_printf(b, "xpyd_sim:faults_injected_total{kind=\"status_code\"} %" PRIu64 "\n", s->faults_status);
    evbuffer_add_printf(b, "xpyd_sim:faults_injected_total{kind=\"disconnect\"} %" PRIu64 "\n", s->faults_disconnect);
    evbuffer_add_printf(b, "xpyd_sim:faults_injected_total{kind=\"stall\"} %" PRIu64 "\n", s->faults_stall);
    xpyd_reply_buffer(req, 200, "text/plain; version=0.0.4", b);
    evbuffer_free(b);
}

