/* SPDX-License-Identifier: Apache-2.0 */
/* server.c - the router's HTTP front: the routes, each event-loop thread's state, and what is answered before
 * a request object exists (authentication, method, draining, body size, JSON validation). A valid generate
 * request becomes a struct request (request.h) driven by the handoff mode chosen by --handoff. */
#include "access_log.h"
#include "body_src.h"
#include "handoff.h"
#include "loopguard.h"
#include "kv_sub.h"
#include "prompt.h"
#include "request.h"
#include "admission.h"
#include "tokenize.h"

#include "xpyd_util.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <evhtp/evhtp.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include <strings.h>
#include <sys/random.h>
#include <unistd.h>

/* ---------- request headers forwarded to engines ---------- */

static int hop_by_hop(const char *k)
{
    static const char *const skip[] = {"connection", "keep-alive", "proxy-connection", "proxy-authorization",
                                       "te", "trailer", "transfer-encoding", "upgrade", "host", "content-length",
                                       "content-type", "x-request-id", "accept-encoding", "x-data-parallel-rank",
                                       XPYD_TOO_LARGE_HEADER, XPYD_BODY_MEMORY_HEADER,
                                       "x-xpyd-via", /* loopguard.c adds its own */
                                       "expect", NULL};
    for (int i = 0; skip[i]; i++)
        if (strcasecmp(k, skip[i]) == 0)
            return 1;
    return 0;
}

static int collect_header(evhtp_kv_t *kv, void *arg)
{
    struct evbuffer *b = arg;
    if (kv->key && kv->val && !hop_by_hop(kv->key) && !strpbrk(kv->val, "\r\n")) {
        evbuffer_add(b, kv->key, strlen(kv->key));
        evbuffer_add(b, ": ", 2);
        evbuffer_add(b, kv->val, strlen(kv->val));
        evbuffer_add(b, "\r\n", 2);
    }
    return 0;
}

static void new_request_id(char *out, size_t cap);
static int client_request_id(evhtp_request_t *req, char *out, size_t cap);

/* The access-log line of a request refused before it got a request object: counted under its failure reason,
 * with the client's request id (or one of the router's, as a routed request gets). */
static void rejected(evhtp_request_t *req, int kind, int status, int fail)
{
    atomic_fetch_add(&g_rt->ctr.requests[kind][status], 1);
    atomic_fetch_add(&g_rt->ctr.outcomes[kind][rt_fail_table[fail].outcome], 1);
    atomic_fetch_add(&g_rt->ctr.errors[fail], 1);
    if (!g_rt->cfg.access_log)
        return;
    char xid[128], client[64];
    if (!client_request_id(req, xid, sizeof xid))
        new_request_id(xid, sizeof xid);
    rt_client_addr(req, client, sizeof client);
    htp_method m = req->method;
    const char *method = m == htp_method_GET ? "GET" : m == htp_method_POST ? "POST" : m == htp_method_HEAD ? "HEAD"
                       : m == htp_method_PUT ? "PUT" : m == htp_method_DELETE ? "DELETE" : "OTHER";
    struct access_entry e = {xid, client, method, kind == RT_EP_CHAT ? "/v1/chat/completions" : "/v1/completions",
                             status, 0, "-", "-", 0, 0, -1, 0, rt_fail_table[fail].name, 0, "-", "-"};
    rt_access_log(&e);
}

/* 128 bits unique across router processes, restarts and threads, so replicas sharing engines never send the
 * same X-Request-Id (vLLM's request id): a random 128-bit key per thread (getrandom, once) mixed with the
 * thread's count of ids (xpyd_mix64 is a bijection: no repeat within a thread; across threads and processes
 * the keys differ). Not a secret: ids go to engines and logs. (getrandom per request was a system call each.) */
static void new_request_id(char *out, size_t cap)
{
    static _Thread_local uint64_t key[2], seq;
    static _Thread_local int keyed;
    if (!keyed) {
        if (getrandom(key, sizeof key, 0) != (ssize_t)sizeof key) { /* never on Linux >= 3.17; still unique */
            key[0] = xpyd_mix64(atomic_fetch_add(&g_rt->id_seq, 1) ^ xpyd_now_us());
            key[1] = xpyd_mix64((uint64_t)getpid() ^ ((uint64_t)g_rt->started_wall << 20) ^ (uint64_t)(uintptr_t)&seq);
        }
        keyed = 1;
    }
    seq++;
    size_t pl = strlen(g_rt->cfg.id_prefix);
    if (pl + 34 > cap) { /* never with the prefix's bound (config.c) and the callers' buffers */
        if (cap)
            *out = '\0';
        return;
    }
    memcpy(out, g_rt->cfg.id_prefix, pl);
    out[pl] = '-';
    char *e = xpyd_put_hex64(xpyd_put_hex64(out + pl + 1, xpyd_mix64(key[0] ^ seq)), xpyd_mix64(key[1] + seq));
    *e = '\0';
}

/* The client's X-Request-Id into out when it is a safe one (printable, no space, quote or backslash: it goes
 * into upstream headers, JSON bodies and log lines as is). 1 when taken. */
static int client_request_id(evhtp_request_t *req, char *out, size_t cap)
{
    const char *xid = evhtp_header_find(req->headers_in, "X-Request-Id");
    if (!xid || !*xid || strlen(xid) >= cap)
        return 0;
    size_t n = 0;
    for (const char *c = xid; *c; c++, n++)
        if (*c <= ' ' || *c > '~' || *c == '"' || *c == '\\')
            return 0;
    memcpy(out, xid, n + 1); /* n < cap: checked above */
    return 1;
}

static uint64_t session_of(evhtp_request_t *req, const struct rw_src *body);

static void handle_generate(evhtp_request_t *req, int kind)
{
    struct rthread *t = rt_thread_self();
    if (!rt_authorized(req)) {
        rejected(req, kind, 401, RF_UNAUTHORIZED);
        return;
    }
    if (!xpyd_method_allowed(req, "POST")) {
        rejected(req, kind, 405, RF_METHOD_NOT_ALLOWED);
        return;
    }
    char via[768];
    if (rt_loop_check(req, via, sizeof via) != 0) {
        rejected(req, kind, 508, RF_LOOP_DETECTED);
        return;
    }
    if (atomic_load(&g_rt->draining)) {
        xpyd_close_after_reply(req);
        xpyd_reply_error(req, 503, "the router is shutting down (draining): retry on another router");
        rejected(req, kind, 503, RF_DRAINING);
        return;
    }
    struct evbuffer *aside = rt_client_take_body(req), *in = aside ? aside : req->buffer_in;
    size_t len = evbuffer_get_length(in);
    if (len > (size_t)g_rt->cfg.max_body_bytes || evhtp_header_find(req->headers_in, XPYD_TOO_LARGE_HEADER)) {
        char msg[160];
        snprintf(msg, sizeof msg, "request body exceeds the limit of %ld bytes (--max-body-bytes)",
                 g_rt->cfg.max_body_bytes);
        xpyd_reply_error(req, 413, msg);
        rejected(req, kind, 413, RF_BODY_TOO_LARGE);
        if (aside)
            evbuffer_free(aside);
        return;
    }
    if (evhtp_header_find(req->headers_in, XPYD_BODY_MEMORY_HEADER)) {
        char msg[200];
        snprintf(msg, sizeof msg, "the router holds as many request body bytes as it may (--max-body-memory-bytes "
                                  "%ld); retry shortly", g_rt->cfg.max_body_memory_bytes);
        evhtp_headers_add_header(req->headers_out, evhtp_header_new("Retry-After", "1", 0, 0));
        xpyd_reply_error(req, 503, msg);
        rejected(req, kind, 503, RF_BODY_MEMORY);
        if (aside)
            evbuffer_free(aside);
        return;
    }
    /* the body's one copy the router keeps (the connection's buffer is emptied as it is copied): checked strictly
     * (trailing data refused), then read in place, never as a tree; duplicated keys: the last wins, as the
     * engines (Python json) read */
    char *text = XPYD_XALLOC(malloc(len + 1));
    evbuffer_remove(in, text, len);
    if (aside)
        evbuffer_free(aside);
    const char *why = NULL;
    size_t err_at = 0;
    struct rw_src *src = rw_src_take(text, len, (size_t)g_rt->cfg.max_body_keys, &why, &err_at);
    int stream = 0;
    int64_t max_tokens = 0;
    const char *bad = src ? rw_validate(src, kind == RT_EP_CHAT, &stream, &max_tokens) : NULL;
    if (!src || bad) {
        char msg[200];
        if (!src)
            snprintf(msg, sizeof msg, "malformed JSON body: %s (near byte %zu)", why, err_at);
        xpyd_reply_error(req, 400, src ? bad : msg);
        rw_src_free(src);
        rejected(req, kind, 400, RF_BAD_REQUEST);
        return;
    }
    struct request *r = XPYD_XALLOC(calloc(1, sizeof *r));
    r->t = t;
    r->ereq = req;
    r->ho = g_rt->ho;
    r->kind = kind;
    r->src = src;
    r->body_bytes = (int64_t)len;
    rt_body_memory_add((int64_t)len); /* the guard admitted these bytes under the budget */
    r->stream = stream;
    r->max_tokens = max_tokens;
    r->room_tokens = rw_room_tokens(src, kind == RT_EP_CHAT, max_tokens);
    r->t_start = xpyd_now_us();
    r->prompt_tokens = rw_estimate_prompt(src, kind == RT_EP_CHAT, g_rt->cfg.bytes_per_token);
    r->prompt_src = kind == RT_EP_COMPLETIONS && rw_prompt_is_ids(src, &r->prompt_longest) ? RT_PS_IDS
                                                                                             : RT_PS_ESTIMATE;
    rt_tok_truncation_in(r); /* truncate_prompt_tokens: the counts are of the prompt the engine keeps */
    if ((g_rt->prefix_on[RT_PREFILL] || g_rt->prefix_on[RT_DECODE]) && !rt_tok_wants(r)) { /* else: its ids' */
        uint64_t ex[2];
        r->nblocks = rw_prefix_blocks(src, kind == RT_EP_CHAT, (size_t)g_rt->cfg.prefix_block_tokens,
                                      g_rt->cfg.bytes_per_token, rt_kv_extras(src, ex) ? ex : NULL, &r->blocks);
    }
    r->session = session_of(req, src);
    if (!client_request_id(req, r->xid, sizeof r->xid)) /* vLLM uses the client's id too */
        new_request_id(r->xid, sizeof r->xid);
    rt_client_addr(req, r->client_addr, sizeof r->client_addr);
    struct evbuffer *hb = XPYD_XALLOC(evbuffer_new());
    evhtp_kvs_for_each(req->headers_in, collect_header, hb);
    evbuffer_add(hb, via, strlen(via)); /* this router's hop, so a request it sends never comes back unseen */
    size_t hl = evbuffer_get_length(hb);
    if (hl) {
        r->fwd_headers = XPYD_XALLOC(malloc(hl + 1));
        evbuffer_remove(hb, r->fwd_headers, hl);
        r->fwd_headers[hl] = '\0';
    }
    evbuffer_free(hb);
    /* everything wanted from the client's headers is taken (id, session, the forwarded set): libevhtp's
     * copies (~0.3 KiB) are not held for the whole stream */
    evhtp_headers_t *hin = evhtp_headers_new();
    if (hin) {
        evhtp_headers_free(req->headers_in);
        req->headers_in = hin;
    }
    req_begin(r);
}

/* --session-key: the hash of the request's session (a header's value, or a top-level string of the body);
 * 0 when the setting is off or the request has none. */
static uint64_t session_of(evhtp_request_t *req, const struct rw_src *body)
{
    const char *k = g_rt->cfg.session_key;
    char *owned = NULL;
    const char *v = NULL;
    if (!strncmp(k, "header:", 7))
        v = evhtp_kv_find(req->headers_in, k + 7);
    else if (!strncmp(k, "body:", 5))
        v = owned = rw_string_member(body, k + 5);
    uint64_t h = v && *v ? XXH3_64bits(v, strlen(v)) : 0;
    free(owned);
    return h || !v || !*v ? h : 1;
}

static void on_completions(evhtp_request_t *req, void *arg)
{
    handle_generate(req, RT_EP_COMPLETIONS);
}

static void on_chat(evhtp_request_t *req, void *arg)
{
    handle_generate(req, RT_EP_CHAT);
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
    if (g_rt->tls_client)
        up_thread_set_tls(t->up, g_rt->tls_client);
    t->kick_role = -1;
    t->kick = XPYD_XALLOC(event_new(base, -1, 0, admission_on_kick, t));
    rt_threads_add(t);
    rt_tok_thread_init(t);
    return t;
}

void rt_thread_free(struct rthread *t)
{
    if (!t)
        return;
    rt_threads_remove(t);
    rt_tok_thread_free(t);
    event_free(t->kick);
    up_thread_free(t->up);
    free(t->parser);
    free(t);
}

void rt_install_handlers(evhtp_t *htp)
{
    evhtp_set_cb(htp, "/v1/completions", on_completions, NULL);
    evhtp_set_cb(htp, "/v1/chat/completions", on_chat, NULL);
    evhtp_set_cb(htp, "/v1/models", rt_models_handler, NULL);
    rt_admin_handlers(htp);
    rt_metadata_handlers(htp);
}
