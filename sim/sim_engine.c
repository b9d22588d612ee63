/* SPDX-License-Identifier: Apache-2.0 */
/* sim_engine.c - a simulated request's life: per-rank scheduling (max_batch running slots, a FIFO of waiting
 * requests), the handoff legs (KV leases, pulls, the store, bootstrap rooms, libxpyd_transfer reads),
 * generation and streaming, faults.
 *
 * A request (struct sreq) lives from the moment its body is validated until libevhtp frees the underlying
 * evhtp request (the request_fini hook), which is the single place a sreq is freed. Every other path (done,
 * error, abort, client disconnect) goes through sim_sreq_release(), which is idempotent and returns the slot,
 * cancels timers and pulls, and counts what happened. */
#include "sim_internal.h"
#include "xpyd_reply.h"

#include "xpyd_oai.h"
#include "xpyd_sse.h"
#include "xpyd_util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
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

const char *const ho_result_names[HO_NRESULTS] = {"done", "failed", "recomputed"};

/* ---------- request lifecycle ---------- */

evhtp_res sim_on_request_fini(evhtp_request_t *req, void *arg)
{
    struct sreq *r = arg;
    r->ereq = NULL;
    if (r->state != SREQ_DONE) { /* the client went away before we answered */
        r->aborted = 1;
        sim_sreq_release(r);
    }
    LIST_REMOVE(r, all);
    sim_params_free(&r->p);
    if (r->pull_buf)
        evbuffer_free(r->pull_buf);
    if (r->text)
        evbuffer_free(r->text);
    cJSON_Delete(r->kv_out);
    free(r);
    return EVHTP_RES_OK;
}

void sim_on_client_closed(evutil_socket_t fd, short ev, void *arg)
{
    struct sreq *r = arg;
    event_free(r->close_ev);
    r->close_ev = NULL;
    if (r->state == SREQ_DONE || !r->ereq)
        return;
    r->aborted = 1;
    sim_sreq_release(r);
    /* Let libevhtp see the EOF itself; it frees the connection and calls sim_on_request_fini. */
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

void sim_pump_waiting(struct sim_rank *rk)
{
    while (!TAILQ_EMPTY(&rk->waiting) && rank_has_room(rk, TAILQ_FIRST(&rk->waiting)->p.prompt.n)) {
        struct sreq *w = TAILQ_FIRST(&rk->waiting);
        TAILQ_REMOVE(&rk->waiting, w, wq);
        rk->waiting_n--;
        sim_sreq_start(w);
    }
}

static void pull_cancel(struct sreq *r)
{
    if (r->pull_leg) {
        up_leg_cancel(r->pull_leg);
        r->pull_leg = NULL;
    }
}

/* The endpoint index of a peer (a prefill this decode pulls from or notifies), added on first use. -1 when it
 * cannot be resolved or the table is full. */
int sim_peer(struct sim *s, const char *host, int port)
{
    for (size_t i = 0; i < s->npeers; i++)
        if (s->peers[i].port == port && strcmp(s->peers[i].host, host) == 0)
            return (int)i;
    if (s->npeers == SIM_MAX_PEERS || up_endpoint_resolve(&s->peers[s->npeers], host, port) != 0)
        return -1;
    s->peers[s->npeers].tls = s->tls_client != NULL; /* --upstream-ca: peers are spoken to over TLS */
    return (int)s->npeers++;
}

/* A POST of a small JSON body to a peer through common/'s HTTP client. */
static struct up_leg *peer_post(struct sim *s, const char *host, int port, const char *path, const char *body,
                                long timeout_ms, const struct up_leg_cbs *cbs, void *arg)
{
    int ep = sim_peer(s, host, port);
    if (ep < 0)
        return NULL;
    struct evbuffer *b = XPYD_XALLOC(evbuffer_new());
    up_request_line(b, &s->peers[ep], "POST", path);
    evbuffer_add_printf(b, "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s", strlen(body), body);
    struct up_timeouts to = {timeout_ms, timeout_ms, timeout_ms};
    struct up_leg *leg = up_leg_start(s->up, ep, b, &to, cbs, arg);
    evbuffer_free(b);
    return leg;
}

void sim_sreq_release(struct sreq *r)
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
        sim_notify_release(r);
    if (r->aborted) {
        rk->aborted_total++;
        if (r->lease_key[0]) { /* a prefill aborted after registering KV: drop it */
            struct sim_lease *l = sim_lease_take(&r->sim->leases, r->lease_key);
            if (l) {
                r->sim->leases_aborted++;
                sim_lease_drop(r->sim, l);
            }
        }
    }
    if (r->in_slot) {
        r->in_slot = 0;
        rk->running--;
        rk->kv_tokens_running -= r->p.prompt.n + r->pos;
        sim_pump_waiting(rk);
    }
}

void sim_sreq_schedule(struct sreq *r, uint64_t us)
{
    struct timeval tv = sim_us_to_tv(us);
    if (!r->timer)
        r->timer = XPYD_XALLOC(event_new(r->sim->base, -1, 0, sim_sreq_tick, r));
    event_add(r->timer, &tv);
}

/* Sends a whole non-streamed answer for a paused request and ends it. */
void sim_sreq_reply(struct sreq *r, int status, const char *ctype, const char *body, size_t len)
{
    evhtp_request_t *req = r->ereq;
    sim_sreq_release(r);
    if (!req)
        return;
    xpyd_reply(req, status, ctype, body, len);
    evhtp_request_resume(req);
}

void sim_sreq_fail(struct sreq *r, int status, const char *msg)
{
    char *body = xpyd_oai_error_json(status, NULL, msg, NULL);
    if (r->stream_started && r->ereq) { /* mid-stream: one error event, then [DONE] */
        evhtp_request_t *req = r->ereq;
        struct evbuffer *b = evbuffer_new();
        xpyd_sse_write(b, body, strlen(body));
        xpyd_sse_write_done(b);
        sim_sreq_release(r);
        evhtp_send_reply_chunk(req, b);
        evhtp_send_reply_chunk_end(req);
        evhtp_request_resume(req);
        evbuffer_free(b);
    } else {
        sim_sreq_reply(r, status, "application/json", body, strlen(body));
    }
    free(body);
}

/* Cuts the client's connection without an answer (--fail-after-tokens). */
void sim_sreq_cut(struct sreq *r)
{
    r->sim->faults_disconnect++;
    evhtp_request_t *req = r->ereq;
    r->aborted = 1;
    sim_sreq_release(r);
    if (req)
        evhtp_connection_free(evhtp_request_get_connection(req));
}

/* ---------- handoff: KV leases, store, pulls ---------- */

/* Local prefill: computes what the cache does not hold. */
static void prefill_locally(struct sreq *r)
{
    long cached = sim_prefix_store(r, 1);
    r->cached_tokens = cached;
    r->state = SREQ_PREFILL;
    uint64_t cost = (uint64_t)r->sim->cfg.prefill_us_per_token * (r->p.prompt.n - (size_t)cached);
    if (r->sim->cfg.prefill_serial) { /* queued behind the prompts the rank is already computing */
        uint64_t now = xpyd_now_us(), start = r->rank->prefill_free_at > now ? r->rank->prefill_free_at : now;
        r->rank->prefill_free_at = start + cost;
        cost = r->rank->prefill_free_at - now;
    }
    sim_sreq_schedule(r, cost);
}

static void handoff_finished(struct sreq *r, int result)
{
    r->sim->handoffs[r->ho_mode][result]++;
    if (result == HO_DONE) {
        r->cached_tokens = (long)r->p.prompt.n; /* the whole prompt came from the remote KV */
        sim_prefix_store(r, 0);                      /* and is now in this rank's prefix cache */
        r->state = SREQ_DECODE;
        sim_sreq_schedule(r, (uint64_t)r->sim->cfg.decode_us_per_token);
    } else {
        prefill_locally(r);
    }
}

static void pull_send(struct sreq *r);

static void pull_head(struct up_leg *leg, int status, void *arg)
{
    ((struct sreq *)arg)->pull_status = status;
}

static void pull_body(struct up_leg *leg, const char *data, size_t len, void *arg)
{
    struct sreq *r = arg;
    if (evbuffer_get_length(r->pull_buf) < (64u << 20)) /* far above any simulated KV */
        evbuffer_add(r->pull_buf, data, len);
}

/* The pull's answer (err: it could not be had; the leg is gone after this). */
static void on_pull_done(struct up_leg *leg, int err, void *arg)
{
    struct sreq *r = arg;
    r->pull_leg = NULL;
    if (r->state != SREQ_HANDOFF)
        return;
    int code = err ? 0 : r->pull_status;
    struct evbuffer *in = r->pull_buf;
    size_t len = in ? evbuffer_get_length(in) : 0;
    const unsigned char *data = len ? evbuffer_pullup(in, -1) : NULL;
    char msg[600];
    if (code == 200) {
        if (!sim_kv_verify(r, data, len)) {
            r->sim->handoffs[r->ho_mode][HO_FAILED]++;
            sim_sreq_fail(r, 500, "KV transfer failed: the pulled KV does not match this request's prompt "
                              "(integrity check failed)");
            return;
        }
        r->sim->kv_bytes_received += len;
        pull_cancel(r);
        handoff_finished(r, HO_DONE);
        return;
    }
    int rendezvous = r->p.h.has_bootstrap || r->p.h.transfer_id;
    if (code == 409 && rendezvous && xpyd_now_us() < r->deadline_us) {
        sim_sreq_schedule(r, 2000); /* the prefill has not registered the room (transfer) yet: poll again */
        return;
    }
    r->sim->handoffs[r->ho_mode][HO_FAILED]++;
    if (code == 0) {
        const char *host = r->p.h.has_bootstrap ? r->p.h.bootstrap_host : r->p.h.remote_host;
        int port = r->p.h.has_bootstrap ? r->p.h.bootstrap_port : r->p.h.remote_port;
        snprintf(msg, sizeof msg, "KV transfer failed: could not reach the prefill engine at %s:%d", host, port);
        sim_sreq_fail(r, 500, msg);
    } else if (code == 409 && r->p.h.transfer_id) {
        snprintf(msg, sizeof msg, "KV transfer failed: the prefill did not produce transfer_id %.200s within %ld ms",
                 r->p.h.transfer_id, r->sim->cfg.handoff_timeout_ms);
        sim_sreq_fail(r, 500, msg);
    } else if (code == 409) {
        snprintf(msg, sizeof msg, "KV transfer failed: bootstrap room %" PRIu64 " was not ready within %ld ms",
                 r->p.h.bootstrap_room, r->sim->cfg.handoff_timeout_ms);
        sim_sreq_fail(r, 500, msg);
    } else {
        snprintf(msg, sizeof msg, "kv_transfer_params rejected by the prefill engine (HTTP %d): %.*s", code,
                 (int)(len > 400 ? 400 : len), data ? (const char *)data : "");
        sim_sreq_fail(r, 400, msg);
    }
}

static char *pull_json(const struct sreq *r)
{
    cJSON *o = XPYD_XALLOC(cJSON_CreateObject());
    char sig[32];
    if (r->p.h.has_bootstrap) {
        snprintf(sig, sizeof sig, "%" PRIu64, r->p.h.bootstrap_room);
        cJSON_AddStringToObject(o, "bootstrap_room", sig);
    } else if (r->p.h.transfer_id) {
        cJSON_AddStringToObject(o, "transfer_id", r->p.h.transfer_id);
        cJSON_AddStringToObject(o, "remote_engine_id", r->p.h.remote_engine_id);
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

/* A decode aborted before it pulled its KV tells the prefill to free it (as vLLM's connectors do), so an
 * abandoned request leaves nothing stranded. Fire and forget. */
void sim_notify_release(struct sreq *r)
{
    static const struct up_leg_cbs cbs = {NULL, NULL, NULL, NULL, NULL, NULL};
    char *body = pull_json(r);
    peer_post(r->sim, r->p.h.remote_host, r->p.h.remote_port, "/kv/release", body, 5000, &cbs, NULL);
    free(body);
    r->sim->release_notices++;
}

static void pull_send(struct sreq *r)
{
    struct sim *s = r->sim;
    const char *host = r->p.h.has_bootstrap ? r->p.h.bootstrap_host : r->p.h.remote_host;
    int port = r->p.h.has_bootstrap ? r->p.h.bootstrap_port : r->p.h.remote_port;
    if (r->pull_buf)
        evbuffer_drain(r->pull_buf, evbuffer_get_length(r->pull_buf));
    else
        r->pull_buf = XPYD_XALLOC(evbuffer_new());
    r->pull_status = 0;
    static const struct up_leg_cbs cbs = {pull_head, pull_body, on_pull_done, NULL, NULL, NULL};
    char *body = pull_json(r);
    r->pull_leg = peer_post(s, host, port, "/kv/pull", body, s->cfg.handoff_timeout_ms, &cbs, r);
    free(body);
    if (!r->pull_leg)
        on_pull_done(NULL, -EHOSTUNREACH, r);
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
    if (st == XT_COMPLETED && sim_kv_verify(r, xp->buf, xp->len)) {
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
    sim_sreq_fail(r, 500, st == XT_COMPLETED ? "KV transfer failed: the KV read does not match this request's prompt "
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
    sim_sreq_fail(r, 500, msg);
}

/* The engine's event fd fired. Decode: reads that finished. Prefill: "release <key>" notifications from
 * decodes (after their read) and from the router (when the request died before any decode read). */
void sim_xt_on_event(evutil_socket_t fd, short ev, void *arg)
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
            sim_lease_drop(s, l);
        }
}

/* ---------- scheduling and generation ---------- */

/* Takes a slot and begins: the KV handoff (decode side), else local prefill compute. */
void sim_sreq_start(struct sreq *r)
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
        r->ho_mode = boot ? SIM_HANDOFF_BOOTSTRAP : r->p.h.transfer_id ? SIM_HANDOFF_MOONCAKE : SIM_HANDOFF_KV_PARAMS;
        r->deadline_us = xpyd_now_us() + (uint64_t)s->cfg.handoff_timeout_ms * 1000u;
        pull_send(r);
    } else if (store) {
        r->state = SREQ_HANDOFF;
        r->ho_mode = SIM_HANDOFF_STORE;
        r->deadline_us = xpyd_now_us() + (uint64_t)s->cfg.store_wait_ms * 1000u;
        sim_sreq_schedule(r, 0);
    } else {
        prefill_locally(r);
    }
}

void sim_sreq_admit(struct sreq *r)
{
    struct sim_rank *rk = r->rank;
    if (TAILQ_EMPTY(&rk->waiting) && rank_has_room(rk, r->p.prompt.n)) { /* FIFO: no overtaking the queue */
        sim_sreq_start(r);
    } else {
        r->state = SREQ_WAITING;
        TAILQ_INSERT_TAIL(&rk->waiting, r, wq);
        rk->waiting_n++;
    }
}

/* The finished non-streamed answer, and the request ends. */
static void sreq_send_final_json(struct sreq *r)
{
    char *body = sim_final_json(r);
    r->rank->success_total++;
    sim_kv_transfer_header(r);
    sim_sreq_reply(r, 200, "application/json", body, strlen(body));
    free(body);
}

/* Streams token `tok`; the last one also carries the usage chunk and [DONE], and the request ends. */
static void stream_token(struct sreq *r, const char *tok, int last)
{
    struct evbuffer *b = sim_token_event(r, tok, last);
    if (last) {
        evhtp_request_t *req = r->ereq;
        r->rank->success_total++;
        sim_sreq_release(r);
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
        sim_store_write(r);
    if (r->p.h.transfer_id && r->p.h.do_remote_decode && s->cfg.role != SIM_ROLE_DECODE) {
        if (sim_register_transfer(r) != 0) {
            sim_sreq_fail(r, 400, "transfer_id is already in use on this prefill engine");
            return;
        }
    } else if (r->p.h.do_remote_decode && s->cfg.role != SIM_ROLE_DECODE && sim_register_kv_params(r) != 0) {
        sim_sreq_fail(r, 500, "could not register the KV lease");
        return;
    }
    if (r->p.h.has_bootstrap && s->cfg.role == SIM_ROLE_PREFILL) {
        if (sim_register_room(r) == -EEXIST) {
            sim_sreq_fail(r, 400, "bootstrap_room is already in use on this prefill engine");
            return;
        }
    }
    r->state = SREQ_DECODE;
}

static void store_poll(struct sreq *r)
{
    int found = sim_store_read(r);
    if (found == 1)
        handoff_finished(r, HO_DONE);
    else if (found == 0 && xpyd_now_us() < r->deadline_us)
        sim_sreq_schedule(r, 2000);
    else
        handoff_finished(r, HO_RECOMPUTED);
}

/* Bytes of r's stream written and not yet taken by its reader. */
static size_t stream_unsent(const struct sreq *r)
{
    evhtp_connection_t *c = r->stream_started && r->ereq ? evhtp_request_get_connection(r->ereq) : NULL;
    struct bufferevent *bev = c ? evhtp_connection_get_bev(c) : NULL;
    return bev ? evbuffer_get_length(bufferevent_get_output(bev)) : 0;
}

static void generate_one(struct sreq *r)
{
    struct sim *s = r->sim;
    char tok[32];
    if (r->p.stream && stream_unsent(r) > (size_t)s->cfg.stream_buffer_bytes) {
        /* backpressure: the reader is not taking the stream; look again in a millisecond, the cadence
         * restarting once it does */
        s->stream_waits++;
        r->next_due_us = 0;
        sim_sreq_schedule(r, 1000);
        return;
    }
    if (s->cfg.recompute_after_tokens >= 0 && s->cfg.role != SIM_ROLE_PREFILL &&
        (long)r->pos >= s->cfg.recompute_after_tokens) { /* preempted: given up, as vLLM-Ascend reports it */
        r->finish_reason = "abort";
        r->stop_reason = "recomputed";
        if (r->p.stream) {
            if (!r->stream_started)
                sim_stream_begin(r);
            stream_token(r, "", 1);
        } else {
            sreq_send_final_json(r);
        }
        return;
    }
    if (r->pos == 0)
        r->ctx = r->p.prompt.hash;
    uint32_t id = sim_gen_token(r->ctx, s->cfg.seed);
    sim_token_text(id, tok, sizeof tok);
    r->ctx = sim_ctx_extend(r->ctx, id);
    r->pos++;
    r->rank->generation_tokens_total++;
    r->rank->kv_tokens_running++;
    int last = 0;
    if ((long)r->pos >= r->p.max_tokens) {
        last = 1;
        r->finish_reason = "length";
    } else if (!r->p.ignore_eos && (long)r->pos >= r->p.min_tokens &&
               sim_gen_eos(r->ctx, s->cfg.seed, s->cfg.eos_prob)) {
        last = 1;
        r->finish_reason = "stop";
    }
    if (s->cfg.fail_after_tokens >= 0 && (long)r->pos > s->cfg.fail_after_tokens) {
        sim_sreq_cut(r);
        return;
    }
    if (r->p.stream) {
        if (!r->stream_started)
            sim_stream_begin(r);
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
        sim_sreq_schedule(r, r->next_due_us > now ? r->next_due_us - now : 0);
    }
}

void sim_sreq_tick(evutil_socket_t fd, short ev, void *arg)
{
    struct sreq *r = arg;
    switch (r->state) {
    case SREQ_STALLED:
        sim_sreq_admit(r);
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

