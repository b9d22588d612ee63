/* metrics.c - the router's Prometheus page: counters, latency histograms, per-rank numbers. Updates are
 * atomics on the hot path; a scrape only reads them and never blocks request handling. */
#include "router.h"
#include "xpyd_util.h"

#include <event2/buffer.h>
#include <evhtp/evhtp.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static const double bounds[RT_HIST_NB] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                          1,     2.5,    5,     10,   25,    50,   100, 240};
static const char *const hist_names[RT_H_COUNT][2] = {
    {"xpyd_ttft_seconds", "Time to first token the client saw (streams)."},
    {"xpyd_itl_seconds", "Gaps between streamed tokens relayed to clients."},
    {"xpyd_e2e_seconds", "Whole request, accept to last byte (successful requests)."},
    {"xpyd_prefill_seconds", "Prefill leg: sent to answered."},
    {"xpyd_decode_seconds", "Decode leg: sent to finished."},
    {"xpyd_kv_handoff_seconds", "xpyd handoff: KV transfer time the decode reported (X-KV-Transfer)."},
};

void rt_hist_observe(int kind, double seconds)
{
    if (!g_rt->cfg.metrics || seconds < 0)
        return;
    struct rt_hist *h = &g_rt->ctr.hist[kind];
    int i = 0;
    while (i < RT_HIST_NB && seconds > bounds[i])
        i++;
    if (i < RT_HIST_NB)
        atomic_fetch_add_explicit(&h->b[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, (uint64_t)(seconds * 1e9), memory_order_relaxed);
}

static void hist_print(struct evbuffer *b, struct rt_counters *c)
{
    for (int k = 0; k < RT_H_COUNT; k++) {
        const char *n = hist_names[k][0];
        evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", n, hist_names[k][1], n);
        uint64_t cum = 0, count = (uint64_t)atomic_load(&c->hist[k].count);
        for (int i = 0; i < RT_HIST_NB; i++) {
            cum += (uint64_t)atomic_load(&c->hist[k].b[i]);
            evbuffer_add_printf(b, "%s_bucket{le=\"%g\"} %" PRIu64 "\n", n, bounds[i], cum);
        }
        /* count is read last; +Inf must not be below the last bucket even if observations raced the scrape */
        evbuffer_add_printf(b, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", n, count > cum ? count : cum);
        evbuffer_add_printf(b, "%s_sum %.9f\n%s_count %" PRIu64 "\n", n,
                            (double)atomic_load(&c->hist[k].sum_ns) / 1e9, n, count > cum ? count : cum);
    }
}

static void metric_head(struct evbuffer *b, const char *name, const char *type, const char *help)
{
    evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void rt_metrics_handler(evhtp_request_t *req, void *arg)
{
    if (!rt_method_allowed(req, "GET, HEAD"))
        return;
    struct rt_counters *c = &g_rt->ctr;
    struct evbuffer *b = evbuffer_new();
    metric_head(b, "xpyd_requests_total", "counter",
                "Client requests by endpoint and HTTP status (499: the client went away first).");
    for (int e = 0; e < RT_EP_COUNT; e++)
        for (int k = 100; k < 600; k++) {
            uint64_t v = (uint64_t)atomic_load(&c->requests[e][k]);
            if (v || k == 200) /* 200 always present, so dashboards have a series from the start */
                evbuffer_add_printf(b, "xpyd_requests_total{endpoint=\"%s\",status=\"%d\"} %" PRIu64 "\n",
                                    e ? "/v1/chat/completions" : "/v1/completions", k, v);
        }
    hist_print(b, c);
    metric_head(b, "xpyd_request_errors_total", "counter", "Failed requests by reason (the router's failure table).");
    for (int f = 1; f < RF_COUNT; f++)
        evbuffer_add_printf(b, "xpyd_request_errors_total{reason=\"%s\"} %" PRIu64 "\n", rt_fail_table[f].name,
                            (uint64_t)atomic_load(&c->errors[f]));
    metric_head(b, "xpyd_retries_total", "counter", "Attempts retried on another instance.");
    for (int r = 0; r < 2; r++)
        evbuffer_add_printf(b, "xpyd_retries_total{role=\"%s\"} %" PRIu64 "\n", r ? "decode" : "prefill",
                            (uint64_t)atomic_load(&c->retries[r]));
    struct {
        const char *name, *type, *help;
        uint64_t v;
    } g[] = {
        {"xpyd_repeat_clones_total", "counter", "Decode-only clones fired by --repeat-d-times.",
         (uint64_t)atomic_load(&c->repeat_clones)},
        {"xpyd_kv_release_dispatches_total", "counter",
         "Requests dispatched to a decode and cancelled to free a prefill's KV after every decode attempt failed.",
         (uint64_t)atomic_load(&c->kv_release_dispatches)},
        {"xpyd_metadata_keys", "gauge", "Keys in the /metadata store.", (uint64_t)rt_metadata_count()},
        {"xpyd_kv_bytes_total", "counter", "xpyd handoff: KV bytes the decodes reported moving.",
         (uint64_t)atomic_load(&c->kv_bytes)},
        {"xpyd_kv_releases_total", "counter", "xpyd handoff: release notifications sent to prefill engines.",
         (uint64_t)atomic_load(&c->kv_releases[0])},
        {"xpyd_kv_release_failures_total", "counter", "xpyd handoff: release notifications that could not be sent.",
         (uint64_t)atomic_load(&c->kv_releases[1])},
        {"xpyd_first_token_mismatch_total", "counter", "Prefill and decode first tokens that differed.",
         (uint64_t)atomic_load(&c->first_token_mismatch)},
        {"xpyd_client_disconnects_total", "counter", "Clients that went away before their answer ended.",
         (uint64_t)atomic_load(&c->client_disconnects)},
        {"xpyd_active_streams", "gauge", "Streams being relayed now.", (uint64_t)atomic_load(&c->active_streams)},
        {"xpyd_active_requests", "gauge", "Generate requests in progress now.",
         (uint64_t)atomic_load(&c->active_requests)},
        {"xpyd_prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
         (uint64_t)atomic_load(&c->prompt_tokens)},
        {"xpyd_generation_tokens_total", "counter", "Tokens relayed to clients.",
         (uint64_t)atomic_load(&c->generation_tokens)},
        {"xpyd_retries_denied_total", "counter", "Retries refused by the retry budget.",
         (uint64_t)atomic_load(&c->retries_denied)},
        {"xpyd_client_connections", "gauge", "Client connections open.", (uint64_t)atomic_load(&c->connections)},
        {"xpyd_client_connections_accepted_total", "counter", "Client connections accepted.",
         (uint64_t)atomic_load(&c->connections_accepted)},
        {"xpyd_client_connections_rejected_total", "counter",
         "Client connections over --max-connections (answered 503, or closed far over it).",
         (uint64_t)atomic_load(&c->connections_rejected)},
        {"xpyd_health_transitions_total", "counter", "Endpoints that went up or down (active health checks).",
         (uint64_t)atomic_load(&c->health_transitions)},
    };
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
        metric_head(b, g[i].name, g[i].type, g[i].help);
        evbuffer_add_printf(b, "%s %" PRIu64 "\n", g[i].name, g[i].v);
    }
    metric_head(b, "xpyd_admission_queue_depth", "gauge", "Requests waiting for a rank under max_inflight.");
    for (int role = 0; role < 2; role++)
        evbuffer_add_printf(b, "xpyd_admission_queue_depth{role=\"%s\"} %" PRId64 "\n", role ? "decode" : "prefill",
                            (int64_t)atomic_load(&c->queued[role]));
    metric_head(b, "xpyd_admission_queue_admitted_total", "counter", "Requests that waited in the queue, then ran.");
    for (int role = 0; role < 2; role++)
        evbuffer_add_printf(b, "xpyd_admission_queue_admitted_total{role=\"%s\"} %" PRIu64 "\n",
                            role ? "decode" : "prefill", (uint64_t)atomic_load(&c->queue_admitted[role]));
    metric_head(b, "xpyd_client_rejected_total", "counter",
                "Client connections the guard answered (408/431/503) or closed idle, by reason.");
    for (int i = 0; i < RT_CR_COUNT; i++)
        evbuffer_add_printf(b, "xpyd_client_rejected_total{reason=\"%s\"} %" PRIu64 "\n", rt_client_reject_names[i],
                            (uint64_t)atomic_load(&c->client_rejected[i]));
    static const char *const inames[] = {"xpyd_instance_inflight_requests", "xpyd_instance_outstanding_tokens",
                                         "xpyd_instance_selected_total", "xpyd_instance_healthy",
                                         "xpyd_instance_errors_total", "xpyd_instance_feedback_tokens",
                                         "xpyd_instance_ejections_total"};
    static const char *const itypes[] = {"gauge", "gauge", "counter", "gauge", "counter", "gauge", "counter"};
    for (int m = 0; m < 7; m++) {
        metric_head(b, inames[m], itypes[m], "Per instance (DP rank) numbers.");
        for (int role = 0; role < 2; role++) {
            for (size_t i = 0; i < g_rt->cfg.n_ranks[role]; i++) {
                struct xb_instance_stats st;
                xb_stats(g_rt->pools[role], (int)i, &st);
                if (st.removed)
                    continue;
                int64_t v = m == 0 ? st.inflight : m == 1 ? st.outstanding : m == 2 ? (int64_t)st.selected
                          : m == 3 ? (st.healthy && !st.ejected) : m == 5 ? st.feedback : m == 6 ? (int64_t)st.ejections
                          : (int64_t)atomic_load(&c->instance_errors[role][i < 4096 ? i : 0]);
                char hp[300];
                evbuffer_add_printf(b, "%s{role=\"%s\",instance=\"%s\",dp_rank=\"%d\"} %" PRId64 "\n", inames[m],
                                    role ? "decode" : "prefill", xpyd_hostport(st.host, st.port, hp, sizeof hp),
                                    st.dp_rank < 0 ? 0 : st.dp_rank, v);
            }
        }
    }
    rt_reply_buffer(req, 200, "text/plain; version=0.0.4; charset=utf-8", b);
    evbuffer_free(b);
}

