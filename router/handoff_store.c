/* SPDX-License-Identifier: Apache-2.0 */
/* handoff_store.c - `--handoff store` (vLLM MooncakeStoreConnector, the Gaudi deployment): a prefill leg (one
 * token, not streamed) writes the KV into the Mooncake store; then the decode gets the client's body unchanged
 * and finds the KV there by the prompt's hash. Also the benchmark repeat mode (--repeat-d-times), which only
 * this mode allows: store KV can be read by many decodes. */
#include "handoff.h"
#include "request.h"
#include "body_src.h"

#include "xpyd_util.h"

#include <event2/buffer.h>
#include <stdlib.h>

static char *store_prefill_body(struct request *r, size_t *len)
{
    return rw_prefill_body(r->src, 0, len);
}

static char *store_decode_body(struct request *r, size_t *len)
{
    return rw_decode_body(r->src, NULL, 0, len);
}

struct clone {
    int d_idx;
    int64_t charge;
};

static void clone_done(struct up_leg *leg, int err, void *arg)
{
    struct clone *c = arg;
    xb_release(g_rt->pools[RT_DECODE], c->d_idx, c->charge);
    free(c);
}

/* Repeat mode: N decode-only clones of the request, spread by the balancer, answers discarded, load released
 * as each finishes. Warm-up rule: they start when the measured request's decode produced its first token, so
 * its KV is in the store for them and they do not compete with the measured TTFT. */
static void fire_clones(struct request *r)
{
    if (g_rt->cfg.repeat_d_times <= 0)
        return;
    size_t len;
    char *body = store_decode_body(r, &len);
    static const struct up_leg_cbs cbs = {NULL, NULL, clone_done, NULL, NULL, NULL};
    for (int i = 0; i < g_rt->cfg.repeat_d_times; i++) {
        int64_t charge;
        req_decode_charge(r, &charge);
        int idx = xb_pick(g_rt->pools[RT_DECODE], (uint64_t)charge, charge, NULL, 0);
        if (idx < 0)
            break;
        struct clone *c = XPYD_XALLOC(calloc(1, sizeof *c));
        c->d_idx = idx;
        c->charge = charge;
        struct evbuffer *req = req_build(r, RT_DECODE, idx, "POST", req_path(r), body, len);
        struct up_leg *leg = up_leg_start(r->t->up, req_endpoint(RT_DECODE, idx), req, req_timeouts(), &cbs, c);
        evbuffer_free(req);
        if (!leg) {
            xb_release(g_rt->pools[RT_DECODE], idx, charge);
            free(c);
            break;
        }
        atomic_fetch_add(&g_rt->ctr.repeat_clones, 1);
    }
    free(body);
}

const struct handoff_ops handoff_store = {
    .t = &rt_handoff_traits[RT_HO_STORE],
    .start = req_start_prefill,
    .prefill_body = store_prefill_body,
    .decode_body = store_decode_body,
    .decode_retry = req_start_decode,
    .first_token = fire_clones,
};
