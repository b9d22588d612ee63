/* SPDX-License-Identifier: Apache-2.0 */
/* handoff_kv_params.c - `--handoff kv-params` (vLLM NixlConnector, vllm-ascend MooncakeConnectorV1): a prefill
 * leg asked to keep the KV (`kv_transfer_params {do_remote_decode: true}`, one token, not streamed), then a
 * decode leg carrying the `kv_transfer_params` the prefill returned, so the decode pulls the KV. */
#include "handoff.h"
#include "request.h"
#include "body_src.h"

#include "xpyd_util.h"

#include <event2/buffer.h>
#include <stdlib.h>

char *kv_prefill_body(struct request *r, size_t *len)
{
    return rw_prefill_body(r->src, 1, len);
}

char *kv_decode_body(struct request *r, size_t *len)
{
    return rw_decode_body(r->src, r->kv_params, 1, len);
}

static void release_dispatched(struct up_leg *leg, int err, void *arg)
{
}

/* The prefill answered and holds KV for a decode that will now never take it (every decode attempt failed,
 * or the request ended while none was in flight). vLLM has no "free" call; the way to make the engines let
 * go early is dispatch-and-cancel: hand a decode the request with the prefill's kv_transfer_params
 * (max_tokens 1, not streamed) and close the connection once it is written; the decode sees the request and
 * its cancellation and frees the prefill's blocks (xpyd_sim: POST /kv/release). The decode is one not tried
 * by this request when there is one, chosen by health (not through the balancer: it carries no load and
 * moves no cursor). Without any usable decode, the engine's own lease expiry frees the KV. */
static void kv_abandon(struct request *r, int decode_in_flight)
{
    if (decode_in_flight)
        return; /* finish_decode_write: that decode sees the request and its cancellation */
    const struct leg *d = &r->legs[RT_DECODE];
    int idx = -1;
    for (size_t i = 0; i < g_rt->reg.n_ranks[RT_DECODE]; i++) {
        if (req_inst_gone(RT_DECODE, (int)i))
            continue;
        int tried = 0;
        for (int k = 0; k < d->ntried; k++)
            tried |= d->tried[k] == (int)i;
        if (!tried) {
            idx = (int)i;
            break;
        }
        if (idx < 0)
            idx = (int)i;
    }
    if (idx < 0)
        return;
    size_t len;
    char *body = rw_kv_release_body(r->src, r->kv_params, &len);
    struct evbuffer *req = req_build(r, RT_DECODE, idx, "POST", req_path(r), body, len);
    static const struct up_leg_cbs cbs = {NULL, NULL, release_dispatched, NULL, NULL, NULL};
    struct up_leg *leg = up_leg_start(r->t->up, req_endpoint(RT_DECODE, idx), req, req_timeouts(), &cbs, NULL);
    evbuffer_free(req);
    free(body);
    if (leg) {
        up_leg_cancel_after_send(leg);
        atomic_fetch_add(&g_rt->ctr.kv_release_dispatches, 1);
        xpyd_log_event(XPYD_LOG_INFO, "event=kv_release_dispatch request_id=%s", r->xid);
    }
}

const struct handoff_ops handoff_kv_params = {
    .t = &rt_handoff_traits[RT_HO_KV_PARAMS],
    .start = req_start_prefill,
    .prefill_body = kv_prefill_body,
    .decode_body = kv_decode_body,
    .decode_retry = req_start_decode,
    .abandon = kv_abandon,
    .finish_decode_write = 1,
};
