/* SPDX-License-Identifier: Apache-2.0 */
/* migrate.c - decode migration (--migration-limit): a stream whose decode fails after tokens reached the client
 * goes on at another decode, with a continuation whose prompt holds what the client has (body_src.c); the
 * client sees one stream. Whether it may, and whether the continuation goes through a prefill leg first, are
 * decide.c's. */
#include "migrate.h"

#include "body_src.h"
#include "decide.h"
#include "handoff.h"
#include "prompt.h"
#include "request.h"

#include "xpyd_util.h"

#include <event2/buffer.h>
#include <inttypes.h>
#include <stdlib.h>

static int may_migrate(const struct request *r)
{
    return rd_may_migrate(r->gen_text != NULL, r->client == CLIENT_STREAMING, r->done_seen,
                          r->state == REQ_DONE || !r->ereq, r->migrations, g_rt->cfg.migration_limit,
                          r->legs[RT_DECODE].ntried, MAX_TRIED, g_rt->reg.n_ranks[RT_DECODE]);
}

/* A continuation became the request's body: its bytes replace the old ones in the body memory count. */
static void body_memory_swap(struct request *r, size_t len)
{
    rt_body_memory_add((int64_t)len);
    rt_body_memory_release(r->body_bytes);
    r->body_bytes = (int64_t)len;
}

/* The continuation's body: the client's, whose prompt holds what the client has (rewrite.c); NULL when it
 * cannot be continued. */
static char *continuation_body(struct request *r, size_t *len)
{
    size_t n = evbuffer_get_length(r->gen_text);
    char *text = XPYD_XALLOC(malloc(n + 1));
    evbuffer_copyout(r->gen_text, text, n);
    text[n] = 0;
    char *body = rw_continuation_body(r->src, r->kind == RT_EP_CHAT, text, r->tokens_out - r->base_tokens, len);
    free(text);
    return body;
}

/* The continuation after the backoff. Cost model (decision): a continuation whose prompt (the client's plus
 * what it has) reaches --migration-prefill-min-tokens goes through a prefill leg first, in the modes with one
 * (the continuation becomes the request's body and the mode starts again: prefill, then decode with its KV);
 * a shorter one is computed by the decode itself, which costs less than a handoff. */
static void migrate_send(struct request *r)
{
    int64_t since = r->tokens_out - r->base_tokens; /* delivered beyond the request body's prompt */
    int64_t left = r->max_tokens - since, cont_prompt = r->prompt_tokens + since;
    size_t len;
    if (rd_continue_through_prefill(r->ho->t->local_prefill, g_rt->cfg.migration_prefill_min_tokens, cont_prompt)) {
        char *body = continuation_body(r, &len);
        const char *why = NULL;
        size_t at = 0;
        /* the body is the router's own splice of checked bytes: it passes the check (and holds one member more
         * at most) */
        struct rw_src *src = body ? rw_src_take(body, len, r->src->n + 8, &why, &at) : NULL;
        if (src) {
            body_memory_swap(r, src->len);
            rw_src_free(r->src);
            r->src = src;
            r->prompt_tokens = cont_prompt;
            r->prompt_longest = r->prompt_longest ? cont_prompt : 0; /* one prompt (continued): counted as before */
            r->max_tokens = left > 1 ? left : 1;
            r->room_tokens = rw_room_tokens(src, r->kind == RT_EP_CHAT, r->max_tokens);
            r->base_tokens = r->tokens_out; /* the body's prompt now holds everything delivered */
            evbuffer_drain(r->gen_text, evbuffer_get_length(r->gen_text));
            free(r->kv_params);
            r->kv_params = NULL;
            struct leg *p = &r->legs[RT_PREFILL];
            p->answered = 0;
            p->ntried = p->attempts = 0; /* a new prompt: any prefill may take it */
            r->ho->start(r);
            return;
        }
    }
    if (req_pick(r, RT_DECODE, cont_prompt + (left > 1 ? left : 1), migrate_send) < 0)
        return;
    char *body = continuation_body(r, &len);
    if (!body) { /* not reached: gen_text exists only for prompts that can be continued */
        req_leg_fail(r, RF_DECODE_BROKEN_STREAM, RT_DECODE, r->legs[RT_DECODE].idx, "the stream cannot be continued");
        return;
    }
    req_send(r, RT_DECODE, body, len, req_decode_done);
}

static void migrate(struct request *r, int err)
{
    struct leg *d = &r->legs[RT_DECODE];
    int reason = r->preempted ? RF_DECODE_PREEMPTED : err == -ETIME ? RF_DECODE_TIMEOUT : RF_DECODE_BROKEN_STREAM;
    atomic_fetch_add(&g_rt->ctr.migrations[reason], 1);
    rt_count_instance_error(RT_DECODE, d->idx, reason);
    char buf[120];
    XLOG_INFO("msg=\"decode failed mid-stream: continuing at another decode\" request_id=%s reason=%s err=%s "
              "delivered=%" PRId64, r->xid, rt_fail_table[reason].name, rd_err_text(err, buf, sizeof buf), r->tokens_out);
    req_release(r, RT_DECODE);
    xpyd_sse_reset(&r->sse);
    r->migrations++;
    r->tokens_before = r->tokens_out;
    r->preempted = 0;
    r->first_dropped = 1; /* nothing of the continuation stands for a token the client has */
    req_retry_later(r, RT_DECODE, migrate_send);
}

static const struct req_migration migration = {may_migrate, migrate};

void rt_migration_install(void)
{
    req_set_migration(&migration);
}
