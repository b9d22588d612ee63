/* SPDX-License-Identifier: Apache-2.0 */
/* leg_wire.c - what a leg puts on the wire and how its engine is named: the request head every engine request
 * carries (X-Request-Id, the DP rank header, the client's forwarded headers), the path, the timeouts, and a
 * rank named for errors, logs and the access log (see request.h); whether a rank is out of service, and what a
 * failed decode attempt leaves of the prefill's KV. */
#include "leg_wire.h"

#include "handoff.h"

#include "xpyd_util.h"

#include <event2/buffer.h>
#include <stdio.h>
#include <string.h>

const char *req_role_name(int role)
{
    return role == RT_DECODE ? "decode" : "prefill";
}

int req_endpoint(int role, int idx)
{
    return g_rt->reg.ranks[role][idx].endpoint;
}

const char *req_path(const struct request *r)
{
    return r->kind == RT_EP_CHAT ? "/v1/chat/completions" : "/v1/completions";
}

const struct up_timeouts *req_timeouts(void)
{
    static __thread struct up_timeouts to;
    to.connect_ms = g_rt->cfg.connect_timeout_ms;
    to.first_byte_ms = g_rt->cfg.first_token_timeout_ms;
    to.idle_ms = g_rt->cfg.stream_idle_timeout_ms;
    return &to;
}

/* The head of a request to legs[role]'s instance idx, into b. */
void req_head(struct evbuffer *b, struct request *r, int role, int idx, const char *method, const char *path,
                     const char *body, size_t len)
{
    const struct up_endpoint *ep = &g_rt->endpoints[req_endpoint(role, idx)];
    up_request_line(b, ep, method, path);
    char num[24], *e;
    evbuffer_add(b, "X-Request-Id: ", 14);
    evbuffer_add(b, r->xid, strlen(r->xid));
    evbuffer_add(b, "\r\n", 2);
    int dp = g_rt->reg.ranks[role][idx].dp_rank;
    if (dp >= 0) {
        evbuffer_add(b, "X-data-parallel-rank: ", 22);
        e = xpyd_put_u64(num, (uint64_t)dp);
        evbuffer_add(b, num, (size_t)(e - num));
        evbuffer_add(b, "\r\n", 2);
    }
    if (r->fwd_headers)
        evbuffer_add(b, r->fwd_headers, strlen(r->fwd_headers));
    if (body) {
        evbuffer_add(b, "Content-Type: application/json\r\nContent-Length: ", 48);
        e = xpyd_put_u64(num, len);
        evbuffer_add(b, num, (size_t)(e - num));
    }
    evbuffer_add(b, "\r\n\r\n", body ? 4 : 2);
}

struct evbuffer *req_build(struct request *r, int role, int idx, const char *method, const char *path, const char *body,
                           size_t len)
{
    struct evbuffer *b = XPYD_XALLOC(evbuffer_new());
    req_head(b, r, role, idx, method, path, body, len);
    if (body)
        evbuffer_add(b, body, len);
    return b;
}

void req_inst_desc(int role, int idx, char *out, size_t cap)
{
    char hp[280];
    if (idx < 0) {
        snprintf(out, cap, "%s", req_role_name(role));
        return;
    }
    int dp = rt_rank_identity(role, idx, hp, sizeof hp);
    if (dp >= 0)
        snprintf(out, cap, "%s %s (dp rank %d)", req_role_name(role), hp, dp);
    else
        snprintf(out, cap, "%s %s", req_role_name(role), hp);
}

void req_inst_short(int role, int idx, char *out, size_t cap)
{
    int dp = rt_rank_identity(role, idx, out, cap);
    if (dp >= 0)
        snprintf(out + strlen(out), cap - strlen(out), "#%d", dp);
}

/* 1: out of service (health checks took it down, ejected, removed, or not known); 2: failing — its last attempt
 * failed (a crash shows first as connections refused or cut, before health checks or ejection) or two decodes
 * failed with its KV since its last success (xb_report_kv_lost); 0: neither, or no rank (idx < 0) */
static int inst_state(int role, int idx)
{
    struct xb_instance_stats st;
    if (idx < 0)
        return 0;
    if (xb_stats(g_rt->pools[role], idx, &st) != 0 || !st.healthy || st.ejected || st.removed)
        return 1;
    return st.failing ? 2 : 0;
}

int req_inst_gone(int role, int idx)
{
    return inst_state(role, idx) == 1;
}

int req_decode_kv_outcome(const struct request *r, int status, uint64_t *uses)
{
    const struct leg *d = &r->legs[RT_DECODE];
    int src = r->legs[RT_PREFILL].last_idx;
    *uses = 0;
    if (!r->kv_params || !r->ho->t->kv_on_prefill || src < 0 || d->idx < 0)
        return -1;
    if (status == 200)
        xb_report_used(g_rt->pools[RT_PREFILL], src);
    if (status < 500 || d->accepted)
        return -1;
    xb_report_kv_lost(g_rt->pools[RT_PREFILL], src, d->idx);
    *uses = xb_uses(g_rt->pools[RT_PREFILL], src);
    return src;
}

enum rd_kv_fate req_decode_kv_fate(const struct request *r, int err, int status)
{
    const struct leg *l = &r->legs[RT_DECODE];
    return !r->kv_params ? RD_KV_KEEP
        : rd_kv_after_decode_failure(r->ho->t->local_prefill, r->ho->t->kv_on_prefill, g_rt->cfg.prefill_fallback,
                                     l->accepted, l->attempts, err ? 0 : status,
                                     inst_state(RT_PREFILL, r->legs[RT_PREFILL].last_idx));
}
