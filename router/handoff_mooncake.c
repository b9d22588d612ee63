/* SPDX-License-Identifier: Apache-2.0 */
/* handoff_mooncake.c - `--handoff mooncake` (vLLM's MooncakeConnector, push with transfer_id): both legs at
 * once, one X-Request-Id. The prefill gets the client's body as a prefill (max_tokens 1, not streamed) with
 * kv_transfer_params {do_remote_decode: true, do_remote_prefill: false, transfer_id} and the chosen DP rank in
 * X-data-parallel-rank; the decode gets the client's body with kv_transfer_params {do_remote_decode: false,
 * do_remote_prefill: true, remote_bootstrap_addr: "http://<prefill host>:<bootstrap port>", remote_engine_id
 * (that rank's, from GET /query: discovery.c), transfer_id}. The engines meet on transfer_id; the decode's
 * answer is the client's. Every attempt gets a new transfer_id and sends both legs again.
 *
 * Failures: a prefill that fails before the decode answered anything closes the decode leg (it would wait for
 * KV that never comes) and the pair is retried or the client gets the error; once the decode streams, it has
 * the KV and the prefill's answer no longer matters. A failed decode closes the prefill leg and retries both.
 * A client that leaves closes both (req_end). */
#include "handoff.h"
#include "request.h"
#include "stream.h"
#include "body_src.h"

#include "xpyd_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

static void start_both(struct request *r);

static void prefill_done(struct up_leg *up, int err, void *arg)
{
    struct leg *p = arg;
    int ok;
    struct request *r = req_prefill_finished(p, err, &ok);
    if (!r)
        return;
    struct leg *d = &r->legs[RT_DECODE];
    if (ok || r->client != CLIENT_NOTHING) {
        /* Its KV went to the decode (or, failed late, the decode already has it: it is streaming). */
        if (ok && req_absorb_prefill(r) == 0) {
            p->answered = 1;
            rt_hist_observe(&g_rt->ctr.prefill_time, (double)(xpyd_now_us() - p->t_sent) / 1e6);
            if (g_rt->cfg.first_token == RT_FIRST_PREFILL && r->stream && r->client == CLIENT_NOTHING)
                client_prefill_first_token(r); /* the decode has not said anything yet */
        }
        req_release(r, RT_PREFILL);
        return;
    }
    /* The prefill failed and the decode has not answered: it waits for KV that never comes. */
    if (d->up) {
        up_leg_cancel(d->up);
        d->up = NULL;
    }
    req_unpick(r, RT_DECODE); /* it did not fail: the retry may use it again */
    xpyd_sse_reset(&r->sse);
    req_prefill_failed(r, err, start_both);
}

static void start_both(struct request *r)
{
    struct leg *p = &r->legs[RT_PREFILL];
    p->answered = 0;
    if (req_pick_pair(r, start_both) < 0)
        return;
    int pidx = p->idx;
    const struct rt_live_rank *prank = &g_rt->reg.ranks[RT_PREFILL][pidx];
    char engine_id[sizeof prank->engine_id], addr[320], hp[300], xfer[200];
    if (rt_rank_engine_id(RT_PREFILL, pidx, engine_id, sizeof engine_id) != 0) {
        /* picked while ready, its /query failed since: as a failed attempt on it (retried elsewhere) */
        req_unpick(r, RT_DECODE);
        req_prefill_failed(r, -EHOSTUNREACH, start_both);
        return;
    }
    const struct up_endpoint *pe = &g_rt->endpoints[prank->endpoint];
    snprintf(addr, sizeof addr, "http://%s", xpyd_hostport(pe->host, prank->bootstrap_port, hp, sizeof hp));
    if (r->attempt_seq++ == 0)
        snprintf(xfer, sizeof xfer, "xfer-%s", r->xid);
    else
        snprintf(xfer, sizeof xfer, "xfer-%s-%u", r->xid, r->attempt_seq - 1);
    cJSON *pkv = XPYD_XALLOC(cJSON_CreateObject());
    cJSON_AddBoolToObject(pkv, "do_remote_decode", 1);
    cJSON_AddBoolToObject(pkv, "do_remote_prefill", 0);
    cJSON_AddStringToObject(pkv, "transfer_id", xfer);
    char *pkv_txt = XPYD_XALLOC(cJSON_PrintUnformatted(pkv));
    cJSON *dkv = XPYD_XALLOC(cJSON_CreateObject());
    cJSON_AddBoolToObject(dkv, "do_remote_decode", 0);
    cJSON_AddBoolToObject(dkv, "do_remote_prefill", 1);
    cJSON_AddStringToObject(dkv, "remote_bootstrap_addr", addr);
    cJSON_AddStringToObject(dkv, "remote_engine_id", engine_id);
    cJSON_AddStringToObject(dkv, "transfer_id", xfer);
    char *dkv_txt = XPYD_XALLOC(cJSON_PrintUnformatted(dkv));
    size_t plen, dlen;
    char *pbody = rw_prefill_body_kv(r->src, pkv_txt, &plen);
    char *dbody = rw_decode_body(r->src, dkv_txt, 1, &dlen);
    cJSON_Delete(pkv);
    cJSON_Delete(dkv);
    free(pkv_txt);
    free(dkv_txt);
    req_send(r, RT_PREFILL, pbody, plen, prefill_done);
    if (r->state != REQ_DONE)
        req_send(r, RT_DECODE, dbody, dlen, req_decode_done);
    else
        free(dbody);
}

static void decode_retry(struct request *r) /* both legs again, with a new transfer_id */
{
    req_restart_pair(r, start_both);
}

const struct handoff_ops handoff_mooncake = {
    .t = &rt_handoff_traits[RT_HO_MOONCAKE],
    .start = start_both,
    .decode_retry = decode_retry,
};
