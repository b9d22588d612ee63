/* proxy.c - one client request through the router: parse once, pick prefill, prefill leg, handoff, pick
 * decode, decode leg relayed event by event, and one idempotent finish.
 *
 * Ownership: a struct rreq is created when a generate request's body is valid and freed only in
 * on_request_fini (libevhtp is freeing the client request), the single safe point. Every other ending
 * (done, error, timeout, client disconnect) goes through rreq_end(), which is idempotent: it cancels the
 * upstream legs, releases every balancer charge, counts and logs the request. */
#include "router.h"
#include "relay.h"
#include "rewrite.h"

#include "xpyd_oai.h"
#include "xpyd_sse.h"
#include "xpyd_util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <evhtp/evhtp.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <unistd.h>

const struct rt_fail_row rt_fail_table[RF_COUNT] = {
    [RF_NONE] = {"none", 200, 0},
    [RF_BAD_REQUEST] = {"bad_request", 400, 0},
    [RF_BODY_TOO_LARGE] = {"body_too_large", 413, 0},
    [RF_NO_PREFILL] = {"no_prefill_available", 503, 0},
    [RF_NO_DECODE] = {"no_decode_available", 503, 0},
    [RF_CONTEXT_TOO_LONG] = {"context_too_long", 503, 0},
    [RF_PREFILL_CONNECT] = {"prefill_connect", 502, 1},
    [RF_PREFILL_TIMEOUT] = {"prefill_timeout", 504, 1},
    [RF_PREFILL_STATUS] = {"prefill_status", 502, 1},
    [RF_PREFILL_BAD_RESPONSE] = {"prefill_bad_response", 502, 1},
    [RF_DECODE_CONNECT] = {"decode_connect", 502, 1},
    [RF_DECODE_TIMEOUT] = {"decode_timeout", 504, 1},
    [RF_DECODE_STATUS] = {"decode_status", 502, 1},
    [RF_DECODE_BROKEN_STREAM] = {"decode_broken_stream", 502, 1},
    [RF_RESPONSE_TOO_LARGE] = {"response_too_large", 502, 0},
    [RF_CLIENT_DISCONNECT] = {"client_disconnect", 499, 0},
    [RF_QUEUE_FULL] = {"queue_full", 429, 0},
    [RF_QUEUE_TIMEOUT] = {"queue_timeout", 503, 0},
};

#define MAX_TRIED 16

struct rreq {
    struct rthread *t;
    evhtp_request_t *ereq;      /* NULL once libevhtp freed it */
    int kind;                   /* RT_EP_COMPLETIONS / RT_EP_CHAT */
    cJSON *body;                /* the client's body, parsed once (read by the router); owned */
    struct rw_src *src;         /* the client's body bytes, what engines receive (rewrite.h); owned */
    int stream;
    char xid[128];              /* X-Request-Id sent on every leg */
    char *fwd_headers;          /* client headers forwarded upstream, serialized; owned */
    int64_t prompt_tokens;      /* estimate, corrected by prefill's usage */
    int64_t max_tokens;
    uint64_t t_start, t_first, t_prefill_done;
    uint64_t t_leg[2];          /* when the current prefill / decode leg was sent */
    uint64_t t_last_tok;        /* when the last content event went to the client (ITL) */
    int last_idx[2];            /* the last instance picked per role (access log), -1 none */
    /* legs and charges */
    int p_idx, d_idx;           /* balancer instance of the current attempt, -1 none */
    int64_t p_charge, d_charge; /* tokens charged on them, released exactly */
    struct up_leg *pleg, *dleg;
    int tried[2][MAX_TRIED];
    int ntried[2];
    int attempts[2];
    struct evbuffer *pbuf;      /* prefill response body */
    struct evbuffer *dbuf;      /* decode response body (non-streamed, or an error body) */
    int p_status, d_status;
    char retry_after[64];       /* the failing engine's Retry-After, passed through with its 429/503 */
    int prefill_answered;
    int decode_accepted;        /* some decode answered 200: it took (pulled) the prefill's KV */
    /* handoff results */
    cJSON *kv_params;           /* returned by prefill; owned */
    long cached_tokens;         /* prefill's usage.prompt_tokens_details.cached_tokens, -1 unknown */
    char *first_text;           /* prefill's token (first-token prefill mode); owned */
    char *resp_id;              /* the id the client sees in every event (prefill mode); owned */
    uint64_t room;
    /* streaming to the client */
    struct xpyd_sse_parser sse;
    int client_started;
    int done_seen;
    int role_sent;              /* chat: role chunk already sent to the client */
    int first_dropped;          /* prefill mode: decode's first content event removed */
    int64_t tokens_out;
    int paused;
    struct evbuffer *chunk;     /* the next chunk to the client, reused for every event (owned) */
    int retrying;               /* counted in retries_active until the request ends */
    struct event *retry_timer;  /* backoff before the next attempt (owned) */
    void (*retry_fn)(struct rreq *r);
    struct event *bp_timer;     /* while paused: watches the client's output drain (owned) */
    int clones_fired;
    struct event *close_ev;
    /* admission queue: waiting for a rank under max_inflight */
    int queued_role;            /* -1: not queued */
    struct rreq *qprev, *qnext;
    void (*queued_fn)(struct rreq *r);
    struct event *queue_timer;  /* --queue-timeout-ms deadline (owned) */
    /* ending */
    int ended;
    int status;                 /* what the client got */
    int fail;                   /* enum rt_fail */
};

struct clone {
    int d_idx;
    int64_t charge;
    struct up_leg *leg;
};

static void rreq_end(struct rreq *r, int fail);
static const struct up_timeouts *timeouts(void);
static void admission_remove(struct rreq *r);
static void start_prefill(struct rreq *r);
static void start_decode(struct rreq *r);
static void start_bootstrap(struct rreq *r);
static void on_retry_after(struct up_leg *leg, const char *name, const char *value, void *arg);
static void token_out(struct rreq *r);

static __thread struct rthread *tls_rt;
static pthread_mutex_t threads_mu = PTHREAD_MUTEX_INITIALIZER;
static struct rthread *all_threads;

/* ---------- small helpers ---------- */

static void add_header(evhtp_request_t *req, const char *k, const char *v)
{
    evhtp_headers_add_header(req->headers_out, evhtp_header_new(k, v, 0, 1));
}

static int status_slot(int st)
{
    return st >= 100 && st < 600 ? st : 0;
}

/* Sends a complete JSON answer to a client whose request is paused (all generate requests are). */
static void send_json(struct rreq *r, int status, const char *body, size_t len)
{
    evhtp_request_t *req = r->ereq;
    if (!req)
        return;
    r->status = status;
    rt_reply(req, status, "application/json", body, len);
    evhtp_request_resume(req);
}

static void send_error(struct rreq *r, int status, const char *msg)
{
    char *body = xpyd_oai_error_json(status, NULL, msg, NULL);
    send_json(r, status, body, strlen(body));
    free(body);
}

static const char *ep_name(int ep)
{
    return ep == RT_EP_CHAT ? "/v1/chat/completions" : "/v1/completions";
}

static void inst_desc(int role, int idx, char *out, size_t cap)
{
    struct xb_instance_stats st;
    if (idx < 0 || xb_stats(g_rt->pools[role], idx, &st) != 0) {
        snprintf(out, cap, "%s", role ? "decode" : "prefill");
        return;
    }
    char hp[280];
    xpyd_hostport(st.host, st.port, hp, sizeof hp);
    if (st.dp_rank >= 0)
        snprintf(out, cap, "%s %s (dp rank %d)", role ? "decode" : "prefill", hp, st.dp_rank);
    else
        snprintf(out, cap, "%s %s", role ? "decode" : "prefill", hp);
}

/* The endpoint (connection pool) of a balancer instance. */
static int endpoint_of(int role, int idx)
{
    return g_rt->cfg.ranks[role][idx].endpoint;
}

/* ---------- request parsing ---------- */

static int hop_by_hop(const char *k)
{
    static const char *const skip[] = {"connection", "keep-alive", "proxy-connection", "proxy-authorization",
                                       "te", "trailer", "transfer-encoding", "upgrade", "host", "content-length",
                                       "content-type", "x-request-id", "accept-encoding", "x-data-parallel-rank",
                                       XPYD_TOO_LARGE_HEADER,
                                       "expect", NULL};
    for (int i = 0; skip[i]; i++)
        if (strcasecmp(k, skip[i]) == 0)
            return 1;
    return 0;
}

static int collect_header(evhtp_kv_t *kv, void *arg)
{
    struct evbuffer *b = arg;
    if (kv->key && kv->val && !hop_by_hop(kv->key) && !strpbrk(kv->val, "\r\n"))
        evbuffer_add_printf(b, "%s: %s\r\n", kv->key, kv->val);
    return 0;
}

/* ---------- building upstream requests ---------- */

static struct evbuffer *build_request(struct rreq *r, int role, int idx, const char *method, const char *path,
                                      const char *body, size_t len)
{
    const struct up_endpoint *ep = &g_rt->endpoints[endpoint_of(role, idx)];
    struct evbuffer *b = XPYD_XALLOC(evbuffer_new());
    up_request_line(b, ep, method, path);
    evbuffer_add_printf(b, "X-Request-Id: %s\r\n", r->xid);
    int dp = g_rt->cfg.ranks[role][idx].dp_rank;
    if (dp >= 0)
        evbuffer_add_printf(b, "X-data-parallel-rank: %d\r\n", dp);
    if (r->fwd_headers)
        evbuffer_add(b, r->fwd_headers, strlen(r->fwd_headers));
    if (body)
        evbuffer_add_printf(b, "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n", len);
    else
        evbuffer_add_printf(b, "\r\n");
    if (body)
        evbuffer_add(b, body, len);
    return b;
}

static char *print_json(const cJSON *o, size_t *len)
{
    return rw_print(o, len);
}

/* The prefill leg's body: one token, not streamed, asking the engine to keep the KV (kv-params). */
static char *prefill_body(struct rreq *r, size_t *len)
{
    return rw_prefill_body(r->src, RT_KV_FLOW(g_rt->cfg.handoff), len);
}

/* The decode leg's body: the client's, with the prefill's kv_transfer_params (kv-params mode). */
static char *decode_body(struct rreq *r, size_t *len)
{
    return rw_decode_body(r->src, r->kv_params, RT_KV_FLOW(g_rt->cfg.handoff), len);
}

/* ---------- client stream ---------- */

static void client_stream_start(struct rreq *r)
{
    if (r->client_started || !r->ereq)
        return;
    r->client_started = 1;
    r->status = 200;
    r->t_first = xpyd_now_us();
    rt_hist_observe(RT_H_TTFT, (double)(r->t_first - r->t_start) / 1e6);
    atomic_fetch_add(&g_rt->ctr.active_streams, 1);
    add_header(r->ereq, "Content-Type", "text/event-stream");
    add_header(r->ereq, "Cache-Control", "no-cache");
    evhtp_send_reply_chunk_start(r->ereq, EVHTP_RES_OK);
}

/* While the decode leg is paused for a slow client: resume once the client's buffer drained to half. */
static void on_backpressure_tick(evutil_socket_t fd, short ev, void *arg)
{
    struct rreq *r = arg;
    if (!r->paused || !r->ereq || !r->dleg)
        return;
    struct bufferevent *bev = evhtp_connection_get_bev(evhtp_request_get_connection(r->ereq));
    if (bev && evbuffer_get_length(bufferevent_get_output(bev)) > (size_t)g_rt->cfg.client_buffer_bytes / 2) {
        struct timeval tv = {0, 2000};
        event_add(r->bp_timer, &tv);
        return;
    }
    r->paused = 0;
    XLOG_DEBUG("msg=\"client caught up: decode leg resumed\" request_id=%s", r->xid);
    up_leg_resume(r->dleg);
}

static struct evbuffer *chunk_of(struct rreq *r)
{
    if (!r->chunk)
        r->chunk = XPYD_XALLOC(evbuffer_new());
    return r->chunk;
}

/* Sends what r->chunk holds as one chunk (libevhtp moves the bytes out, so the buffer is reused). */
static void client_flush_chunk(struct rreq *r)
{
    struct evbuffer *c = chunk_of(r);
    if (!r->ereq) {
        evbuffer_drain(c, evbuffer_get_length(c));
        return;
    }
    evhtp_send_reply_chunk(r->ereq, c);
    /* Backpressure: a slow client pauses the decode leg instead of growing this buffer without bound. */
    struct bufferevent *bev = evhtp_connection_get_bev(evhtp_request_get_connection(r->ereq));
    if (bev && evbuffer_get_length(bufferevent_get_output(bev)) > (size_t)g_rt->cfg.client_buffer_bytes && r->dleg &&
        !r->paused) {
        r->paused = 1;
        XLOG_DEBUG("msg=\"client slow: decode leg paused\" request_id=%s", r->xid);
        up_leg_pause(r->dleg);
        if (!r->bp_timer)
            r->bp_timer = XPYD_XALLOC(event_new(r->t->base, -1, 0, on_backpressure_tick, r));
        struct timeval tv = {0, 2000};
        event_add(r->bp_timer, &tv);
    }
}

static void client_write(struct rreq *r, const char *data, size_t len)
{
    evbuffer_add(chunk_of(r), data, len);
    client_flush_chunk(r);
}

static void client_event_json(struct rreq *r, const cJSON *o)
{
    char *s = XPYD_XALLOC(cJSON_PrintUnformatted(o));
    xpyd_sse_write(chunk_of(r), s, strlen(s));
    free(s);
    client_flush_chunk(r);
}

static void client_stream_end(struct rreq *r)
{
    if (r->ereq) {
        evhtp_send_reply_chunk_end(r->ereq);
        evhtp_request_resume(r->ereq); /* deferred by libevhtp: the keep-alive connection reads again */
    }
}

/* A failure after the stream started: one error event, then [DONE]. */
static void client_stream_error(struct rreq *r, int status, const char *msg)
{
    char *e = xpyd_oai_error_json(status, NULL, msg, NULL);
    xpyd_sse_write(chunk_of(r), e, strlen(e));
    xpyd_sse_write_done(chunk_of(r));
    free(e);
    client_flush_chunk(r);
    client_stream_end(r);
}

/* ---------- ending ---------- */

/* An instance of role freed a slot: every thread with requests waiting for that role tries again (in its
 * own loop, soon; event_active is safe from any thread). */
static void admission_wake(int role)
{
    if (atomic_load(&g_rt->ctr.queued[role]) <= 0)
        return;
    pthread_mutex_lock(&threads_mu);
    for (struct rthread *t = all_threads; t; t = t->next_thread)
        if (t->kick)
            event_active(t->kick, EV_READ, 0);
    pthread_mutex_unlock(&threads_mu);
}

static void release_prefill(struct rreq *r)
{
    if (r->p_idx >= 0) {
        xb_release(g_rt->pools[RT_PREFILL], r->p_idx, r->p_charge);
        admission_wake(RT_PREFILL);
        r->p_idx = -1;
        r->p_charge = 0;
    }
}

static void release_decode(struct rreq *r)
{
    if (r->d_idx >= 0) {
        xb_release(g_rt->pools[RT_DECODE], r->d_idx, r->d_charge);
        admission_wake(RT_DECODE);
        r->d_idx = -1;
        r->d_charge = 0;
    }
}

static void inst_short(int role, int idx, char *out, size_t cap)
{
    struct xb_instance_stats st;
    if (idx < 0 || xb_stats(g_rt->pools[role], idx, &st) != 0) {
        snprintf(out, cap, "-");
        return;
    }
    xpyd_hostport(st.host, st.port, out, cap);
    if (st.dp_rank >= 0)
        snprintf(out + strlen(out), cap - strlen(out), "#%d", st.dp_rank);
}

static void access_log(const struct rreq *r, int fail)
{
    if (!g_rt->cfg.access_log)
        return;
    char pi[300], di[300];
    inst_short(RT_PREFILL, r->last_idx[RT_PREFILL], pi, sizeof pi);
    inst_short(RT_DECODE, r->last_idx[RT_DECODE], di, sizeof di);
    uint64_t now = xpyd_now_us();
    double total = (double)(now - r->t_start) / 1e6;
    double ttft = r->t_first ? (double)(r->t_first - r->t_start) / 1e6 : -1;
    if (g_rt->cfg.access_log == 2)
        fprintf(stderr,
                "{\"request_id\":\"%s\",\"endpoint\":\"%s\",\"prefill\":\"%s\",\"decode\":\"%s\",\"status\":%d,"
                "\"stream\":%s,\"prompt_tokens\":%" PRId64 ",\"output_tokens\":%" PRId64
                ",\"ttft_s\":%.6f,\"total_s\":%.6f,\"error\":\"%s\"}\n",
                r->xid, ep_name(r->kind), pi, di, r->status, r->stream ? "true" : "false", r->prompt_tokens,
                r->tokens_out, ttft, total, rt_fail_table[fail].name);
    else
        fprintf(stderr,
                "access request_id=%s endpoint=%s prefill=%s decode=%s status=%d stream=%d prompt_tokens=%" PRId64
                " output_tokens=%" PRId64 " ttft_s=%.6f total_s=%.6f error=%s\n",
                r->xid, ep_name(r->kind), pi, di, r->status, r->stream, r->prompt_tokens, r->tokens_out, ttft, total,
                rt_fail_table[fail].name);
}

static void kv_release_done(struct up_leg *leg, int err, void *arg)
{
}

/* kv-params: the prefill answered and holds KV for a decode that will now never take it (every decode
 * attempt failed, or the request ended while none was in flight). vLLM has no "free" call; the way to make
 * the engines let go early is dispatch-and-cancel: hand a decode the request with the prefill's
 * kv_transfer_params (max_tokens 1, not streamed) and close the connection once it is written; the decode
 * sees the request and its cancellation and frees the prefill's blocks (xpyd_sim: POST /kv/release).
 * The decode is one not tried by this request when there is one. Without any usable decode, the engine's
 * own lease expiry frees the KV. */
static void kv_release_dispatch(struct rreq *r)
{
    int idx = -1; /* chosen by health, not through the balancer: it carries no load and moves no cursor */
    for (size_t i = 0; i < g_rt->cfg.n_ranks[RT_DECODE]; i++) {
        struct xb_instance_stats st;
        if (xb_stats(g_rt->pools[RT_DECODE], (int)i, &st) != 0 || !st.healthy || st.ejected || st.removed)
            continue;
        int tried = 0;
        for (int k = 0; k < r->ntried[RT_DECODE]; k++)
            tried |= r->tried[RT_DECODE][k] == (int)i;
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
    struct evbuffer *req = build_request(r, RT_DECODE, idx, "POST", ep_name(r->kind), body, len);
    free(body);
    static const struct up_leg_cbs cbs = {NULL, NULL, kv_release_done, NULL, NULL};
    struct up_leg *leg = up_leg_start(r->t->up, endpoint_of(RT_DECODE, idx), req, timeouts(), &cbs, NULL);
    evbuffer_free(req);
    if (leg) {
        up_leg_cancel_after_send(leg);
        atomic_fetch_add(&g_rt->ctr.kv_release_dispatches, 1);
        xpyd_log_event("event=kv_release_dispatch request_id=%s", r->xid);
    }
}

/* Idempotent end of a request: legs closed, charges released, counted. The client already has its answer
 * (or is gone); the rreq itself is freed later in on_request_fini. */
static void rreq_end(struct rreq *r, int fail)
{
    if (r->ended)
        return;
    r->ended = 1;
    r->fail = fail;
    admission_remove(r);
    if (r->queue_timer) {
        event_free(r->queue_timer);
        r->queue_timer = NULL;
    }
    if (r->pleg) {
        up_leg_cancel(r->pleg);
        r->pleg = NULL;
    }
    if (r->dleg) {
        /* kv-params: the decode may still have to pull (and so free) the prefill's KV: let it see the request
         * and its cancellation instead of never hearing of it. */
        if (r->prefill_answered && g_rt->cfg.handoff == RT_HANDOFF_KV_PARAMS)
            up_leg_cancel_after_send(r->dleg);
        else
            up_leg_cancel(r->dleg);
        r->dleg = NULL;
    } else if (fail != RF_NONE && r->prefill_answered && r->kv_params && !r->decode_accepted &&
               g_rt->cfg.handoff == RT_HANDOFF_KV_PARAMS) {
        kv_release_dispatch(r);
    }
    /* xpyd: the prefill's engine is told directly, whatever the decode leg was doing */
    if (fail != RF_NONE && r->prefill_answered && r->kv_params && !r->decode_accepted &&
        g_rt->cfg.handoff == RT_HANDOFF_XPYD)
        rt_kvxfer_release(r->kv_params);
    release_prefill(r);
    release_decode(r);
    if (r->close_ev) {
        event_free(r->close_ev);
        r->close_ev = NULL;
    }
    if (r->bp_timer) {
        event_free(r->bp_timer);
        r->bp_timer = NULL;
    }
    if (r->retry_timer) {
        event_free(r->retry_timer);
        r->retry_timer = NULL;
    }
    if (r->retrying) {
        r->retrying = 0;
        atomic_fetch_sub(&g_rt->ctr.retries_active, 1);
    }
    if (r->client_started)
        atomic_fetch_sub(&g_rt->ctr.active_streams, 1);
    atomic_fetch_sub(&g_rt->ctr.active_requests, 1);
    if (fail == RF_CLIENT_DISCONNECT)
        r->status = 499;
    atomic_fetch_add(&g_rt->ctr.requests[r->kind][status_slot(r->status)], 1);
    if (fail == RF_NONE)
        rt_hist_observe(RT_H_E2E, (double)(xpyd_now_us() - r->t_start) / 1e6);
    if (fail != RF_NONE)
        atomic_fetch_add(&g_rt->ctr.errors[fail], 1);
    atomic_fetch_add(&g_rt->ctr.prompt_tokens, (uint64_t)r->prompt_tokens);
    atomic_fetch_add(&g_rt->ctr.generation_tokens, (uint64_t)r->tokens_out);
    access_log(r, fail);
}

/* Fails the request with the failure's row: an HTTP error before the first byte, an error event after. */
static void rreq_fail(struct rreq *r, int fail, int role, int idx, const char *detail)
{
    char where[400], msg[1000];
    inst_desc(role, idx, where, sizeof where);
    snprintf(msg, sizeof msg, "%s failed: %s", where, detail);
    if (role >= 0 && idx >= 0 && (size_t)idx < 4096)
        atomic_fetch_add(&g_rt->ctr.instance_errors[role][idx], 1);
    /* errors are always logged, whatever --log-level (but none), as one structured line */
    xpyd_log_event("event=request_failed request_id=%s reason=%s detail=\"%s\"", r->xid, rt_fail_table[fail].name, msg);
    if (r->client_started) {
        client_stream_error(r, rt_fail_table[fail].status, msg);
    } else {
        send_error(r, rt_fail_table[fail].status, msg);
    }
    rreq_end(r, fail);
}

/* libevhtp is freeing the client request (answer sent, or the connection is gone): the single safe point. */
static void on_request_fini(void *arg)
{
    struct rreq *r = arg;
    r->ereq = NULL;
    if (!r->ended) {
        atomic_fetch_add(&g_rt->ctr.client_disconnects, 1);
        rreq_end(r, RF_CLIENT_DISCONNECT);
    }
    cJSON_Delete(r->body);
    rw_src_free(r->src);
    cJSON_Delete(r->kv_params);
    free(r->fwd_headers);
    free(r->first_text);
    free(r->resp_id);
    if (r->pbuf)
        evbuffer_free(r->pbuf);
    if (r->dbuf)
        evbuffer_free(r->dbuf);
    if (r->chunk)
        evbuffer_free(r->chunk);
    xpyd_sse_reset(&r->sse);
    free(r);
}

static void on_client_closed(evutil_socket_t fd, short ev, void *arg)
{
    struct rreq *r = arg;
    event_free(r->close_ev);
    r->close_ev = NULL;
    if (r->ended || !r->ereq)
        return;
    atomic_fetch_add(&g_rt->ctr.client_disconnects, 1);
    rreq_end(r, RF_CLIENT_DISCONNECT);
    evhtp_connection_free(evhtp_request_get_connection(r->ereq)); /* calls on_request_fini */
}

/* ---------- passive ejection ---------- */

/* Counts one attempt's outcome against the instance (failures: connect, timeout, 5xx, unusable answer). */
static void report_leg(int role, int idx, int ok)
{
    long ms = xb_report(g_rt->pools[role], idx, ok);
    if (ms > 0) {
        char where[400];
        inst_desc(role, idx, where, sizeof where);
        xpyd_log_event("event=ejected instance=\"%s\" for_ms=%ld reason=consecutive_failures", where, ms);
    }
}

/* ---------- retries ---------- */

static int leg_fail_kind(int role, int err, int status)
{
    if (status)
        return role ? RF_DECODE_STATUS : RF_PREFILL_STATUS;
    if (err == -ETIMEDOUT && role == RT_PREFILL)
        return RF_PREFILL_CONNECT;
    if (err == -ETIMEDOUT)
        return RF_DECODE_CONNECT;
    if (err == -ETIME)
        return role ? RF_DECODE_TIMEOUT : RF_PREFILL_TIMEOUT;
    return role ? RF_DECODE_CONNECT : RF_PREFILL_CONNECT;
}

static const char *err_text(int err, char *buf, size_t cap)
{
    if (err == -ETIME)
        snprintf(buf, cap, "no answer within the timeout");
    else if (err == -ETIMEDOUT)
        snprintf(buf, cap, "connect timed out");
    else if (err == -EPROTO)
        snprintf(buf, cap, "malformed HTTP response");
    else if (err == -ECONNRESET)
        snprintf(buf, cap, "connection closed before the response was complete");
    else
        snprintf(buf, cap, "%s", strerror(-err));
    return buf;
}

/* Another attempt on a different instance, while nothing reached the client and budget remains. */
static int may_retry(struct rreq *r, int role, int status)
{
    if (r->client_started || r->ended || !r->ereq)
        return 0;
    if (status && status < 500)
        return 0; /* the engine judged the request itself: another one would too */
    if (r->attempts[role] > g_rt->cfg.max_retries || r->ntried[role] >= MAX_TRIED ||
        (size_t)r->ntried[role] >= g_rt->cfg.n_ranks[role])
        return 0; /* out of attempts, or every instance was tried: the real error goes to the client */
    if (!r->retrying) {
        /* Retry budget: in an outage, retries must not multiply the load on what is left. */
        int64_t active = (int64_t)atomic_load(&g_rt->ctr.active_requests);
        int64_t allowed = active * g_rt->cfg.retry_budget_percent / 100;
        if (allowed < g_rt->cfg.retry_budget_min)
            allowed = g_rt->cfg.retry_budget_min;
        if ((int64_t)atomic_load(&g_rt->ctr.retries_active) >= allowed) {
            atomic_fetch_add(&g_rt->ctr.retries_denied, 1);
            return 0;
        }
        r->retrying = 1;
        atomic_fetch_add(&g_rt->ctr.retries_active, 1);
    }
    atomic_fetch_add(&g_rt->ctr.retries[role], 1);
    return 1;
}

static void on_retry_timer(evutil_socket_t fd, short ev, void *arg)
{
    struct rreq *r = arg;
    if (!r->ended && r->retry_fn)
        r->retry_fn(r);
}

/* Runs fn (the next attempt) after a jittered exponential backoff. */
static void retry_later(struct rreq *r, int role, void (*fn)(struct rreq *r))
{
    long base = g_rt->cfg.retry_backoff_ms;
    if (base <= 0) {
        fn(r);
        return;
    }
    double ms = (double)base;
    for (int k = 1; k < r->attempts[role] && ms < 1000; k++)
        ms *= 2;
    if (ms > 1000)
        ms = 1000;
    r->t->rng = xpyd_mix64(r->t->rng);
    ms *= 0.5 + (double)(r->t->rng >> 11) / 9007199254740992.0;
    r->retry_fn = fn;
    if (!r->retry_timer)
        r->retry_timer = XPYD_XALLOC(event_new(r->t->base, -1, 0, on_retry_timer, r));
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((long)(ms * 1000) % 1000000)};
    event_add(r->retry_timer, &tv);
}

/* Passes an upstream error answer through (status and JSON body), before the first byte. */
static void pass_through_error(struct rreq *r, int role, int idx, int status, struct evbuffer *body)
{
    size_t n = body ? evbuffer_get_length(body) : 0;
    const char *data = n ? (const char *)evbuffer_pullup(body, (ssize_t)n) : "";
    cJSON *j = n ? cJSON_ParseWithLength(data, n) : NULL;
    int fail = role ? RF_DECODE_STATUS : RF_PREFILL_STATUS;
    if (role >= 0 && idx >= 0 && (size_t)idx < 4096 && status >= 500)
        atomic_fetch_add(&g_rt->ctr.instance_errors[role][idx], 1);
    if (j && (cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(j, "error")) ||
              cJSON_GetObjectItemCaseSensitive(j, "message"))) {
        if (r->client_started) {
            char msg[600];
            snprintf(msg, sizeof msg, "%s answered HTTP %d", role ? "decode" : "prefill", status);
            client_stream_error(r, status, msg);
        } else {
            if ((status == 429 || status == 503) && r->retry_after[0] && r->ereq)
                add_header(r->ereq, "Retry-After", r->retry_after);
            send_json(r, status, data, n);
        }
        cJSON_Delete(j);
        rreq_end(r, status < 500 ? RF_BAD_REQUEST : fail);
        return;
    }
    cJSON_Delete(j);
    char detail[200];
    snprintf(detail, sizeof detail, "HTTP %d without an OpenAI error body", status);
    rreq_fail(r, fail, role, idx, detail);
}

/* ---------- prefill leg ---------- */

static void remember(struct rreq *r, int role, int idx)
{
    if (r->ntried[role] < MAX_TRIED)
        r->tried[role][r->ntried[role]++] = idx;
}

/* ---------- admission queue ---------- */

static void admission_remove(struct rreq *r)
{
    int role = r->queued_role;
    if (role < 0)
        return;
    struct rthread *t = r->t;
    if (r->qprev)
        r->qprev->qnext = r->qnext;
    else
        t->qhead[role] = r->qnext;
    if (r->qnext)
        r->qnext->qprev = r->qprev;
    else
        t->qtail[role] = r->qprev;
    r->qprev = r->qnext = NULL;
    r->queued_role = -1;
    atomic_fetch_sub(&g_rt->ctr.queued[role], 1);
}

static void on_queue_timeout(evutil_socket_t fd, short ev, void *arg)
{
    struct rreq *r = arg;
    int role = r->queued_role;
    admission_remove(r);
    char msg[300];
    snprintf(msg, sizeof msg, "no %s instance had room within --queue-timeout-ms (%ld ms): every rank is at its "
             "max_inflight", role ? "decode" : "prefill", g_rt->cfg.queue_timeout_ms);
    xpyd_log_event("event=request_failed request_id=%s reason=queue_timeout role=%s", r->xid, role ? "decode" : "prefill");
    if (r->client_started)
        client_stream_error(r, 503, msg);
    else
        send_error(r, 503, msg);
    rreq_end(r, RF_QUEUE_TIMEOUT);
}

/* Every eligible rank of role is at max_inflight: r waits (FIFO per thread) until a slot frees, up to
 * --queue-timeout-ms; with --admission-queue requests already waiting for role, it gets 429 at once. */
static void admission_wait(struct rreq *r, int role, void (*again)(struct rreq *r))
{
    struct rthread *t = r->t;
    r->queued_fn = again;
    if (t->kick_role == role) { /* tried again from the queue and still no room: back to the front */
        r->queued_role = role;
        r->qprev = NULL;
        r->qnext = t->qhead[role];
        if (t->qhead[role])
            t->qhead[role]->qprev = r;
        else
            t->qtail[role] = r;
        t->qhead[role] = r;
        atomic_fetch_add(&g_rt->ctr.queued[role], 1);
        t->kick_blocked = 1;
        return;
    }
    if (atomic_fetch_add(&g_rt->ctr.queued[role], 1) >= g_rt->cfg.admission_queue) {
        atomic_fetch_sub(&g_rt->ctr.queued[role], 1);
        char msg[300];
        snprintf(msg, sizeof msg, "too many requests: every %s rank is at its max_inflight and %ld requests are "
                 "already waiting (--admission-queue); retry later", role ? "decode" : "prefill",
                 g_rt->cfg.admission_queue);
        if (r->client_started) {
            client_stream_error(r, 429, msg);
        } else {
            if (r->ereq)
                add_header(r->ereq, "Retry-After", "1");
            send_error(r, 429, msg);
        }
        rreq_end(r, RF_QUEUE_FULL);
        return;
    }
    r->queued_role = role;
    r->qnext = NULL;
    r->qprev = t->qtail[role];
    if (t->qtail[role])
        t->qtail[role]->qnext = r;
    else
        t->qhead[role] = r;
    t->qtail[role] = r;
    if (!r->queue_timer) {
        r->queue_timer = XPYD_XALLOC(evtimer_new(t->base, on_queue_timeout, r));
        struct timeval tv = {g_rt->cfg.queue_timeout_ms / 1000, (g_rt->cfg.queue_timeout_ms % 1000) * 1000};
        evtimer_add(r->queue_timer, &tv);
    }
    /* a slot may have been freed between the pick and the enqueue: look once more */
    event_active(t->kick, EV_READ, 0);
}

static void on_kick(evutil_socket_t fd, short ev, void *arg)
{
    struct rthread *t = arg;
    for (int role = 0; role < 2; role++) {
        t->kick_role = role;
        t->kick_blocked = 0;
        struct rreq *r;
        while (!t->kick_blocked && (r = t->qhead[role]) != NULL) {
            admission_remove(r);
            r->queued_fn(r);
        }
    }
    t->kick_role = -1;
}

static int pick(struct rreq *r, int role, int64_t charge, void (*again)(struct rreq *r))
{
    uint64_t need = (uint64_t)(r->prompt_tokens + r->max_tokens);
    int idx = xb_pick(g_rt->pools[role], need, charge, r->tried[role], r->ntried[role]);
    if (idx == -EBUSY) {
        admission_wait(r, role, again);
        return -1;
    }
    if (idx >= 0 && r->queue_timer) { /* admitted after waiting */
        event_free(r->queue_timer);
        r->queue_timer = NULL;
        atomic_fetch_add(&g_rt->ctr.queue_admitted[role], 1);
    }
    if (idx == -E2BIG) {
        char msg[300];
        snprintf(msg, sizeof msg,
                 "no %s instance can hold this request: about %" PRId64 " prompt tokens + %" PRId64
                 " max tokens exceed every instance's max_model_len",
                 role ? "decode" : "prefill", r->prompt_tokens, r->max_tokens);
        if (r->client_started)
            client_stream_error(r, 503, msg);
        else
            send_error(r, 503, msg);
        rreq_end(r, RF_CONTEXT_TOO_LONG);
        return -1;
    }
    if (idx < 0) {
        const char *msg = role ? "no healthy decode instance available" : "no healthy prefill instance available";
        if (r->client_started)
            client_stream_error(r, 503, msg);
        else
            send_error(r, 503, msg);
        rreq_end(r, role ? RF_NO_DECODE : RF_NO_PREFILL);
        return -1;
    }
    remember(r, role, idx);
    r->attempts[role]++;
    r->last_idx[role] = idx;
    r->t_leg[role] = xpyd_now_us();
    return idx;
}

static const struct up_timeouts *timeouts(void)
{
    static __thread struct up_timeouts to;
    to.connect_ms = g_rt->cfg.connect_timeout_ms;
    to.first_byte_ms = g_rt->cfg.first_token_timeout_ms;
    to.idle_ms = g_rt->cfg.stream_idle_timeout_ms;
    return &to;
}

static void p_on_head(struct up_leg *leg, int status, void *arg)
{
    struct rreq *r = arg;
    r->p_status = status;
}

static void p_on_body(struct up_leg *leg, const char *data, size_t len, void *arg)
{
    struct rreq *r = arg;
    if (evbuffer_get_length(r->pbuf) + len > (size_t)g_rt->cfg.max_response_bytes) {
        r->pleg = NULL;
        up_leg_cancel(leg);
        rreq_fail(r, RF_RESPONSE_TOO_LARGE, RT_PREFILL, r->p_idx, "response larger than --max-response-bytes");
        return;
    }
    evbuffer_add(r->pbuf, data, len);
}

/* Reads what the decode needs out of the prefill's JSON answer. 0, or -1 when it is not usable. */
static int absorb_prefill(struct rreq *r)
{
    size_t n = evbuffer_get_length(r->pbuf);
    struct rw_prefill_answer a;
    if (rw_absorb_prefill((const char *)evbuffer_pullup(r->pbuf, (ssize_t)n), n, &a) != 0)
        return -1;
    r->kv_params = a.kv_params;
    a.kv_params = NULL;
    if (a.prompt_tokens >= 0)
        r->prompt_tokens = a.prompt_tokens; /* exact, replaces the estimate */
    if (a.cached_tokens >= 0)
        r->cached_tokens = a.cached_tokens;
    r->resp_id = a.id;
    r->first_text = a.first_text;
    a.id = a.first_text = NULL;
    rw_prefill_answer_free(&a);
    return 0;
}

/* First-token-from-prefill: the client's first event(s), built from the prefill's answer. */
static void send_prefill_first_token(struct rreq *r)
{
    const char *model = NULL;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(r->body, "model");
    if (cJSON_IsString(m))
        model = m->valuestring;
    client_stream_start(r);
    cJSON *o = XPYD_XALLOC(cJSON_CreateObject());
    cJSON_AddStringToObject(o, "id", r->resp_id ? r->resp_id : r->xid);
    cJSON_AddStringToObject(o, "object", r->kind == RT_EP_CHAT ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)xpyd_wall_s());
    cJSON_AddStringToObject(o, "model", model ? model : "");
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (r->kind == RT_EP_CHAT) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        cJSON_AddStringToObject(d, "role", "assistant");
        cJSON_AddStringToObject(d, "content", "");
        cJSON_AddNullToObject(c, "logprobs");
        cJSON_AddNullToObject(c, "finish_reason");
        client_event_json(r, o);
        r->role_sent = 1;
        cJSON_DeleteItemFromObjectCaseSensitive(d, "role");
        cJSON_ReplaceItemInObjectCaseSensitive(d, "content", cJSON_CreateString(r->first_text ? r->first_text : ""));
    } else {
        cJSON_AddStringToObject(c, "text", r->first_text ? r->first_text : "");
        cJSON_AddNullToObject(c, "logprobs");
        cJSON_AddNullToObject(c, "finish_reason");
        cJSON_AddNullToObject(c, "stop_reason");
        cJSON_AddNullToObject(o, "usage");
    }
    client_event_json(r, o);
    cJSON_Delete(o);
    token_out(r);
}

static void p_on_done(struct up_leg *leg, int err, void *arg)
{
    struct rreq *r = arg;
    r->pleg = NULL;
    if (r->ended)
        return;
    int idx = r->p_idx;
    if (err || r->p_status >= 500)
        report_leg(RT_PREFILL, idx, 0);
    else if (r->p_status == 200)
        report_leg(RT_PREFILL, idx, 1);
    if (err || r->p_status >= 500) {
        char buf[200];
        if (may_retry(r, RT_PREFILL, err ? 0 : r->p_status)) {
            XLOG_INFO("msg=\"retrying prefill elsewhere\" request_id=%s err=%s status=%d", r->xid,
                      err ? err_text(err, buf, sizeof buf) : "-", r->p_status);
            release_prefill(r);
            if (idx >= 0 && (size_t)idx < 4096)
                atomic_fetch_add(&g_rt->ctr.instance_errors[RT_PREFILL][idx], 1);
            retry_later(r, RT_PREFILL, start_prefill);
            return;
        }
        if (err)
            rreq_fail(r, leg_fail_kind(RT_PREFILL, err, 0), RT_PREFILL, idx, err_text(err, buf, sizeof buf));
        else
            pass_through_error(r, RT_PREFILL, idx, r->p_status, r->pbuf);
        return;
    }
    if (r->p_status != 200) {
        pass_through_error(r, RT_PREFILL, idx, r->p_status, r->pbuf);
        return;
    }
    if (absorb_prefill(r) != 0) {
        rreq_fail(r, RF_PREFILL_BAD_RESPONSE, RT_PREFILL, idx, "the answer is not a JSON completion");
        return;
    }
    r->prefill_answered = 1;
    r->t_prefill_done = xpyd_now_us();
    rt_hist_observe(RT_H_PREFILL, (double)(r->t_prefill_done - r->t_leg[RT_PREFILL]) / 1e6);
    release_prefill(r);
    if (g_rt->cfg.first_token == RT_FIRST_PREFILL && r->stream)
        send_prefill_first_token(r);
    start_decode(r);
}

static void start_prefill(struct rreq *r)
{
    int idx = pick(r, RT_PREFILL, r->prompt_tokens, start_prefill);
    if (idx < 0)
        return;
    r->p_idx = idx;
    r->p_charge = r->prompt_tokens;
    r->p_status = 0;
    r->retry_after[0] = 0;
    if (r->pbuf)
        evbuffer_drain(r->pbuf, evbuffer_get_length(r->pbuf));
    else
        r->pbuf = XPYD_XALLOC(evbuffer_new());
    size_t len;
    char *body = prefill_body(r, &len);
    struct evbuffer *req = build_request(r, RT_PREFILL, idx, "POST", ep_name(r->kind), body, len);
    free(body);
    static const struct up_leg_cbs cbs = {p_on_head, p_on_body, p_on_done, NULL, on_retry_after};
    r->pleg = up_leg_start(r->t->up, endpoint_of(RT_PREFILL, idx), req, timeouts(), &cbs, r);
    evbuffer_free(req);
    if (!r->pleg)
        rreq_fail(r, RF_PREFILL_CONNECT, RT_PREFILL, idx, "out of memory");
}

/* ---------- decode leg ---------- */

/* Replaces the usage's cached_tokens with the prefill's (non-streamed answers). Returns 1 when o changed. */
static int patch_usage(struct rreq *r, cJSON *o)
{
    return r->prefill_answered ? rw_patch_usage(o, r->cached_tokens) : 0;
}

static void fire_clones(struct rreq *r);

/* The decode produced one more token: its load falls by one, down to the KV part it still holds. */
static void decode_token_done(struct rreq *r)
{
    if (r->d_charge > r->prompt_tokens) {
        xb_adjust(g_rt->pools[RT_DECODE], r->d_idx, -1);
        r->d_charge--;
    }
}

/* A content event is going to the client: count it and record the inter-token gap. */
static void token_out(struct rreq *r)
{
    uint64_t now = xpyd_now_us();
    if (r->t_last_tok)
        rt_hist_observe(RT_H_ITL, (double)(now - r->t_last_tok) / 1e6);
    r->t_last_tok = now;
    r->tokens_out++;
}

/* One decode SSE event: relay.c decides (forward, rewrite, drop); here the side effects happen. */
static int on_decode_event(void *arg, const char *data, size_t len, const char *raw, size_t rawlen)
{
    struct rreq *r = arg;
    struct relay_state st = {g_rt->cfg.first_token == RT_FIRST_PREFILL, r->prefill_answered, r->cached_tokens,
                             r->first_text, r->resp_id, r->role_sent, r->first_dropped, r->done_seen};
    struct relay_out out;
    relay_event(&st, data, len, &out);
    r->role_sent = st.role_sent;
    r->first_dropped = st.first_dropped;
    r->done_seen = st.done_seen;
    if (out.mismatch)
        atomic_fetch_add(&g_rt->ctr.first_token_mismatch, 1);
    if (out.action == RELAY_DROP)
        return 0;
    if (out.token_out)
        token_out(r);
    if (out.content)
        decode_token_done(r);
    client_stream_start(r);
    if (out.action == RELAY_REWRITE) {
        client_event_json(r, out.json);
        cJSON_Delete(out.json);
    } else {
        client_write(r, raw, rawlen);
    }
    if (out.content && !r->clones_fired)
        fire_clones(r);
    return 0;
}

static void d_on_head(struct up_leg *leg, int status, void *arg)
{
    struct rreq *r = arg;
    r->d_status = status;
    if (status == 200)
        r->decode_accepted = 1;
}

/* Either leg: an engine's Retry-After (kept for a 429/503 passed through to the client). */
static void on_retry_after(struct up_leg *leg, const char *name, const char *value, void *arg)
{
    struct rreq *r = arg;
    if (strcasecmp(name, "Retry-After") == 0 && strlen(value) < sizeof r->retry_after && !strpbrk(value, "\r\n"))
        snprintf(r->retry_after, sizeof r->retry_after, "%s", value);
}

/* xpyd handoff: the decode says how long its KV transfer took and how many bytes it moved. */
static void d_on_header(struct up_leg *leg, const char *name, const char *value, void *arg)
{
    on_retry_after(leg, name, value, arg);
    if (strcasecmp(name, "X-KV-Transfer") != 0)
        return;
    unsigned long long bytes = 0, us = 0;
    if (sscanf(value, "bytes=%llu; us=%llu", &bytes, &us) == 2) {
        atomic_fetch_add(&g_rt->ctr.kv_bytes, bytes);
        rt_hist_observe(RT_H_KV_HANDOFF, (double)us / 1e6);
    }
}

static void d_on_body(struct up_leg *leg, const char *data, size_t len, void *arg)
{
    struct rreq *r = arg;
    if (r->d_status == 200 && r->stream) {
        int rc = xpyd_sse_feed(&r->sse, data, len, on_decode_event, r);
        if (rc < 0) {
            r->dleg = NULL;
            up_leg_cancel(leg);
            rreq_fail(r, RF_DECODE_BROKEN_STREAM, RT_DECODE, r->d_idx, "an SSE event exceeded the size limit");
        }
        return;
    }
    if (evbuffer_get_length(r->dbuf) + len > (size_t)g_rt->cfg.max_response_bytes) {
        r->dleg = NULL;
        up_leg_cancel(leg);
        rreq_fail(r, RF_RESPONSE_TOO_LARGE, RT_DECODE, r->d_idx, "response larger than --max-response-bytes");
        return;
    }
    evbuffer_add(r->dbuf, data, len);
}

/* Non-streamed decode answer: patch usage, send. */
static void finish_non_stream(struct rreq *r)
{
    size_t n = evbuffer_get_length(r->dbuf);
    const char *data = (const char *)evbuffer_pullup(r->dbuf, (ssize_t)n);
    cJSON *o = cJSON_ParseWithLength(data, n);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        rreq_fail(r, RF_DECODE_BROKEN_STREAM, RT_DECODE, r->d_idx, "the answer is not JSON");
        return;
    }
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, "usage"), "completion_tokens");
    if (cJSON_IsNumber(ct) && ct->valuedouble >= 0 && ct->valuedouble <= 1e12) /* range first: no UB cast */
        r->tokens_out = (int64_t)ct->valuedouble;
    cJSON_DeleteItemFromObjectCaseSensitive(o, "kv_transfer_params");
    patch_usage(r, o);
    size_t len;
    char *s = print_json(o, &len);
    cJSON_Delete(o);
    r->t_first = xpyd_now_us();
    send_json(r, 200, s, len);
    free(s);
    rreq_end(r, RF_NONE);
}

static void d_on_done(struct up_leg *leg, int err, void *arg)
{
    struct rreq *r = arg;
    r->dleg = NULL;
    if (r->ended)
        return;
    int idx = r->d_idx;
    char buf[200];
    if (!err && r->d_status == 200)
        rt_hist_observe(RT_H_DECODE, (double)(xpyd_now_us() - r->t_leg[RT_DECODE]) / 1e6);
    if (err || r->d_status >= 500 || (r->d_status == 200 && r->stream && !r->done_seen))
        report_leg(RT_DECODE, idx, 0);
    else if (r->d_status == 200)
        report_leg(RT_DECODE, idx, 1);
    if (!err && r->d_status == 200) {
        if (!r->stream) {
            finish_non_stream(r);
            return;
        }
        if (r->done_seen) {
            client_stream_end(r);
            rreq_end(r, RF_NONE);
            return;
        }
        err = -ECONNRESET; /* a stream that ended without [DONE] is broken */
    }
    int status = err ? 0 : r->d_status;
    if ((err || status >= 500) && may_retry(r, RT_DECODE, status)) {
        XLOG_INFO("msg=\"retrying decode elsewhere\" request_id=%s err=%s status=%d", r->xid,
                  err ? err_text(err, buf, sizeof buf) : "-", status);
        if (idx >= 0 && (size_t)idx < 4096)
            atomic_fetch_add(&g_rt->ctr.instance_errors[RT_DECODE][idx], 1);
        release_decode(r);
        xpyd_sse_reset(&r->sse);
        /* bootstrap: a fresh room and both legs again */
        retry_later(r, RT_DECODE, g_rt->cfg.handoff == RT_HANDOFF_BOOTSTRAP ? start_bootstrap : start_decode);
        return;
    }
    if (err) {
        int fail = r->client_started ? RF_DECODE_BROKEN_STREAM : leg_fail_kind(RT_DECODE, err, 0);
        rreq_fail(r, fail, RT_DECODE, idx, err_text(err, buf, sizeof buf));
        return;
    }
    pass_through_error(r, RT_DECODE, idx, status, r->dbuf);
}

static void start_decode(struct rreq *r)
{
    int64_t charge = r->prompt_tokens + r->max_tokens; /* KV held + tokens still to generate */
    int idx = pick(r, RT_DECODE, charge, start_decode);
    if (idx < 0)
        return;
    r->d_idx = idx;
    r->d_charge = charge;
    r->d_status = 0;
    r->retry_after[0] = 0;
    if (r->dbuf)
        evbuffer_drain(r->dbuf, evbuffer_get_length(r->dbuf));
    else
        r->dbuf = XPYD_XALLOC(evbuffer_new());
    size_t len;
    char *body = decode_body(r, &len);
    struct evbuffer *req = build_request(r, RT_DECODE, idx, "POST", ep_name(r->kind), body, len);
    free(body);
    static const struct up_leg_cbs cbs = {d_on_head, d_on_body, d_on_done, NULL, d_on_header};
    r->dleg = up_leg_start(r->t->up, endpoint_of(RT_DECODE, idx), req, timeouts(), &cbs, r);
    evbuffer_free(req);
    if (!r->dleg)
        rreq_fail(r, RF_DECODE_CONNECT, RT_DECODE, idx, "out of memory");
}

/* ---------- benchmark repeat mode ---------- */

static void clone_done(struct up_leg *leg, int err, void *arg)
{
    struct clone *c = arg;
    xb_release(g_rt->pools[RT_DECODE], c->d_idx, c->charge);
    free(c);
}

/* Warm-up rule: clones start when the measured request's decode produced its first token, so its KV is in
 * the store for them and they do not compete with the measured TTFT. */
static void fire_clones(struct rreq *r)
{
    r->clones_fired = 1;
    if (g_rt->cfg.repeat_d_times <= 0)
        return;
    size_t len;
    char *body = decode_body(r, &len);
    static const struct up_leg_cbs cbs = {NULL, NULL, clone_done, NULL, NULL};
    for (int i = 0; i < g_rt->cfg.repeat_d_times; i++) {
        int64_t charge = r->prompt_tokens + r->max_tokens;
        int idx = xb_pick(g_rt->pools[RT_DECODE], (uint64_t)charge, charge, NULL, 0);
        if (idx < 0)
            break;
        struct clone *c = XPYD_XALLOC(calloc(1, sizeof *c));
        c->d_idx = idx;
        c->charge = charge;
        struct evbuffer *req = build_request(r, RT_DECODE, idx, "POST", ep_name(r->kind), body, len);
        c->leg = up_leg_start(r->t->up, endpoint_of(RT_DECODE, idx), req, timeouts(), &cbs, c);
        evbuffer_free(req);
        if (!c->leg) {
            xb_release(g_rt->pools[RT_DECODE], idx, charge);
            free(c);
            break;
        }
        atomic_fetch_add(&g_rt->ctr.repeat_clones, 1);
    }
    free(body);
}

/* ---------- bootstrap (SGLang): both legs at once ---------- */

static void abort_done(struct up_leg *leg, int err, void *arg)
{
}

/* Tells a decode to drop request rid (SGLang's /abort_request); fire and forget. */
static void send_abort(struct rreq *r, int d_idx)
{
    char body[300];
    int n = snprintf(body, sizeof body, "{\"rid\":\"%s\"}", r->xid);
    struct evbuffer *req = build_request(r, RT_DECODE, d_idx, "POST", "/abort_request", body, (size_t)n);
    static const struct up_leg_cbs cbs = {NULL, NULL, abort_done, NULL, NULL};
    up_leg_start(r->t->up, endpoint_of(RT_DECODE, d_idx), req, timeouts(), &cbs, NULL);
    evbuffer_free(req);
}

static void bp_on_done(struct up_leg *leg, int err, void *arg)
{
    struct rreq *r = arg;
    r->pleg = NULL;
    if (r->ended)
        return;
    int ok = !err && r->p_status == 200;
    int pidx = r->p_idx;
    if (ok || err || r->p_status >= 500)
        report_leg(RT_PREFILL, pidx, ok);
    release_prefill(r);
    if (ok) {
        r->prefill_answered = 1;
        return; /* its answer is drained; the decode's stream is the client's */
    }
    /* The prefill failed: the decode would wait for KV that never comes. Abort it, then retry or fail.
     * /abort_request may overtake the decode's own request (another connection) and find nothing, so the
     * decode leg is also finished being written and then closed: the engine sees the request and its
     * cancellation, whichever arrives first. */
    if (r->d_idx >= 0)
        send_abort(r, r->d_idx);
    if (r->dleg) {
        up_leg_cancel_after_send(r->dleg);
        r->dleg = NULL;
    }
    release_decode(r);
    xpyd_sse_reset(&r->sse);
    char buf[200];
    if (may_retry(r, RT_PREFILL, err ? 0 : r->p_status)) {
        retry_later(r, RT_PREFILL, start_bootstrap);
        return;
    }
    if (err)
        rreq_fail(r, leg_fail_kind(RT_PREFILL, err, 0), RT_PREFILL, pidx, err_text(err, buf, sizeof buf));
    else
        pass_through_error(r, RT_PREFILL, pidx, r->p_status, r->pbuf);
}

static void start_bootstrap(struct rreq *r)
{
    int pidx = pick(r, RT_PREFILL, r->prompt_tokens, start_bootstrap);
    if (pidx < 0)
        return;
    r->p_idx = pidx;
    r->p_charge = r->prompt_tokens;
    int64_t charge = r->prompt_tokens + r->max_tokens;
    int didx = pick(r, RT_DECODE, charge, start_bootstrap);
    if (didx < 0) {
        if (r->queued_role >= 0) { /* waiting for a decode: give the prefill back, pick both again later */
            release_prefill(r);
            r->ntried[RT_PREFILL]--;
            r->attempts[RT_PREFILL]--;
        }
        return;
    }
    r->d_idx = didx;
    r->d_charge = charge;
    r->p_status = r->d_status = 0;
    r->retry_after[0] = 0;
    if (!r->pbuf)
        r->pbuf = XPYD_XALLOC(evbuffer_new());
    if (!r->dbuf)
        r->dbuf = XPYD_XALLOC(evbuffer_new());
    evbuffer_drain(r->pbuf, evbuffer_get_length(r->pbuf));
    evbuffer_drain(r->dbuf, evbuffer_get_length(r->dbuf));
    /* A fresh 63-bit room per attempt; with internal DP on the prefill, room % dp picks the rank. */
    const struct rt_rank *prank = &g_rt->cfg.ranks[RT_PREFILL][pidx];
    r->t->rng = xpyd_mix64(r->t->rng);
    uint64_t room = r->t->rng >> 1;
    if (prank->dp_rank >= 0) {
        uint64_t dp = (uint64_t)g_rt->cfg.pools[RT_PREFILL].dp;
        room = room / dp * dp + (uint64_t)prank->dp_rank;
    }
    r->room = room;
    const struct up_endpoint *pe = &g_rt->endpoints[prank->endpoint];
    size_t len;
    char *body = rw_bootstrap_body(r->src, pe->host, prank->bootstrap_port, room, r->xid, &len);
    struct evbuffer *preq = build_request(r, RT_PREFILL, pidx, "POST", ep_name(r->kind), body, len);
    struct evbuffer *dreq = build_request(r, RT_DECODE, didx, "POST", ep_name(r->kind), body, len);
    free(body);
    static const struct up_leg_cbs pcbs = {p_on_head, p_on_body, bp_on_done, NULL, on_retry_after};
    static const struct up_leg_cbs dcbs = {d_on_head, d_on_body, d_on_done, NULL, on_retry_after};
    r->pleg = up_leg_start(r->t->up, endpoint_of(RT_PREFILL, pidx), preq, timeouts(), &pcbs, r);
    r->dleg = up_leg_start(r->t->up, endpoint_of(RT_DECODE, didx), dreq, timeouts(), &dcbs, r);
    evbuffer_free(preq);
    evbuffer_free(dreq);
    if (!r->pleg || !r->dleg)
        rreq_fail(r, RF_PREFILL_CONNECT, RT_PREFILL, pidx, "out of memory");
}

/* ---------- entry ---------- */

/* The access-log line of a request rejected before it got a request object. */
static void access_log_rejected(evhtp_request_t *req, int kind, int status, int fail)
{
    if (!g_rt->cfg.access_log)
        return;
    const char *xid = evhtp_header_find(req->headers_in, "X-Request-Id");
    if (!xid || strpbrk(xid, "\r\n\"\\") || strlen(xid) > 120)
        xid = "-";
    if (g_rt->cfg.access_log == 2)
        fprintf(stderr,
                "{\"request_id\":\"%s\",\"endpoint\":\"%s\",\"prefill\":\"-\",\"decode\":\"-\",\"status\":%d,"
                "\"stream\":false,\"prompt_tokens\":0,\"output_tokens\":0,\"ttft_s\":-1,\"total_s\":0,"
                "\"error\":\"%s\"}\n",
                xid, ep_name(kind), status, rt_fail_table[fail].name);
    else
        fprintf(stderr,
                "access request_id=%s endpoint=%s prefill=- decode=- status=%d stream=0 prompt_tokens=0 "
                "output_tokens=0 ttft_s=-1 total_s=0 error=%s\n",
                xid, ep_name(kind), status, rt_fail_table[fail].name);
}

/* 128 random bits: unique across router processes and restarts, so replicas sharing engines never send the
 * same X-Request-Id (vLLM's request id). */
static void new_request_id(char *out, size_t cap)
{
    uint64_t v[2];
    if (getrandom(v, sizeof v, 0) != (ssize_t)sizeof v) { /* never on Linux >= 3.17 for 16 bytes; still unique */
        v[0] = xpyd_mix64(atomic_fetch_add(&g_rt->id_seq, 1) ^ xpyd_now_us());
        v[1] = xpyd_mix64((uint64_t)getpid() ^ ((uint64_t)g_rt->started_wall << 20) ^ (uint64_t)(uintptr_t)out);
    }
    snprintf(out, cap, "%s-%016" PRIx64 "%016" PRIx64, g_rt->cfg.id_prefix, v[0], v[1]);
}

static void handle_generate(evhtp_request_t *req, int kind)
{
    struct rthread *t = tls_rt;
    if (!rt_authorized(req)) {
        atomic_fetch_add(&g_rt->ctr.requests[kind][401], 1);
        access_log_rejected(req, kind, 401, RF_BAD_REQUEST);
        return;
    }
    if (!rt_method_allowed(req, "POST")) {
        atomic_fetch_add(&g_rt->ctr.errors[RF_BAD_REQUEST], 1);
        atomic_fetch_add(&g_rt->ctr.requests[kind][405], 1);
        access_log_rejected(req, kind, 405, RF_BAD_REQUEST);
        return;
    }
    if (atomic_load(&g_rt->draining)) {
        rt_close_after_reply(req);
        rt_reply_error(req, 503, "the router is shutting down (draining): retry on another router");
        atomic_fetch_add(&g_rt->ctr.requests[kind][503], 1);
        access_log_rejected(req, kind, 503, RF_NONE);
        return;
    }
    size_t len = evbuffer_get_length(req->buffer_in);
    if (len > (size_t)g_rt->cfg.max_body_bytes || evhtp_header_find(req->headers_in, XPYD_TOO_LARGE_HEADER)) {
        char msg[160];
        snprintf(msg, sizeof msg, "request body exceeds the limit of %ld bytes (--max-body-bytes)",
                 g_rt->cfg.max_body_bytes);
        rt_reply_error(req, 413, msg);
        atomic_fetch_add(&g_rt->ctr.errors[RF_BODY_TOO_LARGE], 1);
        atomic_fetch_add(&g_rt->ctr.requests[kind][413], 1);
        access_log_rejected(req, kind, 413, RF_BODY_TOO_LARGE);
        return;
    }
    const char *data = len ? (const char *)evbuffer_pullup(req->buffer_in, -1) : "";
    const char *why = NULL;
    size_t err_at = 0;
    cJSON *body = NULL;
    /* strict JSON (trailing data refused); duplicated keys: the last wins, as the engines (Python json) read */
    struct rw_src *src = rw_src_parse(data, len, &body, &why, &err_at);
    int stream = 0;
    int64_t max_tokens = 0;
    const char *bad = body ? rw_validate(body, kind == RT_EP_CHAT, &stream, &max_tokens) : NULL;
    if (!body || bad) {
        char msg[200];
        if (!body)
            snprintf(msg, sizeof msg, "malformed JSON body: %s (near byte %zu)", why, err_at);
        rt_reply_error(req, 400, body ? bad : msg);
        cJSON_Delete(body);
        rw_src_free(src);
        atomic_fetch_add(&g_rt->ctr.errors[RF_BAD_REQUEST], 1);
        atomic_fetch_add(&g_rt->ctr.requests[kind][400], 1);
        access_log_rejected(req, kind, 400, RF_BAD_REQUEST);
        return;
    }
    struct rreq *r = XPYD_XALLOC(calloc(1, sizeof *r));
    r->queued_role = -1;
    r->t = t;
    r->ereq = req;
    r->kind = kind;
    r->body = body;
    r->src = src;
    r->stream = stream;
    r->max_tokens = max_tokens;
    r->p_idx = r->d_idx = -1;
    r->last_idx[0] = r->last_idx[1] = -1;
    r->cached_tokens = -1;
    r->t_start = xpyd_now_us();
    r->sse.max_event = 4u << 20;
    r->prompt_tokens = rw_estimate_prompt(body, kind == RT_EP_CHAT, g_rt->cfg.bytes_per_token);
    const char *xid = evhtp_header_find(req->headers_in, "X-Request-Id");
    if (xid && *xid && strlen(xid) < sizeof r->xid && !strpbrk(xid, "\r\n\"\\"))
        snprintf(r->xid, sizeof r->xid, "%s", xid); /* vLLM uses the client's id too */
    else
        new_request_id(r->xid, sizeof r->xid);
    struct evbuffer *hb = XPYD_XALLOC(evbuffer_new());
    evhtp_kvs_for_each(req->headers_in, collect_header, hb);
    size_t hl = evbuffer_get_length(hb);
    if (hl) {
        r->fwd_headers = XPYD_XALLOC(malloc(hl + 1));
        evbuffer_remove(hb, r->fwd_headers, hl);
        r->fwd_headers[hl] = '\0';
    }
    evbuffer_free(hb);
    atomic_fetch_add(&g_rt->ctr.active_requests, 1);
    rt_client_set_owner(req, on_request_fini, r);
    evhtp_connection_t *conn = evhtp_request_get_connection(req);
    evhtp_request_pause(req);
    /* libevhtp's pause turns EV_WRITE off too: without it a stream stalls once the client's socket fills */
    bufferevent_enable(evhtp_connection_get_bev(conn), EV_WRITE);
    evutil_socket_t fd = bufferevent_getfd(evhtp_connection_get_bev(conn));
    r->close_ev = event_new(t->base, fd, EV_CLOSED, on_client_closed, r);
    if (r->close_ev)
        event_add(r->close_ev, NULL);
    if (g_rt->cfg.handoff == RT_HANDOFF_BOOTSTRAP)
        start_bootstrap(r);
    else if (g_rt->cfg.handoff == RT_HANDOFF_NONE)
        start_decode(r);
    else
        start_prefill(r);
}

static void on_completions(evhtp_request_t *req, void *arg)
{
    handle_generate(req, RT_EP_COMPLETIONS);
}

static void on_chat(evhtp_request_t *req, void *arg)
{
    handle_generate(req, RT_EP_CHAT);
}

/* ---------- /v1/models: a healthy backend's answer ---------- */

struct models_req {
    evhtp_request_t *ereq;
    int status;
    struct evbuffer *body;
    int tries;
};

static void models_try(struct models_req *m);

static void models_fini(void *arg)
{
    struct models_req *m = arg;
    m->ereq = NULL;
}

static void m_head(struct up_leg *leg, int status, void *arg)
{
    ((struct models_req *)arg)->status = status;
}

static void m_body(struct up_leg *leg, const char *data, size_t len, void *arg)
{
    struct models_req *m = arg;
    if (evbuffer_get_length(m->body) < (1u << 20))
        evbuffer_add(m->body, data, len);
}

static void m_done(struct up_leg *leg, int err, void *arg)
{
    struct models_req *m = arg;
    if (!m->ereq) {
        evbuffer_free(m->body);
        free(m);
        return;
    }
    if ((err || m->status != 200) && m->tries < (int)g_rt->cfg.n_ranks[RT_DECODE] + (int)g_rt->cfg.n_ranks[RT_PREFILL]) {
        models_try(m);
        return;
    }
    evhtp_request_t *req = m->ereq;
    rt_client_set_owner(req, NULL, NULL);
    if (err || m->status != 200)
        rt_reply_error(req, 502, "no backend answered GET /v1/models");
    else
        rt_reply_buffer(req, 200, "application/json", m->body);
    evhtp_request_resume(req);
    evbuffer_free(m->body);
    free(m);
}

static void models_try(struct models_req *m)
{
    /* decode ranks first, then prefill ranks, healthy ones only */
    int total = (int)(g_rt->cfg.n_ranks[RT_DECODE] + g_rt->cfg.n_ranks[RT_PREFILL]);
    while (m->tries < total) {
        int k = m->tries++;
        int role = k < (int)g_rt->cfg.n_ranks[RT_DECODE] ? RT_DECODE : RT_PREFILL;
        int idx = role == RT_DECODE ? k : k - (int)g_rt->cfg.n_ranks[RT_DECODE];
        struct xb_instance_stats st;
        if (xb_stats(g_rt->pools[role], idx, &st) != 0 || !st.healthy || st.removed)
            continue;
        const struct up_endpoint *ep = &g_rt->endpoints[endpoint_of(role, idx)];
        struct evbuffer *req = XPYD_XALLOC(evbuffer_new());
        up_request_line(req, ep, "GET", "/v1/models");
        const char *auth = evhtp_header_find(m->ereq->headers_in, "Authorization");
        if (auth && !strpbrk(auth, "\r\n"))
            evbuffer_add_printf(req, "Authorization: %s\r\n", auth);
        evbuffer_add_printf(req, "\r\n");
        evbuffer_drain(m->body, evbuffer_get_length(m->body));
        m->status = 0;
        static const struct up_leg_cbs cbs = {m_head, m_body, m_done, NULL, NULL};
        struct up_leg *leg = up_leg_start(tls_rt->up, endpoint_of(role, idx), req, timeouts(), &cbs, m);
        evbuffer_free(req);
        if (leg)
            return;
    }
    m->tries = total;
    m_done(NULL, -ENOENT, m);
}

static void on_models(evhtp_request_t *req, void *arg)
{
    if (!rt_authorized(req) || !rt_method_allowed(req, "GET, HEAD"))
        return;
    struct models_req *m = XPYD_XALLOC(calloc(1, sizeof *m));
    m->ereq = req;
    m->body = XPYD_XALLOC(evbuffer_new());
    rt_client_set_owner(req, models_fini, m);
    evhtp_request_pause(req);
    models_try(m);
}

/* ---------- thread state ---------- */

struct rthread *rt_thread_new(struct event_base *base)
{
    struct rthread *t = XPYD_XALLOC(calloc(1, sizeof *t));
    t->base = base;
    t->rng = xpyd_mix64((uint64_t)(uintptr_t)t ^ xpyd_now_us());
    t->up = up_thread_new_shared(base, g_rt->endpoints, g_rt->ep_cap, (size_t)g_rt->cfg.upstream_idle_max);
    if (!t->up)
        abort();
    t->kick_role = -1;
    t->kick = XPYD_XALLOC(event_new(base, -1, 0, on_kick, t));
    pthread_mutex_lock(&threads_mu);
    t->next_thread = all_threads;
    all_threads = t;
    pthread_mutex_unlock(&threads_mu);
    tls_rt = t;
    return t;
}

void rt_thread_free(struct rthread *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&threads_mu);
    for (struct rthread **pp = &all_threads; *pp; pp = &(*pp)->next_thread)
        if (*pp == t) {
            *pp = t->next_thread;
            break;
        }
    pthread_mutex_unlock(&threads_mu);
    event_free(t->kick);
    up_thread_free(t->up);
    free(t);
}

void rt_status_handlers(evhtp_t *htp);

void rt_install_handlers(evhtp_t *htp)
{
    evhtp_set_cb(htp, "/v1/completions", on_completions, NULL);
    evhtp_set_cb(htp, "/v1/chat/completions", on_chat, NULL);
    evhtp_set_cb(htp, "/v1/models", on_models, NULL);
    rt_status_handlers(htp);
    rt_admin_handlers(htp);
    rt_metadata_handlers(htp);
}
