/* sim_server.c - xpyd_sim's HTTP server, scheduler, handoff legs, faults and metrics.
 *
 * One process, one event loop. Each DP rank has its own scheduler (max_batch running slots and a FIFO of
 * waiting requests). A request (struct sreq) lives from the moment its body is validated until libevhtp frees
 * the underlying evhtp request (the request_fini hook), which is the single place a sreq is freed. Every
 * other path (done, error, abort, client disconnect) goes through sreq_release(), which is idempotent and
 * returns the slot, cancels timers and pulls, and counts what happened. */
#include "sim.h"
#include "sim_lease.h"
#include "xpyd_transfer.h"
#include "sim_request.h"
#include "sim_tokens.h"

#include "xpyd_oai.h"
#include "xpyd_sse.h"
#include "xpyd_util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/listener.h>
#include <netinet/in.h>
#include <evhtp/evhtp.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

enum sreq_state { SREQ_NONE = 0, SREQ_STALLED, SREQ_WAITING, SREQ_HANDOFF, SREQ_PREFILL, SREQ_DECODE, SREQ_DONE };

enum { HO_DONE = 0, HO_FAILED, HO_RECOMPUTED, HO_NRESULTS };
static const char *const ho_result_names[] = {"done", "failed", "recomputed"};

struct sim;

struct sim_rank {
    struct sim *sim;
    int idx;
    evhtp_t *htp; /* external DP: this rank's own server; internal: NULL (rank 0 owns sim->htp) */
    char engine_id[128];
    int port;             /* the port this rank is reached on */
    long running;
    TAILQ_HEAD(, sreq) waiting;
    long waiting_n;
    uint64_t kv_tokens_running; /* prompt + generated tokens of running requests */
    uint64_t next_block;
    /* counters */
    uint64_t prompt_tokens_total, generation_tokens_total, requests_total, success_total, aborted_total;
};

struct sim {
    struct sim_config cfg;
    struct event_base *base;
    evhtp_t *htp;            /* internal DP (or dp 1): the one server */
    evhtp_t *bootstrap_htp;  /* optional separate bootstrap listener */
    struct sim_rank *ranks;
    int nranks;
    struct sim_lease_table leases;
    LIST_HEAD(, sreq) all;
    struct event *sweep_ev;
    struct event *sig_int, *sig_term;
    char model_json[300];    /* model name, JSON-escaped without quotes */
    uint64_t rng;
    uint64_t seq;
    /* counters */
    uint64_t handoffs[5][HO_NRESULTS]; /* [handoff mode][result] */
    /* xpyd handoff: this engine's libxpyd_transfer engine, peers opened, notifications polled */
    xt_engine *xt;
    struct event *xt_ev;     /* the engine's event fd: a read finished or a notification arrived */
    struct xpull *pulls;     /* reads in flight (decode side) */
    uint64_t xt_releases;
    uint64_t leases_created, leases_released, leases_expired, leases_aborted;
    uint64_t kv_bytes_sent, kv_bytes_received;
    uint64_t faults_fail_rate, faults_status, faults_disconnect, faults_stall;
    uint64_t aborts_requested;
    uint64_t abort_calls; /* POST /abort_request received, whether or not it found its request */
    uint64_t release_notices, leases_cancelled;
};

struct sreq {
    struct sim *sim;
    struct sim_rank *rank;
    evhtp_request_t *ereq;  /* NULL once libevhtp has freed it */
    struct sim_params p;
    char id[200];           /* request id (X-Request-Id or generated) */
    char id_json[220];      /* "cmpl-<id>" or "chatcmpl-<id>", JSON-safe */
    int64_t created;
    int state;
    int in_slot;
    int stream_started;
    int aborted;
    int ho_mode;            /* index into sim->handoffs for the pull this request does */
    long cached_tokens;
    size_t pos;             /* tokens generated so far */
    uint64_t next_due_us;   /* absolute deadline of the next token, so ITL does not drift */
    const char *finish_reason;
    struct event *timer;
    struct event *close_ev;
    struct evbuffer *text;  /* non-stream: generated text */
    struct evhttp_connection *pull_conn;
    struct evhttp_request *pull_req;
    uint64_t deadline_us;
    char lease_key[240];    /* prefill: the lease created for this request */
    struct xpull *xp;       /* decode, xpyd handoff: the read in flight (outlives the request if aborted) */
    uint64_t kv_xfer_bytes, kv_xfer_us; /* decode, xpyd: what the transfer moved and took (X-KV-Transfer) */
    cJSON *kv_out;          /* prefill: kv_transfer_params to return */
    TAILQ_ENTRY(sreq) wq;
    LIST_ENTRY(sreq) all;
};

static void sreq_start(struct sreq *r);
static void sreq_tick(evutil_socket_t fd, short ev, void *arg);
static void sreq_fail(struct sreq *r, int status, const char *msg);
static void sreq_release(struct sreq *r);
static void notify_release(struct sreq *r);
static void lease_drop(struct sim *s, struct sim_lease *l);
static void kv_transfer_header(struct sreq *r);

struct xpull {
    struct sim *sim;
    struct sreq *r;         /* NULL once the request went away (the read still has to finish) */
    xt_batch batch;
    xt_segment seg;
    unsigned char *buf;     /* registered with the engine while the read runs */
    size_t len;
    uint64_t t0;
    char key[240];
    struct xpull *next;
};


/* ---------- helpers ---------- */

static uint64_t sim_rand(struct sim *s)
{
    s->rng = xpyd_mix64(s->rng);
    return s->rng;
}

static void json_escape_into(const char *in, char *out, size_t cap)
{
    cJSON *str = XPYD_XALLOC(cJSON_CreateString(in));
    char *q = XPYD_XALLOC(cJSON_PrintUnformatted(str));
    size_t n = strlen(q);
    if (n >= 2) { /* strip the quotes */
        q[n - 1] = '\0';
        snprintf(out, cap, "%s", q + 1);
    }
    free(q);
    cJSON_Delete(str);
}

static void add_header(evhtp_request_t *req, const char *k, const char *v)
{
    evhtp_headers_add_header(req->headers_out, evhtp_header_new(k, v, 0, 1));
}

/* Sends a complete response (not for paused requests: see sreq_reply). */
static void reply_raw(evhtp_request_t *req, int status, const char *ctype, const char *body, size_t len)
{
    add_header(req, "Content-Type", ctype);
    if (len)
        evbuffer_add(req->buffer_out, body, len);
    evhtp_send_reply(req, (evhtp_res)status);
}

static void reply_error(evhtp_request_t *req, int status, const char *msg)
{
    char *body = xpyd_oai_error_json(status, NULL, msg, NULL);
    reply_raw(req, status, "application/json", body, strlen(body));
    free(body);
}

static int is_post(evhtp_request_t *req)
{
    return evhtp_request_get_method(req) == htp_method_POST;
}

static const char *body_of(evhtp_request_t *req, size_t *len)
{
    *len = evbuffer_get_length(req->buffer_in);
    return *len ? (const char *)evbuffer_pullup(req->buffer_in, -1) : "";
}

static struct timeval us_to_tv(uint64_t us)
{
    struct timeval tv = {(time_t)(us / 1000000u), (suseconds_t)(us % 1000000u)};
    return tv;
}

/* ---------- request lifecycle ---------- */

static evhtp_res on_request_fini(evhtp_request_t *req, void *arg)
{
    struct sreq *r = arg;
    r->ereq = NULL;
    if (r->state != SREQ_DONE) { /* the client went away before we answered */
        r->aborted = 1;
        sreq_release(r);
    }
    LIST_REMOVE(r, all);
    sim_params_free(&r->p);
    if (r->text)
        evbuffer_free(r->text);
    cJSON_Delete(r->kv_out);
    free(r);
    return EVHTP_RES_OK;
}

static void on_client_closed(evutil_socket_t fd, short ev, void *arg)
{
    struct sreq *r = arg;
    event_free(r->close_ev);
    r->close_ev = NULL;
    if (r->state == SREQ_DONE || !r->ereq)
        return;
    r->aborted = 1;
    sreq_release(r);
    /* Let libevhtp see the EOF itself; it frees the connection and calls on_request_fini. */
    evhtp_connection_t *c = evhtp_request_get_connection(r->ereq);
    evhtp_connection_free(c);
}

/* Whether a request with a prompt of n tokens may start now: a free slot, and room for its KV (a request
 * alone on the rank always fits, as an engine would preempt the rest for it). */
static int rank_has_room(const struct sim_rank *rk, size_t n)
{
    const struct sim_config *c = &rk->sim->cfg;
    if (rk->running >= c->max_batch)
        return 0;
    return c->kv_capacity_tokens <= 0 || rk->running == 0 ||
           rk->kv_tokens_running + n <= (uint64_t)c->kv_capacity_tokens;
}

static void pump_waiting(struct sim_rank *rk)
{
    while (!TAILQ_EMPTY(&rk->waiting) && rank_has_room(rk, TAILQ_FIRST(&rk->waiting)->p.prompt.n)) {
        struct sreq *w = TAILQ_FIRST(&rk->waiting);
        TAILQ_REMOVE(&rk->waiting, w, wq);
        rk->waiting_n--;
        sreq_start(w);
    }
}

static void free_pull_conn_cb(evutil_socket_t fd, short ev, void *arg)
{
    evhttp_connection_free(arg);
}

static void pull_cancel(struct sreq *r)
{
    if (r->pull_req) {
        evhttp_cancel_request(r->pull_req);
        r->pull_req = NULL;
    }
    if (r->pull_conn) {
        struct timeval zero = {0, 0};
        event_base_once(r->sim->base, -1, EV_TIMEOUT, free_pull_conn_cb, r->pull_conn, &zero);
        r->pull_conn = NULL;
    }
}

/* Idempotent: gives back everything the request holds. After it the request is SREQ_DONE. */
static void sreq_release(struct sreq *r)
{
    struct sim_rank *rk = r->rank;
    if (r->state == SREQ_DONE)
        return;
    if (r->state == SREQ_WAITING) {
        TAILQ_REMOVE(&rk->waiting, r, wq);
        rk->waiting_n--;
    }
    int unpulled = r->aborted && r->p.h.do_remote_prefill && !r->p.h.has_bootstrap &&
                   (r->state == SREQ_WAITING || r->state == SREQ_HANDOFF || r->state == SREQ_STALLED);
    r->state = SREQ_DONE;
    if (r->timer) {
        event_free(r->timer);
        r->timer = NULL;
    }
    if (r->close_ev) {
        event_free(r->close_ev);
        r->close_ev = NULL;
    }
    pull_cancel(r);
    if (r->xp) { /* the read finishes on its own; its poll then releases the KV and frees the buffer */
        r->xp->r = NULL;
        r->xp = NULL;
        unpulled = 0;
    }
    if (unpulled)
        notify_release(r);
    if (r->aborted) {
        rk->aborted_total++;
        if (r->lease_key[0]) { /* a prefill aborted after registering KV: drop it */
            struct sim_lease *l = sim_lease_take(&r->sim->leases, r->lease_key);
            if (l) {
                r->sim->leases_aborted++;
                lease_drop(r->sim, l);
            }
        }
    }
    if (r->in_slot) {
        r->in_slot = 0;
        rk->running--;
        rk->kv_tokens_running -= r->p.prompt.n + r->pos;
        pump_waiting(rk);
    }
}

static void sreq_schedule(struct sreq *r, uint64_t us)
{
    struct timeval tv = us_to_tv(us);
    if (!r->timer)
        r->timer = XPYD_XALLOC(event_new(r->sim->base, -1, 0, sreq_tick, r));
    event_add(r->timer, &tv);
}

/* Sends a whole non-streamed answer for a paused request and ends it. */
static void sreq_reply(struct sreq *r, int status, const char *ctype, const char *body, size_t len)
{
    evhtp_request_t *req = r->ereq;
    sreq_release(r);
    if (!req)
        return;
    reply_raw(req, status, ctype, body, len);
    evhtp_request_resume(req);
}

static void sreq_fail(struct sreq *r, int status, const char *msg)
{
    char *body = xpyd_oai_error_json(status, NULL, msg, NULL);
    if (r->stream_started && r->ereq) { /* mid-stream: one error event, then [DONE] */
        evhtp_request_t *req = r->ereq;
        struct evbuffer *b = evbuffer_new();
        xpyd_sse_write(b, body, strlen(body));
        xpyd_sse_write_done(b);
        sreq_release(r);
        evhtp_send_reply_chunk(req, b);
        evhtp_send_reply_chunk_end(req);
        evhtp_request_resume(req);
        evbuffer_free(b);
    } else {
        sreq_reply(r, status, "application/json", body, strlen(body));
    }
    free(body);
}

/* Cuts the client's connection without an answer (--fail-after-tokens). */
static void sreq_cut(struct sreq *r)
{
    r->sim->faults_disconnect++;
    evhtp_request_t *req = r->ereq;
    r->aborted = 1;
    sreq_release(r);
    if (req)
        evhtp_connection_free(evhtp_request_get_connection(req));
}

/* ---------- handoff: KV leases, store, pulls ---------- */

/* A lease's KV registered with the transfer engine must leave the engine before its memory is freed
 * (unregistering waits for peers reading it). */
static void lease_unregister(void *arg, struct sim_lease *l)
{
    struct sim *s = arg;
    if (s->xt && l->kv)
        xt_unregister_memory(s->xt, l->kv);
}

static void lease_drop(struct sim *s, struct sim_lease *l)
{
    lease_unregister(s, l);
    sim_lease_free(l);
}

static unsigned char *kv_make(const struct sreq *r, size_t *len)
{
    size_t bpt = (size_t)r->sim->cfg.kv_bytes_per_token;
    *len = r->p.prompt.n * bpt;
    unsigned char *kv = XPYD_XALLOC(malloc(*len ? *len : 1));
    sim_kv_fill(&r->p.prompt, bpt, kv);
    return kv;
}

static int kv_verify(const struct sreq *r, const unsigned char *data, size_t len)
{
    size_t elen;
    unsigned char *exp = kv_make(r, &elen);
    int ok = elen == len && memcmp(exp, data, len) == 0;
    free(exp);
    return ok;
}

/* Prefill side of kv-params: hold the KV under a lease and describe it in kv_out. */
static int prefill_register_kv_params(struct sreq *r)
{
    struct sim *s = r->sim;
    size_t kvlen;
    unsigned char *kv = kv_make(r, &kvlen);
    size_t nblocks = (r->p.prompt.n + 15) / 16;
    uint64_t base = r->rank->next_block;
    r->rank->next_block += nblocks;
    uint64_t sig = XPYD_FNV_INIT;
    cJSON *o = XPYD_XALLOC(cJSON_CreateObject());
    cJSON_AddBoolToObject(o, "do_remote_prefill", 1);
    cJSON_AddBoolToObject(o, "do_remote_decode", 0);
    cJSON *blocks = cJSON_AddArrayToObject(o, "remote_block_ids");
    for (size_t i = 0; i < nblocks; i++) {
        long long id = (long long)(base + i);
        sig = xpyd_fnv64(sig, &id, sizeof id);
        cJSON_AddItemToArray(blocks, cJSON_CreateNumber((double)id));
    }
    char key[240], rid[220];
    snprintf(rid, sizeof rid, "%s", r->id);
    snprintf(key, sizeof key, "req:%s", rid);
    if (sim_lease_find(&s->leases, key)) { /* the same X-Request-Id reused while its KV is held */
        snprintf(rid, sizeof rid, "%.150s~%" PRIu64, r->id, ++s->seq);
        snprintf(key, sizeof key, "req:%s", rid);
    }
    uint64_t exp = xpyd_now_us() + (uint64_t)s->cfg.lease_ms * 1000u;
    if (sim_lease_put(&s->leases, key, r->rank->engine_id, sig, r->p.prompt.hash, kv, kvlen, exp)) {
        cJSON_Delete(o);
        return -1;
    }
    s->leases_created++;
    snprintf(r->lease_key, sizeof r->lease_key, "%s", key);
    cJSON_AddStringToObject(o, "remote_engine_id", r->rank->engine_id);
    cJSON_AddStringToObject(o, "remote_request_id", rid);
    cJSON_AddStringToObject(o, "remote_host", s->cfg.host);
    cJSON_AddNumberToObject(o, "remote_port", s->cfg.bootstrap_port ? s->cfg.bootstrap_port : r->rank->port);
    cJSON_AddNumberToObject(o, "tp_size", 1);
    if (s->xt) { /* xpyd: the decode reads the bytes through libxpyd_transfer, then asks for the release */
        struct sim_lease *l = sim_lease_find(&s->leases, key);
        if (!l || xt_register_memory(s->xt, l->kv, l->kv_len ? l->kv_len : 1, "sim:kv") != 0) {
            lease_drop(s, sim_lease_take(&s->leases, key));
            r->lease_key[0] = 0;
            cJSON_Delete(o);
            return -1;
        }
        char seg[300], addr[32];
        xpyd_hostport(s->cfg.host, xt_engine_port(s->xt), seg, sizeof seg);
        snprintf(addr, sizeof addr, "%" PRIu64, (uint64_t)(uintptr_t)l->kv);
        cJSON_AddStringToObject(o, "xpyd_segment", seg);
        cJSON_AddStringToObject(o, "xpyd_addr", addr);
        cJSON_AddNumberToObject(o, "xpyd_len", (double)l->kv_len);
        cJSON_AddStringToObject(o, "xpyd_key", key);
    }
    r->kv_out = o;
    return 0;
}

static int prefill_register_room(struct sreq *r)
{
    struct sim *s = r->sim;
    size_t kvlen;
    unsigned char *kv = kv_make(r, &kvlen);
    char key[64];
    snprintf(key, sizeof key, "room:%" PRIu64, r->p.h.bootstrap_room);
    uint64_t exp = xpyd_now_us() + (uint64_t)s->cfg.lease_ms * 1000u;
    int rc = sim_lease_put(&s->leases, key, r->rank->engine_id, 0, r->p.prompt.hash, kv, kvlen, exp);
    if (rc == 0) {
        s->leases_created++;
        snprintf(r->lease_key, sizeof r->lease_key, "%s", key);
    }
    return rc;
}

static void store_path(const struct sim *s, uint64_t hash, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%016" PRIx64 ".kv", s->cfg.store_dir, hash);
}

static int store_write(struct sreq *r)
{
    char path[600], tmp[640];
    store_path(r->sim, r->p.prompt.hash, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.%d.%" PRIu64 ".tmp", path, (int)getpid(), ++r->sim->seq);
    size_t len;
    unsigned char *kv = kv_make(r, &len);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int ok = fd >= 0 && write(fd, kv, len) == (ssize_t)len;
    if (fd >= 0)
        close(fd);
    free(kv);
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        XLOG_WARN("msg=\"store write failed\" path=%s errno=%d", path, errno);
        return -1;
    }
    r->sim->kv_bytes_sent += len;
    return 0;
}

/* 1: found and valid, 0: not there (yet), -1: there but corrupt. */
static int store_read(struct sreq *r)
{
    char path[600];
    store_path(r->sim, r->p.prompt.hash, path, sizeof path);
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    size_t cap = r->p.prompt.n * (size_t)r->sim->cfg.kv_bytes_per_token + 1;
    unsigned char *buf = XPYD_XALLOC(malloc(cap));
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    int ok = kv_verify(r, buf, n);
    free(buf);
    if (ok)
        r->sim->kv_bytes_received += n;
    return ok ? 1 : -1;
}

/* Decode got its KV (or gave up and recomputes): move on to generating. */
static void handoff_finished(struct sreq *r, int result)
{
    r->sim->handoffs[r->ho_mode][result]++;
    if (result == HO_DONE) {
        r->cached_tokens = (long)r->p.prompt.n; /* the whole prompt came from the remote KV */
        r->state = SREQ_DECODE;
        sreq_schedule(r, (uint64_t)r->sim->cfg.decode_us_per_token);
    } else {
        r->state = SREQ_PREFILL;
        sreq_schedule(r, (uint64_t)r->sim->cfg.prefill_us_per_token * r->p.prompt.n);
    }
}

static void pull_send(struct sreq *r);

static void on_pull_done(struct evhttp_request *resp, void *arg)
{
    struct sreq *r = arg;
    r->pull_req = NULL; /* libevent frees it after this callback */
    if (r->state != SREQ_HANDOFF)
        return;
    int code = resp ? evhttp_request_get_response_code(resp) : 0;
    struct evbuffer *in = resp ? evhttp_request_get_input_buffer(resp) : NULL;
    size_t len = in ? evbuffer_get_length(in) : 0;
    const unsigned char *data = len ? evbuffer_pullup(in, -1) : NULL;
    char msg[600];
    if (code == 200) {
        if (!kv_verify(r, data, len)) {
            r->sim->handoffs[r->ho_mode][HO_FAILED]++;
            sreq_fail(r, 500, "KV transfer failed: the pulled KV does not match this request's prompt "
                              "(integrity check failed)");
            return;
        }
        r->sim->kv_bytes_received += len;
        pull_cancel(r);
        handoff_finished(r, HO_DONE);
        return;
    }
    if (code == 409 && r->p.h.has_bootstrap && xpyd_now_us() < r->deadline_us) {
        sreq_schedule(r, 2000); /* the prefill has not registered the room yet: poll again */
        return;
    }
    r->sim->handoffs[r->ho_mode][HO_FAILED]++;
    if (code == 0) {
        const char *host = r->p.h.has_bootstrap ? r->p.h.bootstrap_host : r->p.h.remote_host;
        int port = r->p.h.has_bootstrap ? r->p.h.bootstrap_port : r->p.h.remote_port;
        snprintf(msg, sizeof msg, "KV transfer failed: could not reach the prefill engine at %s:%d", host, port);
        sreq_fail(r, 500, msg);
    } else if (code == 409) {
        snprintf(msg, sizeof msg, "KV transfer failed: bootstrap room %" PRIu64 " was not ready within %ld ms",
                 r->p.h.bootstrap_room, r->sim->cfg.handoff_timeout_ms);
        sreq_fail(r, 500, msg);
    } else {
        snprintf(msg, sizeof msg, "kv_transfer_params rejected by the prefill engine (HTTP %d): %.*s", code,
                 (int)(len > 400 ? 400 : len), data ? (const char *)data : "");
        sreq_fail(r, 400, msg);
    }
}

static char *pull_json(const struct sreq *r)
{
    cJSON *o = XPYD_XALLOC(cJSON_CreateObject());
    char sig[32];
    if (r->p.h.has_bootstrap) {
        snprintf(sig, sizeof sig, "%" PRIu64, r->p.h.bootstrap_room);
        cJSON_AddStringToObject(o, "bootstrap_room", sig);
    } else {
        snprintf(sig, sizeof sig, "%016" PRIx64, r->p.h.block_sig);
        cJSON_AddStringToObject(o, "remote_engine_id", r->p.h.remote_engine_id);
        cJSON_AddStringToObject(o, "remote_request_id", r->p.h.remote_request_id);
        cJSON_AddStringToObject(o, "block_sig", sig);
    }
    char *body = XPYD_XALLOC(cJSON_PrintUnformatted(o));
    cJSON_Delete(o);
    return body;
}

static void release_done_cb(struct evhttp_request *resp, void *arg)
{
    struct timeval zero = {0, 0};
    event_base_once(evhttp_connection_get_base(arg), -1, EV_TIMEOUT, free_pull_conn_cb, arg, &zero);
}

/* A decode aborted before it pulled its KV tells the prefill to free it (as vLLM's connectors do), so an
 * abandoned request leaves nothing stranded. Fire and forget. */
static void notify_release(struct sreq *r)
{
    struct evhttp_connection *c =
        evhttp_connection_base_new(r->sim->base, NULL, r->p.h.remote_host, (unsigned short)r->p.h.remote_port);
    if (!c)
        return;
    evhttp_connection_set_timeout(c, 5);
    struct evhttp_request *req = evhttp_request_new(release_done_cb, c);
    char *body = pull_json(r);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Host", r->p.h.remote_host);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
    evbuffer_add(evhttp_request_get_output_buffer(req), body, strlen(body));
    free(body);
    if (evhttp_make_request(c, req, EVHTTP_REQ_POST, "/kv/release") != 0)
        evhttp_connection_free(c);
    r->sim->release_notices++;
}

static void pull_send(struct sreq *r)
{
    struct sim *s = r->sim;
    const char *host = r->p.h.has_bootstrap ? r->p.h.bootstrap_host : r->p.h.remote_host;
    int port = r->p.h.has_bootstrap ? r->p.h.bootstrap_port : r->p.h.remote_port;
    if (!r->pull_conn) {
        r->pull_conn = evhttp_connection_base_new(s->base, NULL, host, (unsigned short)port);
        if (!r->pull_conn) {
            on_pull_done(NULL, r);
            return;
        }
        evhttp_connection_set_timeout(r->pull_conn, (int)((s->cfg.handoff_timeout_ms + 999) / 1000));
    }
    char *body = pull_json(r);
    struct evhttp_request *req = XPYD_XALLOC(evhttp_request_new(on_pull_done, r));
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Host", host);
    evhttp_add_header(h, "Content-Type", "application/json");
    evbuffer_add(evhttp_request_get_output_buffer(req), body, strlen(body));
    free(body);
    r->pull_req = req;
    if (evhttp_make_request(r->pull_conn, req, EVHTTP_REQ_POST, "/kv/pull") != 0) {
        r->pull_req = NULL; /* libevent freed it */
        on_pull_done(NULL, r);
    }
}

/* ---------- xpyd handoff: the KV read through libxpyd_transfer ---------- */

static void xpull_free(struct xpull *xp)
{
    for (struct xpull **pp = &xp->sim->pulls; *pp; pp = &(*pp)->next)
        if (*pp == xp) {
            *pp = xp->next;
            break;
        }
    xt_free_batch(xp->sim->xt, xp->batch);
    xt_unregister_memory(xp->sim->xt, xp->buf);
    free(xp->buf);
    free(xp);
}

/* A read that is no longer pending: verify, ask the prefill to release, go on generating (or fail). */
static void xpull_done(struct xpull *xp, int st)
{
    struct sim *s = xp->sim;
    struct sreq *r = xp->r;
    xt_segment xp_seg = xp->seg;
    char msg[400];
    snprintf(msg, sizeof msg, "release %s", xp->key);
    /* read or not, the prefill may let go of the blocks now */
    if (xt_send_notify(s->xt, xp->seg, msg) != 0)
        XLOG_WARN("msg=\"xpyd release notification failed\" key=%s", xp->key);
    if (!r) {
        xpull_free(xp);
        return;
    }
    r->xp = NULL;
    if (st == XT_COMPLETED && kv_verify(r, xp->buf, xp->len)) {
        r->kv_xfer_bytes = xp->len;
        r->kv_xfer_us = xpyd_now_us() - xp->t0;
        s->kv_bytes_received += xp->len;
        xpull_free(xp);
        handoff_finished(r, HO_DONE);
        return;
    }
    xpull_free(xp);
    if (st != XT_COMPLETED) /* reopened next time: the peer may have restarted */
        xt_close_segment(s->xt, xp_seg);
    s->handoffs[r->ho_mode][HO_FAILED]++;
    sreq_fail(r, 500, st == XT_COMPLETED ? "KV transfer failed: the KV read does not match this request's prompt "
                                           "(integrity check failed)"
                                         : "KV transfer failed: the read from the prefill's transfer engine failed");
}

static void xpull_start(struct sreq *r)
{
    struct sim *s = r->sim;
    const struct sim_handoff_in *h = &r->p.h;
    char msg[500];
    struct xpull *xp = XPYD_XALLOC(calloc(1, sizeof *xp));
    xp->sim = s;
    xp->r = r;
    xp->len = (size_t)h->xpyd_len;
    xp->buf = XPYD_XALLOC(malloc(xp->len ? xp->len : 1));
    xp->t0 = xpyd_now_us();
    snprintf(xp->key, sizeof xp->key, "%s", h->xpyd_key);
    int rc = xt_open_segment(s->xt, h->xpyd_segment, &xp->seg); /* the engine keeps peers open */
    if (!rc)
        rc = xt_register_memory(s->xt, xp->buf, xp->len ? xp->len : 1, "sim:kv");
    if (!rc && (rc = xt_alloc_batch(s->xt, 1, &xp->batch)) == 0) {
        struct xt_request q = {XT_READ, xp->buf, xp->seg, h->xpyd_addr, xp->len ? xp->len : 1};
        if ((rc = xt_submit(s->xt, xp->batch, &q, 1)) != 0)
            xt_free_batch(s->xt, xp->batch);
        else {
            xp->next = s->pulls; /* finished when the engine's event fd fires */
            s->pulls = xp;
            r->xp = xp;
            return;
        }
    }
    xt_unregister_memory(s->xt, xp->buf);
    free(xp->buf);
    free(xp);
    s->handoffs[r->ho_mode][HO_FAILED]++;
    snprintf(msg, sizeof msg, "KV transfer failed: cannot read from the prefill's transfer engine at %.200s: %s",
             h->xpyd_segment, strerror(-rc));
    sreq_fail(r, 500, msg);
}

/* The engine's event fd fired. Decode: reads that finished. Prefill: "release <key>" notifications from
 * decodes (after their read) and from the router (when the request died before any decode read). */
static void xt_on_event(evutil_socket_t fd, short ev, void *arg)
{
    struct sim *s = arg;
    uint64_t count;
    if (read(fd, &count, sizeof count) < 0) {
        /* nothing to clear (EAGAIN): look anyway */
    }
    for (struct xpull *xp = s->pulls, *next; xp; xp = next) {
        next = xp->next;
        int st = XT_PENDING;
        if (xt_batch_status(s->xt, xp->batch, &st) == 0 && st != XT_PENDING)
            xpull_done(xp, st);
    }
    struct xt_notify n[32];
    int k;
    while ((k = xt_get_notifies(s->xt, n, 32)) > 0)
        for (int i = 0; i < k; i++) {
            if (strncmp(n[i].msg, "release ", 8) != 0)
                continue;
            struct sim_lease *l = sim_lease_take(&s->leases, n[i].msg + 8);
            if (!l)
                continue; /* already released (the decode and the router may both say so) */
            s->xt_releases++;
            s->leases_released++;
            s->kv_bytes_sent += l->kv_len;
            lease_drop(s, l);
        }
}

/* ---------- scheduling and generation ---------- */

/* Takes a slot and begins: the KV handoff (decode side), else local prefill compute. */
static void sreq_start(struct sreq *r)
{
    struct sim *s = r->sim;
    r->in_slot = 1;
    r->rank->running++;
    r->rank->kv_tokens_running += r->p.prompt.n;
    int remote = r->p.h.do_remote_prefill && !r->p.h.do_remote_decode;
    int boot = r->p.h.has_bootstrap && s->cfg.role == SIM_ROLE_DECODE;
    int store = s->cfg.handoff == SIM_HANDOFF_STORE && s->cfg.role == SIM_ROLE_DECODE;
    if (remote && r->p.h.has_xpyd && s->xt) {
        r->state = SREQ_HANDOFF;
        r->ho_mode = SIM_HANDOFF_XPYD;
        xpull_start(r);
    } else if (remote || boot) {
        r->state = SREQ_HANDOFF;
        r->ho_mode = boot ? SIM_HANDOFF_BOOTSTRAP : SIM_HANDOFF_KV_PARAMS;
        r->deadline_us = xpyd_now_us() + (uint64_t)s->cfg.handoff_timeout_ms * 1000u;
        pull_send(r);
    } else if (store) {
        r->state = SREQ_HANDOFF;
        r->ho_mode = SIM_HANDOFF_STORE;
        r->deadline_us = xpyd_now_us() + (uint64_t)s->cfg.store_wait_ms * 1000u;
        sreq_schedule(r, 0);
    } else {
        r->state = SREQ_PREFILL;
        sreq_schedule(r, (uint64_t)s->cfg.prefill_us_per_token * r->p.prompt.n);
    }
}

static void sreq_admit(struct sreq *r)
{
    struct sim_rank *rk = r->rank;
    if (TAILQ_EMPTY(&rk->waiting) && rank_has_room(rk, r->p.prompt.n)) { /* FIFO: no overtaking the queue */
        sreq_start(r);
    } else {
        r->state = SREQ_WAITING;
        TAILQ_INSERT_TAIL(&rk->waiting, r, wq);
        rk->waiting_n++;
    }
}

static void add_usage(cJSON *parent, const struct sreq *r)
{
    cJSON *u = cJSON_AddObjectToObject(parent, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)r->p.prompt.n);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(r->p.prompt.n + r->pos));
    cJSON_AddNumberToObject(u, "completion_tokens", (double)r->pos);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", (double)r->cached_tokens);
}

static void usage_json(const struct sreq *r, char *out, size_t cap)
{
    snprintf(out, cap,
             "{\"prompt_tokens\":%zu,\"total_tokens\":%zu,\"completion_tokens\":%zu,"
             "\"prompt_tokens_details\":{\"cached_tokens\":%ld}}",
             r->p.prompt.n, r->p.prompt.n + r->pos, r->pos, r->cached_tokens);
}

/* The finished non-streamed answer, vLLM's shape (with kv_transfer_params on a prefill). */
static void sreq_send_final_json(struct sreq *r)
{
    const struct sim *s = r->sim;
    cJSON *o = XPYD_XALLOC(cJSON_CreateObject());
    char *text = XPYD_XALLOC(malloc(evbuffer_get_length(r->text) + 1));
    size_t tl = evbuffer_get_length(r->text);
    evbuffer_copyout(r->text, text, tl);
    text[tl] = '\0';
    cJSON_AddStringToObject(o, "id", r->id_json);
    cJSON_AddStringToObject(o, "object", r->p.chat ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)r->created);
    cJSON_AddStringToObject(o, "model", s->cfg.model);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (r->p.chat) {
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddStringToObject(m, "content", text);
        cJSON_AddArrayToObject(m, "tool_calls");
    } else {
        cJSON_AddStringToObject(c, "text", text);
    }
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddStringToObject(c, "finish_reason", r->finish_reason);
    cJSON_AddNullToObject(c, "stop_reason");
    if (!r->p.chat)
        cJSON_AddNullToObject(c, "prompt_logprobs");
    add_usage(o, r);
    if (r->kv_out) {
        cJSON_AddItemToObject(o, "kv_transfer_params", r->kv_out);
        r->kv_out = NULL;
    } else {
        cJSON_AddNullToObject(o, "kv_transfer_params");
    }
    char *body = XPYD_XALLOC(cJSON_PrintUnformatted(o));
    cJSON_Delete(o);
    free(text);
    r->rank->success_total++;
    kv_transfer_header(r);
    sreq_reply(r, 200, "application/json", body, strlen(body));
    free(body);
}

static void kv_transfer_header(struct sreq *r)
{
    if (!r->kv_xfer_bytes || !r->ereq)
        return;
    char v[96];
    snprintf(v, sizeof v, "bytes=%" PRIu64 "; us=%" PRIu64, r->kv_xfer_bytes, r->kv_xfer_us);
    add_header(r->ereq, "X-KV-Transfer", v);
}

static void stream_begin(struct sreq *r)
{
    kv_transfer_header(r);
    add_header(r->ereq, "Content-Type", "text/event-stream");
    add_header(r->ereq, "Cache-Control", "no-cache");
    evhtp_send_reply_chunk_start(r->ereq, EVHTP_RES_OK);
    r->stream_started = 1;
    if (r->p.chat) { /* vLLM's first chat chunk carries the role and empty content */
        char buf[640];
        int n = snprintf(buf, sizeof buf,
                         "{\"id\":\"%s\",\"object\":\"chat.completion.chunk\",\"created\":%lld,\"model\":\"%s\","
                         "\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
                         "\"logprobs\":null,\"finish_reason\":null}]}",
                         r->id_json, (long long)r->created, r->sim->model_json);
        struct evbuffer *b = evbuffer_new();
        xpyd_sse_write(b, buf, (size_t)n);
        evhtp_send_reply_chunk(r->ereq, b);
        evbuffer_free(b);
    }
}

/* Streams token `tok` (and, if last, the usage chunk and [DONE]). */
static void stream_token(struct sreq *r, const char *tok, int last)
{
    char buf[1024];
    char fr[16];
    snprintf(fr, sizeof fr, last ? "\"%s\"" : "null", r->finish_reason ? r->finish_reason : "length");
    int n;
    if (r->p.chat)
        n = snprintf(buf, sizeof buf,
                     "{\"id\":\"%s\",\"object\":\"chat.completion.chunk\",\"created\":%lld,\"model\":\"%s\","
                     "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%s\"},\"logprobs\":null,"
                     "\"finish_reason\":%s}]}",
                     r->id_json, (long long)r->created, r->sim->model_json, tok, fr);
    else
        n = snprintf(buf, sizeof buf,
                     "{\"id\":\"%s\",\"object\":\"text_completion\",\"created\":%lld,\"model\":\"%s\","
                     "\"choices\":[{\"index\":0,\"text\":\"%s\",\"logprobs\":null,\"finish_reason\":%s,"
                     "\"stop_reason\":null}],\"usage\":null}",
                     r->id_json, (long long)r->created, r->sim->model_json, tok, fr);
    struct evbuffer *b = evbuffer_new();
    xpyd_sse_write(b, buf, (size_t)n);
    if (last) {
        if (r->p.include_usage) {
            char u[256];
            usage_json(r, u, sizeof u);
            n = snprintf(buf, sizeof buf,
                         "{\"id\":\"%s\",\"object\":\"%s\",\"created\":%lld,\"model\":\"%s\",\"choices\":[],"
                         "\"usage\":%s}",
                         r->id_json, r->p.chat ? "chat.completion.chunk" : "text_completion",
                         (long long)r->created, r->sim->model_json, u);
            xpyd_sse_write(b, buf, (size_t)n);
        }
        xpyd_sse_write_done(b);
        evhtp_request_t *req = r->ereq;
        r->rank->success_total++;
        sreq_release(r);
        evhtp_send_reply_chunk(req, b);
        evhtp_send_reply_chunk_end(req);
        evhtp_request_resume(req);
    } else {
        evhtp_send_reply_chunk(r->ereq, b);
    }
    evbuffer_free(b);
}

/* Prefill compute finished: a prefill registers its KV; everyone then emits the first token. */
static void prefill_done(struct sreq *r)
{
    struct sim *s = r->sim;
    if (s->cfg.handoff == SIM_HANDOFF_STORE && s->cfg.role != SIM_ROLE_DECODE)
        store_write(r);
    if (r->p.h.do_remote_decode && s->cfg.role != SIM_ROLE_DECODE && prefill_register_kv_params(r) != 0) {
        sreq_fail(r, 500, "could not register the KV lease");
        return;
    }
    if (r->p.h.has_bootstrap && s->cfg.role == SIM_ROLE_PREFILL) {
        if (prefill_register_room(r) == -EEXIST) {
            sreq_fail(r, 400, "bootstrap_room is already in use on this prefill engine");
            return;
        }
    }
    r->state = SREQ_DECODE;
}

static void store_poll(struct sreq *r)
{
    int found = store_read(r);
    if (found == 1)
        handoff_finished(r, HO_DONE);
    else if (found == 0 && xpyd_now_us() < r->deadline_us)
        sreq_schedule(r, 2000);
    else
        handoff_finished(r, HO_RECOMPUTED);
}

static void generate_one(struct sreq *r)
{
    struct sim *s = r->sim;
    char tok[32];
    uint32_t id = sim_gen_token(r->p.prompt.hash, s->cfg.seed, r->pos);
    sim_token_text(id, tok, sizeof tok);
    r->pos++;
    r->rank->generation_tokens_total++;
    r->rank->kv_tokens_running++;
    int last = 0;
    if ((long)r->pos >= r->p.max_tokens) {
        last = 1;
        r->finish_reason = "length";
    } else if (!r->p.ignore_eos && (long)r->pos >= r->p.min_tokens &&
               sim_gen_eos(r->p.prompt.hash, s->cfg.seed, r->pos - 1, s->cfg.eos_prob)) {
        last = 1;
        r->finish_reason = "stop";
    }
    if (s->cfg.fail_after_tokens >= 0 && (long)r->pos > s->cfg.fail_after_tokens) {
        sreq_cut(r);
        return;
    }
    if (r->p.stream) {
        if (!r->stream_started)
            stream_begin(r);
        stream_token(r, tok, last);
    } else {
        evbuffer_add(r->text, tok, strlen(tok)); /* same text as the stream's deltas */
        if (last)
            sreq_send_final_json(r);
    }
    if (!last) {
        uint64_t now = xpyd_now_us();
        if (!r->next_due_us || r->next_due_us + 10000 < now)
            r->next_due_us = now; /* first token, or badly late: restart the cadence */
        /* a step costs more the more KV the rank's batch holds (attention reads all of it) */
        r->next_due_us += (uint64_t)s->cfg.decode_us_per_token +
                          r->rank->kv_tokens_running * (uint64_t)s->cfg.decode_ns_per_kv_token / 1000u;
        sreq_schedule(r, r->next_due_us > now ? r->next_due_us - now : 0);
    }
}

static void sreq_tick(evutil_socket_t fd, short ev, void *arg)
{
    struct sreq *r = arg;
    switch (r->state) {
    case SREQ_STALLED:
        sreq_admit(r);
        break;
    case SREQ_HANDOFF:
        if (r->ho_mode == SIM_HANDOFF_STORE)
            store_poll(r);
        else
            pull_send(r); /* bootstrap room not ready yet: ask again */
        break;
    case SREQ_PREFILL:
        r->rank->prompt_tokens_total += r->p.prompt.n;
        prefill_done(r);
        if (r->state == SREQ_DECODE)
            generate_one(r);
        break;
    case SREQ_DECODE:
        generate_one(r);
        break;
    default:
        break;
    }
}

/* ---------- HTTP handlers ---------- */

static struct sim_rank *pick_rank(struct sim *s, struct sim_rank *own, evhtp_request_t *req,
                                  const struct sim_params *p, char *err, size_t errcap)
{
    const char *hdr = evhtp_header_find(req->headers_in, "X-data-parallel-rank");
    long r = -1;
    if (hdr && xpyd_parse_long(hdr, 0, 1 << 20, &r) != 0) {
        snprintf(err, errcap, "X-data-parallel-rank must be a non-negative integer");
        return NULL;
    }
    if (r < 0 && p && p->h.dp_rank >= 0)
        r = p->h.dp_rank;
    if (!s->cfg.dp_internal) { /* external LB: each rank is its own server and only knows itself */
        if (r > 0) {
            snprintf(err, errcap, "data parallel rank %ld is out of range for this engine (external LB: only 0)", r);
            return NULL;
        }
        return own;
    }
    if (r >= s->nranks) {
        snprintf(err, errcap, "data parallel rank %ld is out of range [0, %d)", r, s->nranks);
        return NULL;
    }
    if (r >= 0)
        return &s->ranks[r];
    if (p && p->h.has_bootstrap && s->cfg.role == SIM_ROLE_PREFILL)
        return &s->ranks[p->h.bootstrap_room % (uint64_t)s->nranks]; /* SGLang's rule */
    struct sim_rank *best = &s->ranks[0];
    for (int i = 1; i < s->nranks; i++)
        if (s->ranks[i].running + s->ranks[i].waiting_n < best->running + best->waiting_n)
            best = &s->ranks[i];
    return best;
}

static void handle_generate(evhtp_request_t *req, struct sim_rank *own, int chat)
{
    struct sim *s = own->sim;
    if (!is_post(req)) {
        reply_error(req, 405, "Method Not Allowed");
        return;
    }
    if (s->cfg.status_code) {
        s->faults_status++;
        reply_error(req, s->cfg.status_code, "xpyd_sim: injected status (--status-code)");
        return;
    }
    if (s->cfg.fail_rate > 0 && (double)(sim_rand(s) >> 11) / 9007199254740992.0 < s->cfg.fail_rate) {
        s->faults_fail_rate++;
        reply_error(req, 500, "xpyd_sim: injected failure (--fail-rate)");
        return;
    }
    size_t len;
    const char *body = body_of(req, &len);
    struct sim_limits lim = {s->cfg.model, s->cfg.max_model_len};
    struct sim_params p;
    char *err = NULL;
    int status = sim_params_parse(body, len, chat, &lim, &p, &err);
    if (status) {
        reply_error(req, status, err);
        free(err);
        return;
    }
    char rerr[160];
    if ((p.h.do_remote_prefill && s->cfg.role == SIM_ROLE_PREFILL) ||
        (p.h.do_remote_decode && s->cfg.role == SIM_ROLE_DECODE)) {
        sim_params_free(&p);
        reply_error(req, 400, s->cfg.role == SIM_ROLE_PREFILL
                                  ? "this engine is a KV producer (prefill): it cannot take do_remote_prefill"
                                  : "this engine is a KV consumer (decode): it cannot take do_remote_decode");
        return;
    }
    struct sim_rank *rk = pick_rank(s, own, req, &p, rerr, sizeof rerr);
    if (!rk) {
        sim_params_free(&p);
        reply_error(req, 400, rerr);
        return;
    }
    struct sreq *r = XPYD_XALLOC(calloc(1, sizeof *r));
    r->sim = s;
    r->rank = rk;
    r->ereq = req;
    r->p = p;
    r->created = xpyd_wall_s();
    r->text = p.stream ? NULL : XPYD_XALLOC(evbuffer_new());
    const char *xid = evhtp_header_find(req->headers_in, "X-Request-Id");
    if (p.rid)
        snprintf(r->id, sizeof r->id, "%.190s", p.rid);
    else if (xid && *xid)
        snprintf(r->id, sizeof r->id, "%.190s", xid);
    else
        snprintf(r->id, sizeof r->id, "%016" PRIx64, sim_rand(s));
    char esc[220];
    json_escape_into(r->id, esc, sizeof esc);
    snprintf(r->id_json, sizeof r->id_json, "%s%.200s", chat ? "chatcmpl-" : "cmpl-", esc);
    LIST_INSERT_HEAD(&s->all, r, all);
    rk->requests_total++;
    evhtp_request_set_hook(req, evhtp_hook_on_request_fini, (evhtp_hook)on_request_fini, r);
    evhtp_request_pause(req);
    /* libevhtp's pause turns EV_WRITE off too: without it a reader that fell behind is never written again */
    bufferevent_enable(evhtp_connection_get_bev(evhtp_request_get_connection(req)), EV_WRITE);
    evutil_socket_t fd = bufferevent_getfd(evhtp_connection_get_bev(evhtp_request_get_connection(req)));
    r->close_ev = event_new(s->base, fd, EV_CLOSED, on_client_closed, r);
    if (r->close_ev)
        event_add(r->close_ev, NULL);
    if (s->cfg.stall_ms > 0) {
        s->faults_stall++;
        r->state = SREQ_STALLED;
        sreq_schedule(r, (uint64_t)s->cfg.stall_ms * 1000u);
        return;
    }
    sreq_admit(r);
}

static struct sim_rank *rank_of(void *arg)
{
    return arg;
}

static void on_completions(evhtp_request_t *req, void *arg)
{
    handle_generate(req, rank_of(arg), 0);
}

static void on_chat(evhtp_request_t *req, void *arg)
{
    handle_generate(req, rank_of(arg), 1);
}

static void on_health(evhtp_request_t *req, void *arg)
{
    reply_raw(req, 200, "application/json", "", 0);
}

static void on_models(evhtp_request_t *req, void *arg)
{
    struct sim *s = rank_of(arg)->sim;
    char buf[1024];
    int n = snprintf(buf, sizeof buf,
                     "{\"object\":\"list\",\"data\":[{\"id\":\"%s\",\"object\":\"model\",\"created\":%lld,"
                     "\"owned_by\":\"vllm\",\"root\":\"%s\",\"parent\":null,\"max_model_len\":%ld,"
                     "\"permission\":[]}]}",
                     s->model_json, (long long)xpyd_wall_s(), s->model_json, s->cfg.max_model_len);
    reply_raw(req, 200, "application/json", buf, (size_t)n);
}

static void on_tokenize(evhtp_request_t *req, void *arg)
{
    struct sim *s = rank_of(arg)->sim;
    if (!is_post(req)) {
        reply_error(req, 405, "Method Not Allowed");
        return;
    }
    size_t len;
    const char *body = body_of(req, &len);
    struct sim_prompt pr;
    char *err = NULL;
    int st = sim_tokenize_parse(body, len, &pr, &err);
    if (st) {
        reply_error(req, st, err);
        free(err);
        return;
    }
    struct evbuffer *b = req->buffer_out;
    evbuffer_add_printf(b, "{\"count\":%zu,\"max_model_len\":%ld,\"tokens\":[", pr.n, s->cfg.max_model_len);
    for (size_t i = 0; i < pr.n; i++)
        evbuffer_add_printf(b, i ? ",%u" : "%u", pr.ids[i]);
    evbuffer_add_printf(b, "],\"token_strs\":null}");
    sim_prompt_free(&pr);
    reply_raw(req, 200, "application/json", "", 0);
}

static void kv_take(evhtp_request_t *req, struct sim *s, int release);

/* The prefill's KV channel: a decode pulls a lease (kv-params) or a bootstrap room... */
static void on_kv_pull(evhtp_request_t *req, void *arg)
{
    kv_take(req, rank_of(arg)->sim, 0);
}

/* ...or, aborted before pulling, asks the prefill to free it. */
static void on_kv_release(evhtp_request_t *req, void *arg)
{
    kv_take(req, rank_of(arg)->sim, 1);
}

static void kv_take(evhtp_request_t *req, struct sim *s, int release)
{
    size_t len;
    const char *body = body_of(req, &len);
    cJSON *o = cJSON_ParseWithLength(body, len);
    const cJSON *room = cJSON_GetObjectItemCaseSensitive(o, "bootstrap_room");
    const cJSON *eid = cJSON_GetObjectItemCaseSensitive(o, "remote_engine_id");
    const cJSON *rid = cJSON_GetObjectItemCaseSensitive(o, "remote_request_id");
    const cJSON *sig = cJSON_GetObjectItemCaseSensitive(o, "block_sig");
    char key[260], msg[400];
    if (cJSON_IsString(room)) {
        snprintf(key, sizeof key, "room:%s", room->valuestring);
    } else if (cJSON_IsString(eid) && cJSON_IsString(rid) && cJSON_IsString(sig)) {
        snprintf(key, sizeof key, "req:%.240s", rid->valuestring);
    } else {
        cJSON_Delete(o);
        reply_error(req, 400, "kv pull needs bootstrap_room, or remote_engine_id + remote_request_id + block_sig");
        return;
    }
    struct sim_lease *l = sim_lease_find(&s->leases, key);
    if (!l) {
        cJSON_Delete(o);
        if (cJSON_IsString(room)) {
            reply_error(req, 409, "bootstrap room not registered yet");
            return;
        }
        snprintf(msg, sizeof msg, "no KV held for remote_request_id '%.200s' (expired, already pulled, or never "
                                  "issued)", key + 4);
        reply_error(req, 404, msg);
        return;
    }
    if (!cJSON_IsString(room)) {
        char want[32];
        snprintf(want, sizeof want, "%016" PRIx64, l->block_sig);
        if (strcmp(l->engine_id, eid->valuestring) != 0 || strcmp(want, sig->valuestring) != 0) {
            snprintf(msg, sizeof msg, "remote_engine_id or remote_block_ids do not match the KV held for '%.200s'",
                     key + 4);
            cJSON_Delete(o);
            reply_error(req, 404, msg);
            return;
        }
    }
    cJSON_Delete(o);
    l = sim_lease_take(&s->leases, key);
    if (release) {
        s->leases_cancelled++;
        lease_drop(s, l);
        reply_raw(req, 200, "application/json", "{\"released\":true}", 17);
        return;
    }
    s->leases_released++;
    s->kv_bytes_sent += l->kv_len;
    reply_raw(req, 200, "application/octet-stream", (const char *)l->kv, l->kv_len);
    lease_drop(s, l);
}

static void on_abort(evhtp_request_t *req, void *arg)
{
    struct sim *s = rank_of(arg)->sim;
    s->abort_calls++;
    size_t len;
    const char *body = body_of(req, &len);
    cJSON *o = cJSON_ParseWithLength(body, len);
    const cJSON *rid = cJSON_GetObjectItemCaseSensitive(o, "rid");
    if (!cJSON_IsString(rid)) {
        cJSON_Delete(o);
        reply_error(req, 400, "abort_request needs a string 'rid'");
        return;
    }
    int n = 0;
    struct sreq *r, *next;
    for (r = LIST_FIRST(&s->all); r; r = next) {
        next = LIST_NEXT(r, all);
        if (r->state != SREQ_DONE && strcmp(r->id, rid->valuestring) == 0) {
            char msg[300];
            snprintf(msg, sizeof msg, "request %.200s was aborted (abort_request)", r->id);
            r->aborted = 1;
            s->aborts_requested++;
            sreq_fail(r, 400, msg);
            n++;
        }
    }
    cJSON_Delete(o);
    char out[64];
    int k = snprintf(out, sizeof out, "{\"aborted\":%d}", n);
    reply_raw(req, 200, "application/json", out, (size_t)k);
}

static void metric_head(struct evbuffer *b, const char *name, const char *type, const char *help)
{
    evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void on_metrics(evhtp_request_t *req, void *arg)
{
    struct sim *s = rank_of(arg)->sim;
    struct evbuffer *b = req->buffer_out;
    int lo = 0, hi = s->nranks;
    if (!s->cfg.dp_internal && s->nranks > 1) { /* external: each port reports its own rank */
        lo = rank_of(arg)->idx;
        hi = lo + 1;
    }
    const char *m = s->model_json;
    struct {
        const char *name, *type, *help;
        int which;
    } per_rank[] = {
        {"vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", 0},
        {"vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", 1},
        {"vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", 2},
        {"vllm:gpu_cache_usage_perc", "gauge", "GPU KV-cache usage (older name).", 2},
        {"vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", 3},
        {"vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", 4},
        {"vllm:request_success_total", "counter", "Count of successfully processed requests.", 5},
        {"xpyd_sim:requests_total", "counter", "Requests admitted by the simulator.", 6},
        {"xpyd_sim:requests_aborted_total", "counter", "Requests aborted (client disconnect or abort_request).", 7},
    };
    for (size_t i = 0; i < sizeof per_rank / sizeof per_rank[0]; i++) {
        metric_head(b, per_rank[i].name, per_rank[i].type, per_rank[i].help);
        for (int k = lo; k < hi; k++) {
            struct sim_rank *rk = &s->ranks[k];
            double cap = s->cfg.kv_capacity_tokens > 0 ? (double)s->cfg.kv_capacity_tokens
                                                       : (double)s->cfg.max_batch * (double)s->cfg.max_model_len;
            double v = 0;
            switch (per_rank[i].which) {
            case 0: v = (double)rk->running; break;
            case 1: v = (double)rk->waiting_n; break;
            case 2: v = cap > 0 ? (double)rk->kv_tokens_running / cap : 0; break;
            case 3: v = (double)rk->prompt_tokens_total; break;
            case 4: v = (double)rk->generation_tokens_total; break;
            case 5: v = (double)rk->success_total; break;
            case 6: v = (double)rk->requests_total; break;
            default: v = (double)rk->aborted_total; break;
            }
            evbuffer_add_printf(b, "%s{engine=\"%d\",model_name=\"%s\"} %.17g\n", per_rank[i].name, k, m, v);
        }
    }
    metric_head(b, "xpyd_sim:handoffs_total", "counter", "KV handoffs on the decode side, by mode and result.");
    for (int mo = 0; mo < 5; mo++)
        for (int res = 0; res < HO_NRESULTS; res++)
            if (mo != SIM_HANDOFF_NONE)
            evbuffer_add_printf(b, "xpyd_sim:handoffs_total{mode=\"%s\",result=\"%s\"} %" PRIu64 "\n",
                                sim_handoff_name(mo), ho_result_names[res], s->handoffs[mo][res]);
    struct {
        const char *name, *type, *help;
        uint64_t v;
    } g[] = {
        {"xpyd_sim:kv_leases_active", "gauge", "KV leases held by this prefill, waiting to be pulled.",
         (uint64_t)s->leases.count},
        {"xpyd_sim:kv_leases_created_total", "counter", "KV leases created.", s->leases_created},
        {"xpyd_sim:kv_leases_released_total", "counter", "KV leases pulled by a decode and freed.",
         s->leases_released},
        {"xpyd_sim:kv_leases_expired_total", "counter", "KV leases that expired unpulled (stranded KV).",
         s->leases_expired},
        {"xpyd_sim:kv_leases_aborted_total", "counter", "KV leases dropped because their request was aborted.",
         s->leases_aborted},
        {"xpyd_sim:kv_leases_cancelled_total", "counter",
         "KV leases freed because their decode was aborted before pulling (/kv/release).", s->leases_cancelled},
        {"xpyd_sim:kv_release_notices_total", "counter", "Releases this decode sent for KV it never pulled.",
         s->release_notices},
        {"xpyd_sim:kv_bytes_sent_total", "counter", "KV bytes served to decodes or written to the store.",
         s->kv_bytes_sent},
        {"xpyd_sim:kv_bytes_received_total", "counter", "KV bytes pulled or read from the store.",
         s->kv_bytes_received},
        {"xpyd_sim:abort_requests_total", "counter", "Requests cancelled through /abort_request.",
         s->aborts_requested},
        {"xpyd_sim:kv_xpyd_releases_total", "counter", "KV leases released by an xpyd notification.",
         s->xt_releases},
        {"xpyd_sim:abort_request_calls_total", "counter", "POST /abort_request calls received (found or not).",
         s->abort_calls},
    };
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
        metric_head(b, g[i].name, g[i].type, g[i].help);
        evbuffer_add_printf(b, "%s %" PRIu64 "\n", g[i].name, g[i].v);
    }
    uint64_t pending = 0; /* streamed bytes written by the engine that its peer has not taken yet */
    for (struct sreq *q = LIST_FIRST(&s->all); q; q = LIST_NEXT(q, all)) {
        if (q->stream_started && q->ereq) {
            struct bufferevent *bev = evhtp_connection_get_bev(evhtp_request_get_connection(q->ereq));
            if (bev)
                pending += evbuffer_get_length(bufferevent_get_output(bev));
        }
    }
    metric_head(b, "xpyd_sim:stream_bytes_pending", "gauge",
                "Streamed bytes waiting in this engine because its reader (the router) is not taking them.");
    evbuffer_add_printf(b, "xpyd_sim:stream_bytes_pending %" PRIu64 "\n", pending);
    metric_head(b, "xpyd_sim:faults_injected_total", "counter", "Faults injected, by kind.");
    evbuffer_add_printf(b, "xpyd_sim:faults_injected_total{kind=\"fail_rate\"} %" PRIu64 "\n", s->faults_fail_rate);
    evbuffer_add_printf(b, "xpyd_sim:faults_injected_total{kind=\"status_code\"} %" PRIu64 "\n", s->faults_status);
    evbuffer_add_printf(b, "xpyd_sim:faults_injected_total{kind=\"disconnect\"} %" PRIu64 "\n", s->faults_disconnect);
    evbuffer_add_printf(b, "xpyd_sim:faults_injected_total{kind=\"stall\"} %" PRIu64 "\n", s->faults_stall);
    reply_raw(req, 200, "text/plain; version=0.0.4", "", 0);
}

static void on_not_found(evhtp_request_t *req, void *arg)
{
    reply_error(req, 404, "Not Found");
}

/* ---------- setup ---------- */

static void on_sweep(evutil_socket_t fd, short ev, void *arg)
{
    struct sim *s = arg;
    size_t n = sim_lease_expire(&s->leases, xpyd_now_us());
    if (n) {
        s->leases_expired += n;
        XLOG_WARN("msg=\"KV leases expired unpulled\" count=%zu", n);
    }
}

static void on_signal(evutil_socket_t sig, short ev, void *arg)
{
    struct sim *s = arg;
    event_base_loopexit(s->base, NULL);
}

static evhtp_res on_accept(evhtp_connection_t *c, void *arg)
{
    xpyd_tcp_nodelay(c->sock);
    return EVHTP_RES_OK;
}

static evhtp_t *make_server(struct sim *s, struct sim_rank *rk, int port, int kv_only)
{
    evhtp_t *h = evhtp_new(s->base, rk);
    if (!h)
        return NULL;
    evhtp_set_max_body_size(h, (uint64_t)s->cfg.max_body_bytes);
    evhtp_set_post_accept_cb(h, on_accept, NULL);
    evhtp_set_cb(h, "/kv/pull", on_kv_pull, rk);
    evhtp_set_cb(h, "/kv/release", on_kv_release, rk);
    if (!kv_only) {
        evhtp_set_cb(h, "/v1/completions", on_completions, rk);
        evhtp_set_cb(h, "/v1/chat/completions", on_chat, rk);
        evhtp_set_cb(h, "/v1/models", on_models, rk);
        evhtp_set_cb(h, "/health", on_health, rk);
        evhtp_set_cb(h, "/metrics", on_metrics, rk);
        evhtp_set_cb(h, "/tokenize", on_tokenize, rk);
        evhtp_set_cb(h, "/abort_request", on_abort, rk);
    }
    evhtp_set_gencb(h, on_not_found, rk);
    char addr[300];
    if (strchr(s->cfg.host, ':'))
        snprintf(addr, sizeof addr, "ipv6:%s", s->cfg.host);
    else
        snprintf(addr, sizeof addr, "%s", s->cfg.host);
    if (evhtp_bind_socket(h, addr, (uint16_t)port, 4096) != 0) {
        XLOG_ERR("msg=\"cannot listen\" host=%s port=%d errno=%d", s->cfg.host, port, errno);
        evhtp_free(h);
        return NULL;
    }
    if (port == 0) { /* ephemeral: learn what the kernel gave us */
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        getsockname(evconnlistener_get_fd(h->server), (struct sockaddr *)&ss, &sl);
        s->cfg.port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                     : ((struct sockaddr_in *)&ss)->sin_port);
    }
    return h;
}

const char *sim_role_name(int role)
{
    return role == SIM_ROLE_PREFILL ? "prefill" : role == SIM_ROLE_DECODE ? "decode" : "both";
}

const char *sim_handoff_name(int h)
{
    static const char *const n[] = {"kv-params", "store", "bootstrap", "none", "xpyd"};
    return h >= 0 && h <= 4 ? n[h] : "?";
}

int sim_run(const struct sim_config *cfg)
{
    struct sim *s = XPYD_XALLOC(calloc(1, sizeof *s));
    int rc = 1;
    s->cfg = *cfg;
    xpyd_log_level = cfg->log_level;
    s->rng = xpyd_mix64(cfg->seed ^ 0xabcdefu ^ (uint64_t)cfg->port);
    LIST_INIT(&s->all);
    json_escape_into(cfg->model, s->model_json, sizeof s->model_json);
    signal(SIGPIPE, SIG_IGN);
    xpyd_raise_nofile();
    if (cfg->startup_delay_ms > 0)
        usleep((useconds_t)cfg->startup_delay_ms * 1000u);
    if (cfg->handoff == SIM_HANDOFF_STORE && mkdir(cfg->store_dir, 0755) != 0 && errno != EEXIST) {
        XLOG_ERR("msg=\"cannot create store dir\" dir=%s errno=%d", cfg->store_dir, errno);
        free(s);
        return 1;
    }
    struct event_config *ec = event_config_new();
    event_config_require_features(ec, EV_FEATURE_EARLY_CLOSE);
    event_config_set_flag(ec, EVENT_BASE_FLAG_PRECISE_TIMER); /* sub-millisecond token timing */
    s->base = event_base_new_with_config(ec);
    event_config_free(ec);
    if (!s->base) {
        s->base = event_base_new(); /* no early-close: disconnects are noticed on the next write */
        XLOG_WARN("msg=\"event backend without early close detection\"");
    }
    s->nranks = cfg->dp_size;
    s->ranks = XPYD_XALLOC(calloc((size_t)s->nranks, sizeof *s->ranks));
    uint64_t nonce = xpyd_mix64(xpyd_now_us() ^ (uint64_t)getpid());
    for (int i = 0; i < s->nranks; i++) {
        struct sim_rank *rk = &s->ranks[i];
        rk->sim = s;
        rk->idx = i;
        TAILQ_INIT(&rk->waiting);
        int port = cfg->dp_internal ? cfg->port : cfg->port + i;
        snprintf(rk->engine_id, sizeof rk->engine_id, "xpyd-sim-%d-dp%d-%08" PRIx64, port, i, nonce & 0xffffffffu);
        if (!cfg->dp_internal || i == 0) {
            rk->htp = make_server(s, rk, port, 0);
            if (!rk->htp)
                goto out;
        }
        rk->port = (cfg->dp_internal || port == 0) ? s->cfg.port : port;
    }
    if (cfg->bootstrap_port) {
        s->bootstrap_htp = make_server(s, &s->ranks[0], cfg->bootstrap_port, 1);
        if (!s->bootstrap_htp)
            goto out;
    }
    if (cfg->handoff == SIM_HANDOFF_XPYD) {
        char name[64];
        snprintf(name, sizeof name, "xpyd-sim-%d", s->cfg.port);
        struct xt_config xc = {.name = name, .listen_host = cfg->host, .transport = "auto", .threads = 2,
                               .io_timeout_ms = (int)(cfg->handoff_timeout_ms > 0 ? cfg->handoff_timeout_ms : 10000)};
        int xrc = xt_engine_create(&xc, &s->xt);
        if (xrc) {
            XLOG_ERR("msg=\"cannot start the transfer engine\" error=\"%s\"", strerror(-xrc));
            goto out;
        }
        s->leases.on_drop = lease_unregister;
        s->leases.on_drop_arg = s;
        s->xt_ev = event_new(s->base, xt_engine_event_fd(s->xt), EV_READ | EV_PERSIST, xt_on_event, s);
        event_add(s->xt_ev, NULL);
    }
    s->sweep_ev = event_new(s->base, -1, EV_PERSIST, on_sweep, s);
    struct timeval sweep = {0, 50000};
    event_add(s->sweep_ev, &sweep);
    s->sig_int = evsignal_new(s->base, SIGINT, on_signal, s);
    s->sig_term = evsignal_new(s->base, SIGTERM, on_signal, s);
    event_add(s->sig_int, NULL);
    event_add(s->sig_term, NULL);
    if (cfg->port_file[0]) {
        char tmp[600];
        snprintf(tmp, sizeof tmp, "%s.tmp", cfg->port_file);
        FILE *pf = fopen(tmp, "w");
        if (!pf || fprintf(pf, "%d\n", s->cfg.port) < 0 || fclose(pf) != 0 || rename(tmp, cfg->port_file) != 0) {
            XLOG_ERR("msg=\"cannot write port file\" path=%s", cfg->port_file);
            goto out;
        }
    }
    XLOG_INFO("msg=\"xpyd_sim ready\" role=%s host=%s port=%d dp=%d dp_mode=%s handoff=%s model=%s",
              sim_role_name(cfg->role), cfg->host, s->cfg.port, cfg->dp_size,
              cfg->dp_internal ? "internal" : "external", sim_handoff_name(cfg->handoff), cfg->model);
    fflush(stderr);
    event_base_dispatch(s->base);
    rc = 0;
out:
    for (int i = 0; i < s->nranks; i++)
        if (s->ranks[i].htp) {
            evhtp_unbind_socket(s->ranks[i].htp);
            evhtp_free(s->ranks[i].htp);
        }
    if (s->bootstrap_htp) {
        evhtp_unbind_socket(s->bootstrap_htp);
        evhtp_free(s->bootstrap_htp);
    }
    if (s->sweep_ev)
        event_free(s->sweep_ev);
    if (s->sig_int)
        event_free(s->sig_int);
    if (s->sig_term)
        event_free(s->sig_term);
    if (s->xt_ev)
        event_free(s->xt_ev);
    sim_lease_clear(&s->leases);
    if (s->xt)
        xt_engine_destroy(s->xt); /* reads still in flight end with it; their buffers go below */
    for (struct xpull *xp = s->pulls, *next; xp; xp = next) {
        next = xp->next;
        free(xp->buf);
        free(xp);
    }
    XLOG_INFO("msg=\"xpyd_sim stopped\" port=%d", s->cfg.port);
    /* Connections still open are reclaimed by the OS at exit; evhtp has no safe bulk close for them. */
    free(s->ranks);
    free(s);
    return rc;
}
