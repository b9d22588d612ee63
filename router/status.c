/* SPDX-License-Identifier: Apache-2.0 */
/* status.c - the router's operational endpoints: /health (200 only while a request could be served), /status
 * (the pools, ranks and their loads, as JSON), /metrics (metrics.c's page), and the answer to unknown paths. */
#include "router.h"

#include "handoff.h"
#include "xpyd_oai.h"
#include "xpyd_reply.h"
#include "xpyd_util.h"
#include "xpyd_version.h"

#include <event2/buffer.h>
#include <evhtp/evhtp.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* 200 only while at least one prefill and one decode instance are usable. */
static int pool_usable(int role)
{
    for (size_t i = 0; i < g_rt->reg.n_ranks[role]; i++) {
        struct xb_instance_stats st;
        if (xb_stats(g_rt->pools[role], (int)i, &st) == 0 && st.healthy && st.ready && !st.removed)
            return 1;
    }
    return 0;
}

static void on_health(evhtp_request_t *req, void *arg)
{
    if (!xpyd_method_allowed(req, "GET, HEAD"))
        return;
    struct evbuffer *b = evbuffer_new();
    int draining = atomic_load(&g_rt->draining);
    /* a prefill is needed unless the decodes can compute prompts themselves (--prefill-fallback) */
    int prefill_ok = !g_rt->ho->t->needs_prefill || pool_usable(RT_PREFILL) ||
                     (g_rt->cfg.prefill_fallback && g_rt->ho->t->local_prefill);
    int ok = !draining && prefill_ok && pool_usable(RT_DECODE);
    evbuffer_add_printf(b, "{\"status\":\"%s\"}", ok ? "ok" : draining ? "draining" : "unavailable");
    xpyd_reply_buffer(req, ok ? 200 : 503, "application/json", b);
    evbuffer_free(b);
}

static void json_str(struct evbuffer *b, const char *s)
{
    evbuffer_add(b, "\"", 1);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            evbuffer_add_printf(b, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            evbuffer_add_printf(b, "\\u%04x", *s);
        else
            evbuffer_add(b, s, 1);
    }
    evbuffer_add(b, "\"", 1);
}

static void on_status(evhtp_request_t *req, void *arg)
{
    if (!rt_authorized(req) || !xpyd_method_allowed(req, "GET, HEAD"))
        return;
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b, "{\"version\":\"%s\",\"git_revision\":\"%s\",\"uptime_s\":%" PRId64 ",\"handoff\":\"%s\",\"first_token\":\"%s\","
                           "\"active_requests\":%" PRId64 ",\"active_streams\":%" PRId64 ",\"pools\":{",
                        xpyd_version(), xpyd_git_revision(), xpyd_wall_s() - g_rt->started_wall, rt_handoff_names[g_rt->cfg.handoff],
                        g_rt->cfg.first_token ? "prefill" : "decode", (int64_t)atomic_load(&g_rt->ctr.active_requests),
                        (int64_t)atomic_load(&g_rt->ctr.active_streams));
    for (int role = 0; role < 2; role++) {
        int64_t inflight, outstanding;
        xb_totals(g_rt->pools[role], &inflight, &outstanding);
        evbuffer_add_printf(b, "%s\"%s\":{\"policy\":\"%s\",\"inflight\":%" PRId64 ",\"outstanding_tokens\":%" PRId64
                               ",\"instances\":[",
                            role ? "," : "", role ? "decode" : "prefill", xb_policy_name(g_rt->cfg.pools[role].policy),
                            inflight, outstanding);
        int listed = 0;
        for (size_t i = 0; i < g_rt->reg.n_ranks[role]; i++) {
            struct xb_instance_stats st;
            xb_stats(g_rt->pools[role], (int)i, &st);
            if (st.removed)
                continue;
            const struct rt_live_rank *rk = &g_rt->reg.ranks[role][i];
            const struct rt_endpoint_cfg *ep = &g_rt->reg.endpoints[rk->endpoint];
            evbuffer_add_printf(b, "%s{\"host\":", listed++ ? "," : "");
            json_str(b, ep->host);
            evbuffer_add_printf(b, ",\"port\":%d,\"dp_rank\":%d,\"tp\":%d,\"weight\":%d,\"max_model_len\":%ld,"
                                   "\"learned_max_model_len\":%ld,\"max_inflight\":%d,\"healthy\":%s,\"ejected\":%s,\"inflight\":%" PRId64 ",\"outstanding_tokens\":%" PRId64
                                   ",\"feedback_tokens\":%" PRId64 ",\"selected\":%" PRIu64 ",\"ready\":%s",
                                ep->port, rk->dp_rank, st.tp, st.weight, st.max_model_len, st.learned_max_model_len, st.max_inflight,
                                st.healthy ? "true" : "false", st.ejected ? "true" : "false",
                                st.inflight, st.outstanding, st.feedback, st.selected, st.ready ? "true" : "false");
            char eid[sizeof rk->engine_id];
            if (rt_rank_engine_id(role, (int)i, eid, sizeof eid) == 0) {
                evbuffer_add_printf(b, ",\"engine_id\":");
                json_str(b, eid);
            }
            evbuffer_add_printf(b, "}");
        }
        evbuffer_add_printf(b, "]}");
    }
    evbuffer_add_printf(b, "}}");
    xpyd_reply_buffer(req, 200, "application/json", b);
    evbuffer_free(b);
}

static void on_not_found(evhtp_request_t *req, void *arg)
{
    xpyd_reply_error(req, 404, "Not Found");
}

void rt_status_handlers(evhtp_t *htp)
{
    evhtp_set_cb(htp, "/health", on_health, NULL);
    evhtp_set_cb(htp, "/status", on_status, NULL);
    evhtp_set_cb(htp, "/metrics", rt_metrics_handler, NULL);
    evhtp_set_gencb(htp, on_not_found, NULL);
}
