/* SPDX-License-Identifier: Apache-2.0 */
/* handoff_bootstrap.c - `--handoff bootstrap` (SGLang PD): one body to both legs at once, carrying
 * bootstrap_host (the prefill's host), bootstrap_port, a fresh 63-bit bootstrap_room per attempt and rid; the
 * engines meet through the prefill's bootstrap server. The decode's stream is the client's; the prefill's
 * answer is drained. A failing prefill aborts the decode (POST /abort_request) and both legs start again. */
#include "handoff.h"
#include "request.h"
#include "body_src.h"

#include "xpyd_util.h"

#include <event2/buffer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void abort_sent(struct up_leg *leg, int err, void *arg)
{
}

/* Tells a decode to drop request rid (SGLang's /abort_request); fire and forget. */
static void send_abort(struct request *r, int d_idx)
{
    char body[300];
    int n = snprintf(body, sizeof body, "{\"rid\":\"%s\"}", r->xid);
    struct evbuffer *req = req_build(r, RT_DECODE, d_idx, "POST", "/abort_request", body, (size_t)n);
    static const struct up_leg_cbs cbs = {NULL, NULL, abort_sent, NULL, NULL, NULL};
    up_leg_start(r->t->up, req_endpoint(RT_DECODE, d_idx), req, req_timeouts(), &cbs, NULL);
    evbuffer_free(req);
}

static void start_both(struct request *r);

static void prefill_done(struct up_leg *up, int err, void *arg)
{
    struct leg *p = arg;
    int ok;
    struct request *r = req_prefill_finished(p, err, &ok);
    if (!r)
        return;
    struct leg *d = &r->legs[RT_DECODE];
    if (ok) {
        req_release(r, RT_PREFILL);
        p->answered = 1;
        return; /* its answer is drained; the decode's stream is the client's */
    }
    /* The prefill failed: the decode would wait for KV that never comes. Abort it, then retry or fail.
     * /abort_request may overtake the decode's own request (another connection) and find nothing, so the
     * decode leg is also finished being written and then closed: the engine sees the request and its
     * cancellation, whichever arrives first. */
    if (d->idx >= 0)
        send_abort(r, d->idx);
    if (d->up) {
        up_leg_cancel_after_send(d->up);
        d->up = NULL;
    }
    req_unpick(r, RT_DECODE); /* it did not fail: the retry may use it again */
    xpyd_sse_reset(&r->sse);
    req_prefill_failed(r, err, start_both);
}

static void start_both(struct request *r)
{
    if (req_pick_pair(r, start_both) < 0)
        return;
    int pidx = r->legs[RT_PREFILL].idx;
    /* A fresh 63-bit room per attempt; with internal DP on the prefill, room % dp picks the rank. */
    const struct rt_live_rank *prank = &g_rt->reg.ranks[RT_PREFILL][pidx];
    r->t->rng = xpyd_mix64(r->t->rng);
    uint64_t room = r->t->rng >> 1;
    if (prank->dp_rank >= 0) {
        uint64_t dp = (uint64_t)g_rt->cfg.pools[RT_PREFILL].dp;
        room = room / dp * dp + (uint64_t)prank->dp_rank;
    }
    const struct up_endpoint *pe = &g_rt->endpoints[prank->endpoint];
    size_t len;
    char *body = rw_bootstrap_body(r->src, pe->host, prank->bootstrap_port, room, r->xid, &len);
    char *copy = XPYD_XALLOC(malloc(len + 1)); /* each leg owns its body */
    memcpy(copy, body, len + 1);
    req_send(r, RT_PREFILL, copy, len, prefill_done);
    if (r->state != REQ_DONE)
        req_send(r, RT_DECODE, body, len, req_decode_done);
    else
        free(body);
}

static void decode_retry(struct request *r)
{
    req_restart_pair(r, start_both);
}

const struct handoff_ops handoff_bootstrap = {
    .t = &rt_handoff_traits[RT_HO_BOOTSTRAP],
    .start = start_both,
    .decode_retry = decode_retry,
};
