/* SPDX-License-Identifier: Apache-2.0 */
/* request.c - the request core: states and their transitions, legs (pick, send, answer, retry), and the one
 * way a request ends (req_end) or fails (req_fail). The handoff mode is never tested here: what differs
 * between modes is behind r->ho (handoff.h), one file per mode. See request.h for the state diagram. */
#include "request.h"

#include "access_log.h"
#include "admission.h"
#include "decide.h"
#include "body_src.h"
#include "handoff.h"
#include "kv_sub.h"
#include "prompt.h"
#include "rewrite.h"
#include "stream.h"
#include "tokenize.h"

#include "xpyd_oai.h"
#include "xpyd_util.h"

#include <assert.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <evhtp/evhtp.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---------- states ---------- */

static const char *const state_names[] = {"new", "legs", "backoff", "queued", "done"};

/* allowed[from][to]: every transition the core makes, and no other. */
static const unsigned char allowed[5][5] = {
    /*              NEW LEGS BACKOFF QUEUED DONE */
    /* NEW     */ {0, 1, 0, 1, 1},
    /* LEGS    */ {0, 1, 1, 1, 1},
    /* BACKOFF */ {0, 1, 0, 1, 1},
    /* QUEUED  */ {0, 1, 0, 1, 1},
    /* DONE    */ {0, 0, 0, 0, 0},
};

void req_set_state(struct request *r, enum req_state to)
{
    assert(r->state <= REQ_DONE && to <= REQ_DONE);
    if (!allowed[r->state][to]) { /* a bug: test builds stop here; production builds say so and go on */
        xpyd_log_event(XPYD_LOG_ERROR, "event=bug request_id=%s msg=\"state transition %s -> %s is not in the table\"", r->xid,
                       state_names[r->state], state_names[to]);
        assert(!"request state transition not in the table");
    }
    XLOG_DEBUG("msg=\"request state\" request_id=%s from=%s to=%s", r->xid, state_names[r->state], state_names[to]);
    r->state = to;
}

static struct request *leg_request(struct leg *l)
{
    return (struct request *)((char *)(l - l->role) - offsetof(struct request, legs));
}

/* ---------- ending ---------- */

void req_release(struct request *r, int role)
{
    struct leg *l = &r->legs[role];
    if (l->idx >= 0) {
        xb_release(g_rt->pools[role], l->idx, l->charge);
        rt_kv_released(role, l->idx, l->kv_pending);
        admission_wake(role);
        l->idx = -1;
        l->charge = 0;
    }
}

void req_end(struct request *r, int fail)
{
    if (r->state == REQ_DONE)
        return;
    struct leg *p = &r->legs[RT_PREFILL], *d = &r->legs[RT_DECODE];
    int decode_in_flight = d->up != NULL;
    req_set_state(r, REQ_DONE);
    r->fail = fail;
    rt_tok_detach(r);
    admission_leave(r);
    if (p->up) {
        up_leg_cancel(p->up);
        p->up = NULL;
    }
    if (d->up) {
        /* dispatch-and-cancel (handoff.h): the decode may still have to pull (and so free) the prefill's KV */
        if (p->answered && r->ho->finish_decode_write)
            up_leg_cancel_after_send(d->up);
        else
            up_leg_cancel(d->up);
        d->up = NULL;
    }
    if (fail != RF_NONE && p->answered && r->kv_params && !d->accepted && r->ho->abandon)
        r->ho->abandon(r, decode_in_flight);
    req_release(r, RT_PREFILL);
    req_release(r, RT_DECODE);
    if (r->retry_timer) {
        event_free(r->retry_timer);
        r->retry_timer = NULL;
    }
    if (r->retrying) {
        r->retrying = 0;
        atomic_fetch_sub(&g_rt->ctr.retries_active, 1);
    }
    client_stream_free(r); /* the backpressure timer; active_streams when the stream had started */
    atomic_fetch_sub(&g_rt->ctr.active_requests, 1);
    if (fail == RF_CLIENT_DISCONNECT)
        r->status = 499;
    atomic_fetch_add(&g_rt->ctr.requests[r->kind][r->status >= 100 && r->status < 600 ? r->status : 0], 1);
    atomic_fetch_add(&g_rt->ctr.outcomes[r->kind][rt_fail_table[fail].outcome], 1);
    if (fail == RF_NONE)
        rt_hist_observe(&g_rt->ctr.e2e, (double)(xpyd_now_us() - r->t_start) / 1e6);
    else
        atomic_fetch_add(&g_rt->ctr.errors[fail], 1);
    atomic_fetch_add(&g_rt->ctr.prompt_tokens, (uint64_t)r->prompt_tokens);
    atomic_fetch_add(&g_rt->ctr.generation_tokens, (uint64_t)r->tokens_out);
    rt_access_log_request(r, fail);
    rw_src_free(r->src); /* nothing reads the body once the request ended (the tokenizer has its own copy) */
    r->src = NULL;
    rt_body_memory_release(r->body_bytes);
    r->body_bytes = 0;
    client_finish_held(r);
}

void req_fail(struct request *r, int fail, int status, const char *msg)
{
    if (r->state == REQ_DONE)
        return;
    /* errors are always logged, whatever --log-level (but none), as one structured line */
    xpyd_log_event(XPYD_LOG_ERROR, "event=request_failed request_id=%s reason=%s detail=\"%s\"", r->xid, rt_fail_table[fail].name, msg);
    client_error(r, status, msg);
    req_end(r, fail);
}

void req_leg_fail(struct request *r, int fail, int role, int idx, const char *detail)
{
    char where[400], msg[1000];
    req_inst_desc(role, idx, where, sizeof where);
    snprintf(msg, sizeof msg, "%s failed: %s", where, detail);
    rt_count_instance_error(role, idx, fail);
    req_fail(r, fail, rt_fail_table[fail].status, msg);
}

/* libevhtp is freeing the client request (answer sent, or the connection is gone): the single safe point. */
static void req_free_cb(void *arg)
{
    struct request *r = arg;
    r->ereq = NULL;
    if (r->state != REQ_DONE) {
        atomic_fetch_add(&g_rt->ctr.client_disconnects, 1);
        req_end(r, RF_CLIENT_DISCONNECT);
    }
    free(r->model); /* (its body: freed by req_end, above or before) */
    free(r->kv_params);
    free(r->fwd_headers);
    free(r->blocks);
    free(r->first_text);
    free(r->resp_id);
    if (r->gen_text)
        evbuffer_free(r->gen_text);
    for (int role = 0; role < 2; role++)
        if (r->legs[role].buf)
            evbuffer_free(r->legs[role].buf);
    free(r->chunk.p);
    free(r->stage.p);
    xpyd_sse_reset(&r->sse);
    free(r);
}

/* The client hung up mid-answer (the guard saw it): the engines stop working for nobody. */
static int on_client_gone(void *arg)
{
    struct request *r = arg;
    if (r->state == REQ_DONE || !r->ereq)
        return 0; /* the answer is complete: libevhtp ends the connection */
    atomic_fetch_add(&g_rt->ctr.client_disconnects, 1);
    req_end(r, RF_CLIENT_DISCONNECT);
    evhtp_connection_free(evhtp_request_get_connection(r->ereq)); /* calls req_free_cb */
    return 1;
}

/* --tokenizer counted the prompt (tokenize.c), or it is token ids: the handoff starts, or the exact count fits no
 * rank (400) */
static void tokenized(struct request *r, const char *refusal)
{
    refusal ? req_fail(r, RF_CONTEXT_TOO_LONG, 400, refusal) : r->ho->start(r);
}

void req_begin(struct request *r)
{
    for (int role = 0; role < 2; role++) {
        r->legs[role].role = role;
        r->legs[role].idx = r->legs[role].last_idx = -1;
    }
    r->queued_role = -1;
    r->cached_tokens = -1;
    if (g_rt->cfg.migration_limit > 0 && r->stream &&
        jv_type(rw_src_get(r->src, r->kind == RT_EP_CHAT ? "messages" : "prompt")) ==
            (r->kind == RT_EP_CHAT ? JV_ARRAY : JV_STRING))
        r->gen_text = XPYD_XALLOC(evbuffer_new()); /* it can be continued elsewhere: keep what the client gets */
    r->model = rw_string_member(r->src, "model");
    r->sse.max_event = 4u << 20;
    atomic_fetch_add(&g_rt->ctr.active_requests, 1);
    evhtp_request_t *req = r->ereq;
    rt_client_set_owner(req, req_free_cb, r);
    /* the client's bytes are written by stream.c (write-through); the connection is read meanwhile */
    rt_client_pause_reading_on(req, on_client_gone);
    char refusal[400];
    if (r->prompt_src == RT_PS_IDS && rt_tok_too_long(r, refusal, sizeof refusal)) /* exact: refused at once */
        tokenized(r, refusal);
    else if (!rt_tok_start(r, tokenized)) /* else it starts when its prompt's tokens are counted */
        r->ho->start(r);
}

/* ---------- picking ---------- */

/* What a rank's max_model_len must hold: the (longest, when counted exactly) prompt and the room after it. */
static uint64_t need_len(const struct request *r)
{
    return (uint64_t)((r->prompt_longest > 0 ? r->prompt_longest : r->prompt_tokens) + r->room_tokens);
}

static void on_queue_expired(struct request *r, int role)
{
    char msg[300];
    snprintf(msg, sizeof msg,
             "no %s instance had room within --queue-timeout-ms (%ld ms): every rank is at its max_inflight",
             req_role_name(role), g_rt->cfg.queue_timeout_ms);
    req_fail(r, RF_QUEUE_TIMEOUT, 503, msg);
}

/* --prefill-fallback: no prefill can serve r, but its decode can compute the prompt itself (the modes whose
 * decode runs alone), and nothing reached the client yet. */
static int may_fall_back(const struct request *r)
{
    return rd_may_fall_back(g_rt->cfg.prefill_fallback, r->ho->t->local_prefill, r->client != CLIENT_NOTHING,
                            r->migrations, r->state == REQ_DONE || !r->ereq, r->legs[RT_PREFILL].answered);
}

/* The decode gets the client's body without any prefill handoff and computes the prompt itself. */
static void fall_back_to_local_prefill(struct request *r, const char *why)
{
    req_release(r, RT_PREFILL);
    r->local_prefill = 1;
    atomic_fetch_add(&g_rt->ctr.prefill_fallbacks, 1);
    XLOG_INFO("msg=\"no prefill could serve: the decode computes the prompt\" request_id=%s reason=\"%s\"", r->xid,
              why);
    req_start_decode(r);
}

int req_pick(struct request *r, int role, int64_t charge, void (*again)(struct request *r))
{
    struct leg *l = &r->legs[role];
    struct xb_query q = {.need_len = need_len(r), .estimated = r->prompt_src == RT_PS_ESTIMATE, .tokens = charge,
                         .session = r->session, .exclude = l->tried, .nexclude = l->ntried};
    if (g_rt->prefix_on[role] && !r->migrations) /* a continuation's prompt is not the one hashed */
        rt_kv_query(&q, role, r->blocks, r->nblocks, r->model);
    int idx = xb_pick_q(g_rt->pools[role], &q);
    l->kv_pending = rt_kv_picked(role, idx, &q);
    if (idx == -EBUSY) {
        if (admission_wait(r, role, again, on_queue_expired) == ADMISSION_QUEUED) {
            req_set_state(r, REQ_QUEUED);
        } else {
            char msg[300];
            snprintf(msg, sizeof msg,
                     "too many requests: every %s rank is at its max_inflight and %ld requests are already waiting "
                     "(--admission-queue); retry later",
                     req_role_name(role), g_rt->cfg.admission_queue);
            snprintf(r->retry_after, sizeof r->retry_after, "1");
            req_fail(r, RF_QUEUE_FULL, 429, msg);
        }
        return -1;
    }
    if (idx >= 0)
        admission_admitted(r, role);
    if (idx == -E2BIG) {
        char msg[300];
        snprintf(msg, sizeof msg,
                 "no %s instance can hold this request: about %" PRId64 " prompt tokens + %" PRId64
                 " output tokens exceed every instance's max_model_len",
                 req_role_name(role), r->prompt_tokens, r->room_tokens);
        req_fail(r, RF_CONTEXT_TOO_LONG, 503, msg);
        return -1;
    }
    if (idx < 0 && role == RT_PREFILL && may_fall_back(r)) {
        fall_back_to_local_prefill(r, "no healthy prefill instance");
        return -1;
    }
    if (idx < 0) {
        req_fail(r, role ? RF_NO_DECODE : RF_NO_PREFILL, 503,
                 role ? "no healthy decode instance available" : "no healthy prefill instance available");
        return -1;
    }
    if (r->state != REQ_LEGS)
        req_set_state(r, REQ_LEGS);
    if (l->ntried < MAX_TRIED)
        l->tried[l->ntried++] = idx;
    l->attempts++;
    l->last_idx = idx;
    if (g_rt->cfg.access_log)
        req_inst_short(role, idx, l->who, sizeof l->who);
    l->t_sent = xpyd_now_us();
    l->idx = idx;
    l->charge = q.charged;
    r->predicted_cached[role] = q.cached;
    if (q.blocks)
        atomic_fetch_add(&g_rt->ctr.prefix_predicted[role], q.cached);
    if (q.by_session)
        atomic_fetch_add(&g_rt->ctr.session_picks[role], 1);
    return idx;
}

int req_pick_pair(struct request *r, void (*again)(struct request *r))
{
    if (req_pick(r, RT_PREFILL, r->prompt_tokens, again) < 0)
        return -1;
    int64_t charge;
    req_decode_charge(r, &charge);
    if (req_pick(r, RT_DECODE, charge, again) < 0) {
        if (r->state == REQ_QUEUED) /* waiting for a decode: give the prefill back, pick both again later */
            req_unpick(r, RT_PREFILL);
        return -1;
    }
    return 0;
}

void req_restart_pair(struct request *r, void (*start)(struct request *r))
{
    struct leg *p = &r->legs[RT_PREFILL];
    if (p->up) {
        up_leg_cancel(p->up);
        p->up = NULL;
    }
    req_unpick(r, RT_PREFILL);
    start(r);
}

/* A pick that is given back (bootstrap waiting for a decode returns its prefill): as if never made. */
void req_unpick(struct request *r, int role)
{
    struct leg *l = &r->legs[role];
    req_release(r, role);
    if (l->ntried > 0 && l->tried[l->ntried - 1] == l->last_idx) {
        l->ntried--;
        l->attempts--;
        l->last_idx = -1; /* once per pick */
    }
}

/* ---------- legs ---------- */

static void leg_head(struct up_leg *up, int status, void *arg)
{
    struct leg *l = arg;
    l->status = status;
    if (status == 200)
        l->accepted = 1;
}

/* An engine's Retry-After (kept for a 429/503 passed through); the xpyd decode's KV transfer report. */
static void leg_header(struct up_leg *up, const char *name, const char *value, void *arg)
{
    struct leg *l = arg;
    struct request *r = leg_request(l);
    if (strcasecmp(name, "Retry-After") == 0) {
        if (strlen(value) < sizeof r->retry_after && !strpbrk(value, "\r\n"))
            snprintf(r->retry_after, sizeof r->retry_after, "%s", value);
        return;
    }
    if (l->role != RT_DECODE || strcasecmp(name, "X-KV-Transfer") != 0)
        return;
    unsigned long long bytes = 0, us = 0;
    if (sscanf(value, "bytes=%llu; us=%llu", &bytes, &us) == 2) {
        atomic_fetch_add(&g_rt->ctr.kv_bytes, bytes);
        rt_hist_observe(&g_rt->ctr.kv_handoff_time, (double)us / 1e6);
    }
}

static void leg_body(struct up_leg *up, const char *data, size_t len, void *arg)
{
    struct leg *l = arg;
    struct request *r = leg_request(l);
    if (l->role == RT_DECODE && l->status == 200 && r->stream) {
        r->in_read = 1; /* http-parser hands over each chunk of the read: one write for all of them (leg_read_end) */
        if (client_relay(r, data, len) < 0) {
            l->up = NULL;
            up_leg_cancel(up);
            req_leg_fail(r, RF_DECODE_BROKEN_STREAM, RT_DECODE, l->idx, "an SSE event exceeded the size limit");
        }
        return;
    }
    if (!l->buf) /* made at the first byte of a body that is kept: a streamed decode never has one */
        l->buf = XPYD_XALLOC(evbuffer_new());
    if (evbuffer_get_length(l->buf) + len > (size_t)g_rt->cfg.max_response_bytes) {
        l->up = NULL;
        up_leg_cancel(up);
        req_leg_fail(r, RF_RESPONSE_TOO_LARGE, l->role, l->idx, "response larger than --max-response-bytes");
        return;
    }
    evbuffer_add(l->buf, data, len);
}

/* The leg's answer is complete (or it failed): what that means is the sender's (the core's or a handoff's). */
static void leg_done(struct up_leg *up, int err, void *arg)
{
    struct leg *l = arg;
    leg_request(l)->in_read = 0;
    l->on_done(up, err, arg);
}

static void leg_read_end(struct up_leg *up, void *arg)
{
    struct request *r = leg_request(arg);
    if (r->in_read)
        client_read_done(r);
}

void req_send(struct request *r, int role, char *body, size_t len, void (*on_done)(struct up_leg *, int, void *))
{
    struct leg *l = &r->legs[role];
    l->status = 0;
    r->retry_after[0] = 0;
    if (l->buf)
        evbuffer_drain(l->buf, evbuffer_get_length(l->buf));
    l->on_done = on_done;
    struct evbuffer *hb = XPYD_XALLOC(evbuffer_new());
    req_head(hb, r, role, l->idx, "POST", req_path(r), body, len);
    size_t hl = evbuffer_get_length(hb);
    char *head = XPYD_XALLOC(malloc(hl));
    evbuffer_remove(hb, head, hl);
    evbuffer_free(hb);
    static const struct up_leg_cbs cbs = {leg_head, leg_body, leg_done, NULL, leg_header, leg_read_end};
    /* the body the handoff built goes out as it is (the leg owns it): a long prompt is not copied again */
    l->up = up_leg_start_parts(r->t->up, req_endpoint(role, l->idx), head, hl, body, len, req_timeouts(), &cbs, l);
    if (!l->up)
        req_leg_fail(r, role ? RF_DECODE_CONNECT : RF_PREFILL_CONNECT, role, l->idx, "out of memory");
}

/* ---------- retries ---------- */

/* Counts one attempt's outcome against the instance (failures: connect, timeout, 5xx, unusable answer). */
void req_report(int role, int idx, int ok, int src, uint64_t src_uses)
{
    long ms = xb_report_from(g_rt->pools[role], idx, ok, src, src_uses);
    if (ms > 0) {
        char where[400];
        req_inst_desc(role, idx, where, sizeof where);
        xpyd_log_event(XPYD_LOG_WARN, "event=ejected instance=\"%s\" for_ms=%ld reason=consecutive_failures", where, ms);
    }
}

/* Another attempt on a different instance, while nothing reached the client and budget remains. */
static int may_retry(struct request *r, int role, int status, int fallback)
{
    const struct leg *l = &r->legs[role];
    const struct rt_config *c = &g_rt->cfg;
    struct rd_retry f = {.client_has_bytes = r->client != CLIENT_NOTHING, .ended = r->state == REQ_DONE || !r->ereq,
                         .status = status, .attempts = l->attempts, .tried = l->ntried, .max_retries = c->max_retries,
                         .ranks = g_rt->reg.n_ranks[role], .max_tried = MAX_TRIED, .retrying = r->retrying,
                         .fallback = fallback,
                         .active = (int64_t)atomic_load(&g_rt->ctr.active_requests),
                         .retries_active = (int64_t)atomic_load(&g_rt->ctr.retries_active),
                         .budget_percent = c->retry_budget_percent, .budget_min = c->retry_budget_min};
    enum rd_retry_answer a = rd_may_retry(&f);
    if (a == RD_BUDGET_SPENT)
        atomic_fetch_add(&g_rt->ctr.retries_denied, 1);
    if (a != RD_RETRY)
        return 0;
    if (!r->retrying == !fallback) { /* a fallback leaves the budget (its place is another's); others join it */
        r->retrying = !fallback;
        atomic_fetch_add(&g_rt->ctr.retries_active, fallback ? -1 : 1);
    }
    atomic_fetch_add(&g_rt->ctr.retries[role], 1);
    return 1;
}

static void on_retry_timer(evutil_socket_t fd, short ev, void *arg)
{
    struct request *r = arg;
    if (r->state == REQ_BACKOFF)
        r->next(r);
}

/* Runs next (the next attempt) after a jittered exponential backoff. */
void req_retry_later(struct request *r, int role, void (*next)(struct request *r))
{
    if (g_rt->cfg.retry_backoff_ms <= 0) {
        next(r);
        return;
    }
    r->t->rng = xpyd_mix64(r->t->rng);
    double ms = rd_backoff_ms(g_rt->cfg.retry_backoff_ms, r->legs[role].attempts, r->t->rng);
    r->next = next;
    req_set_state(r, REQ_BACKOFF);
    if (!r->retry_timer)
        r->retry_timer = XPYD_XALLOC(event_new(r->t->base, -1, 0, on_retry_timer, r));
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((long)(ms * 1000) % 1000000)};
    event_add(r->retry_timer, &tv);
}

/* Passes an upstream error answer through (status and JSON body). */
static void pass_through_error(struct request *r, int role, int status)
{
    struct leg *l = &r->legs[role];
    size_t n = l->buf ? evbuffer_get_length(l->buf) : 0;
    const char *data = n ? (const char *)evbuffer_pullup(l->buf, (ssize_t)n) : "";
    cJSON *j = n ? cJSON_ParseWithLength(data, n) : NULL;
    int fail = role ? RF_DECODE_STATUS : RF_PREFILL_STATUS;
    int openai = j && (cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(j, "error")) ||
                       cJSON_GetObjectItemCaseSensitive(j, "message"));
    cJSON_Delete(j);
    if (!openai) {
        char detail[200];
        snprintf(detail, sizeof detail, "HTTP %d without an OpenAI error body", status);
        req_leg_fail(r, fail, role, l->idx, detail);
        return;
    }
    if (status >= 500)
        rt_count_instance_error(role, l->idx, fail);
    if (r->client == CLIENT_NOTHING) {
        if (!(status == 429 || status == 503))
            r->retry_after[0] = 0;
        client_answer_json(r, status, data, n); /* the engine's own answer, as it sent it */
        req_end(r, status < 500 ? RF_BAD_REQUEST : fail);
        return;
    }
    char msg[600];
    snprintf(msg, sizeof msg, "%s answered HTTP %d", req_role_name(role), status);
    req_fail(r, status < 500 ? RF_BAD_REQUEST : fail, status, msg);
}

static const struct req_migration *migration; /* migrate.c's, installed at start; NULL: none */

void req_set_migration(const struct req_migration *m)
{
    migration = m;
}

/* A failed attempt of role (err, or its status): retried through next when allowed, a stream migrated, a
 * prefill replaced by the decode's own (--prefill-fallback), else the request fails. */
static void leg_failed(struct request *r, int role, int err, int status, void (*next)(struct request *r))
{
    struct leg *l = &r->legs[role];
    char buf[200];
    /* what this attempt's failure was, for the rank's error count by cause */
    int kind = role == RT_DECODE && r->preempted ? RF_DECODE_PREEMPTED
               : role == RT_DECODE && err && (r->client != CLIENT_NOTHING || l->status == 200)
                   ? RF_DECODE_BROKEN_STREAM /* cut after its head: streamed, or a JSON answer cut short */
                   : rd_leg_fail_kind(role, err, err ? 0 : status);
    /* a decode that failed before its head while a prefill's KV was meant for it: after the prefill answered
     * (kv-params, xpyd), or with the prefill running alongside (bootstrap, mooncake) */
    if (role == RT_DECODE && l->status != 200 && r->legs[RT_PREFILL].attempts > 0 && !r->local_prefill)
        atomic_fetch_add(&g_rt->ctr.kv_handoff_failures, 1);
    enum rd_kv_fate kv = role == RT_DECODE ? req_decode_kv_fate(r, err, status) : RD_KV_KEEP;
    if (rd_kv_lost_at_source(kv))
        l->ntried = 0; /* the decodes failed for want of the KV, not of themselves: any may compute the prompt */
    int refused = kv == RD_KV_REFUSED; /* a 4xx, retried as the KV's fault, not the request's */
    int lacked = !err && rd_kv_lost_at_source(kv); /* the decode answered: only the KV's source failed */
    if ((err || status >= 500 || refused) && may_retry(r, role, refused ? 0 : status, lacked)) {
        XLOG_INFO("msg=\"retrying %s elsewhere\" request_id=%s err=%s status=%d", req_role_name(role), r->xid,
                  err ? rd_err_text(err, buf, sizeof buf) : "-", status);
        if (!refused && !lacked)
            rt_count_instance_error(role, l->idx, kind);
        req_release(r, role);
        xpyd_sse_reset(&r->sse);
        r->preempted = 0; /* a new attempt's stream is its own */
        if (kv != RD_KV_KEEP) { /* decide.h: the next decode computes the prompt itself */
            static const char *const why[] = {"", "", "refused", "prefill_gone", "decodes_failed", "prefill_failing"};
            if ((kv == RD_KV_SUSPECT || kv == RD_KV_FAILING) && r->ho->abandon)
                r->ho->abandon(r, 0); /* the prefill may still hold the KV: freed now, not at its lease's end */
            if (kv != RD_KV_TAKEN) {
                atomic_fetch_add(&g_rt->ctr.prefill_fallbacks, 1);
                XLOG_INFO("msg=\"the prefill's KV could not be used: the next decode computes the prompt\" "
                          "request_id=%s why=%s", r->xid, why[kv]);
            }
            free(r->kv_params);
            r->kv_params = NULL;
            r->local_prefill = 1;
        }
        req_retry_later(r, role, next);
        return;
    }
    if (role == RT_DECODE && (err || status >= 500) && migration && migration->may(r)) {
        migration->go(r, err);
        return;
    }
    if (role == RT_PREFILL && (err || status >= 500) && may_fall_back(r)) {
        char why[200];
        snprintf(why, sizeof why, "prefill %s", err ? rd_err_text(err, buf, sizeof buf) : "answered 5xx");
        rt_count_instance_error(role, l->idx, kind);
        xpyd_sse_reset(&r->sse);
        fall_back_to_local_prefill(r, why);
        return;
    }
    if (err) {
        req_leg_fail(r, kind, role, l->idx, rd_err_text(err, buf, sizeof buf));
        return;
    }
    pass_through_error(r, role, status);
}

void req_prefill_failed(struct request *r, int err, void (*next)(struct request *r))
{
    leg_failed(r, RT_PREFILL, err, err ? 0 : r->legs[RT_PREFILL].status, next);
}

/* ---------- the sequential flow's completions (kv-params, xpyd, store) ---------- */

int req_absorb_prefill(struct request *r)
{
    struct evbuffer *b = r->legs[RT_PREFILL].buf;
    size_t n = b ? evbuffer_get_length(b) : 0;
    struct rw_prefill_answer a;
    if (rw_absorb_prefill(n ? (const char *)evbuffer_pullup(b, (ssize_t)n) : "", n, &a) != 0)
        return -1;
    /* everything the decode needs was taken out: the answer is not held for the rest of the stream */
    evbuffer_free(b);
    r->legs[RT_PREFILL].buf = NULL;
    r->kv_params = a.kv_params;
    a.kv_params = NULL;
    if (a.prompt_tokens >= 0 && !r->migrations) /* (a continuation's prompt is the client's + its tokens so far) */
        rt_tok_check(r, a.prompt_tokens);
    if (a.prompt_tokens >= 0)
        r->prompt_tokens = a.prompt_tokens; /* exact, replaces the estimate */
    if (a.cached_tokens >= 0) {
        r->cached_tokens = a.cached_tokens;
        if (g_rt->prefix_on[RT_PREFILL] && r->nblocks && !r->migrations) /* the prediction's truth */
            atomic_fetch_add(&g_rt->ctr.prefix_cached[RT_PREFILL], a.cached_tokens);
    }
    if (!r->resp_id) { /* a migrated stream's continuation keeps the id and token the client already has */
        r->resp_id = a.id;
        a.id = NULL;
    }
    if (!r->first_text) {
        r->first_text = a.first_text;
        a.first_text = NULL;
    }
    rw_prefill_answer_free(&a);
    return 0;
}

struct request *req_prefill_finished(struct leg *p, int err, int *ok)
{
    struct request *r = leg_request(p);
    p->up = NULL;
    if (r->state == REQ_DONE)
        return NULL;
    *ok = !err && p->status == 200;
    if (*ok || err || p->status >= 500) /* a 4xx judged the request, not the instance */
        req_report(RT_PREFILL, p->idx, *ok, -1, 0);
    return r;
}

void req_prefill_done(struct up_leg *up, int err, void *arg)
{
    struct leg *p = arg;
    int ok;
    struct request *r = req_prefill_finished(p, err, &ok);
    if (!r)
        return;
    if (!ok) {
        req_prefill_failed(r, err, r->ho->start);
        return;
    }
    if (req_absorb_prefill(r) != 0) {
        req_leg_fail(r, RF_PREFILL_BAD_RESPONSE, RT_PREFILL, p->idx, "the answer is not a JSON completion");
        return;
    }
    p->answered = 1;
    rt_hist_observe(&g_rt->ctr.prefill_time, (double)(xpyd_now_us() - p->t_sent) / 1e6);
    req_release(r, RT_PREFILL);
    if (g_rt->cfg.first_token == RT_FIRST_PREFILL && r->stream && r->client == CLIENT_NOTHING)
        client_prefill_first_token(r); /* (a migrated stream's continuation prefill has nothing to add) */
    req_start_decode(r);
}

/* Conditional disaggregation (--local-prefill-max-tokens, --local-prefill-when-busy-tokens): the decode rank
 * the policy would choose is asked first (a peek: nothing charged); when the prompt tokens it does not hold
 * cached are few enough, or every prefill is full and they are few enough for that case, the decode computes
 * the prompt itself. Only at a request's first placement, in the modes whose decode can run alone. */
static int choose_local_prefill(struct request *r)
{
    const struct rt_config *c = &g_rt->cfg;
    if (!r->ho->t->local_prefill || (!c->local_prefill_max_tokens && !c->local_prefill_when_busy_tokens) ||
        r->migrations || r->local_prefill || r->legs[RT_PREFILL].attempts)
        return 0;
    int64_t charge;
    req_decode_charge(r, &charge);
    struct xb_query q = {.need_len = need_len(r), .estimated = r->prompt_src == RT_PS_ESTIMATE, .tokens = charge,
                         .session = r->session, .peek = 1};
    rt_kv_query(&q, RT_DECODE, r->blocks, r->nblocks, r->model);
    if (xb_pick_q(g_rt->pools[RT_DECODE], &q) < 0)
        return 0;
    return rd_local_prefill(r->prompt_tokens, q.cached, c->local_prefill_max_tokens, c->local_prefill_when_busy_tokens,
                            xb_saturated(g_rt->pools[RT_PREFILL]));
}

void req_start_prefill(struct request *r)
{
    int first = !r->legs[RT_PREFILL].attempts && !r->migrations && !r->local_prefill;
    if (first && choose_local_prefill(r)) {
        r->local_prefill = 1;
        r->pd_local = 1;
        atomic_fetch_add(&g_rt->ctr.pd_decisions[1], 1);
        req_start_decode(r);
        return;
    }
    if (req_pick(r, RT_PREFILL, r->prompt_tokens, req_start_prefill) < 0)
        return;
    if (first && r->legs[RT_PREFILL].attempts == 1)
        atomic_fetch_add(&g_rt->ctr.pd_decisions[0], 1);
    size_t len;
    char *body = r->ho->prefill_body(r, &len);
    req_send(r, RT_PREFILL, body, len, req_prefill_done);
}

/* A non-streamed answer whose choice ended with stop_reason "recomputed" (the engine preempted it). */
static int answer_preempted(struct evbuffer *b)
{
    size_t n = b ? evbuffer_get_length(b) : 0;
    if (!n || !memmem(evbuffer_pullup(b, (ssize_t)n), n, "recomputed", 10)) /* the usual answer: no parse */
        return 0;
    cJSON *j = cJSON_ParseWithLength((const char *)evbuffer_pullup(b, (ssize_t)n), n);
    const cJSON *sr = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0), "stop_reason");
    int yes = cJSON_IsString(sr) && strcmp(sr->valuestring, "recomputed") == 0;
    cJSON_Delete(j);
    return yes;
}

void req_decode_done(struct up_leg *up, int err, void *arg)
{
    struct leg *d = arg;
    struct request *r = leg_request(d);
    d->up = NULL;
    if (r->state == REQ_DONE)
        return;
    int status = d->status;
    if (!err && status == 200)
        rt_hist_observe(&g_rt->ctr.decode_time, (double)(xpyd_now_us() - d->t_sent) / 1e6);
    int broken = !err && status == 200 && r->stream && !r->done_seen; /* a stream without [DONE] is broken */
    if (!err && status == 200 && !r->stream && answer_preempted(d->buf)) {
        r->preempted = 1; /* the engine gave the request up: its partial answer is not the client's */
        broken = 1;
    }
    /* a 5xx: the KV's loss told to its prefill; a decode that answered so as that prefill is gone or failing did
     * not fail itself: not ejected for it */
    uint64_t uses = 0; /* src: the prefill whose KV it lacked (repeats count once toward its ejection) */
    int src = err ? -1 : req_decode_kv_outcome(r, status, &uses);
    int lost = !err && status >= 500 && rd_kv_lost_at_source(req_decode_kv_fate(r, 0, status));
    if (err || broken || (status >= 500 && !lost))
        req_report(RT_DECODE, d->idx, 0, src, uses);
    else if (status == 200)
        req_report(RT_DECODE, d->idx, 1, -1, 0);
    if (!err && status == 200 && !broken) {
        if (!r->stream) {
            if (client_finish_json(r) != 0) {
                req_leg_fail(r, RF_DECODE_BROKEN_STREAM, RT_DECODE, d->idx, "the answer is not JSON");
                return;
            }
            if (!r->first_token_seen && r->ho->first_token) { /* non-streamed: its tokens came all at once */
                r->first_token_seen = 1;
                r->ho->first_token(r);
            }
        } else {
            client_stream_end(r);
        }
        req_end(r, RF_NONE);
        return;
    }
    if (broken) {
        err = -ECONNRESET;
        status = 0;
    }
    leg_failed(r, RT_DECODE, err, err ? 0 : status, r->ho->decode_retry);
}

void req_decode_charge(struct request *r, int64_t *charge)
{
    *charge = r->prompt_tokens + r->max_tokens; /* KV held + tokens still to generate */
}

void req_start_decode(struct request *r)
{
    int64_t charge;
    req_decode_charge(r, &charge);
    if (req_pick(r, RT_DECODE, charge, req_start_decode) < 0)
        return;
    size_t len;
    char *body = r->ho->decode_body(r, &len);
    req_send(r, RT_DECODE, body, len, req_decode_done);
}
