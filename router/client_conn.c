/* SPDX-License-Identifier: Apache-2.0 */
/* client_conn.c - the router's guard in front of libevhtp for each client connection.
 *
 * libevhtp 1.2.18 mishandles much of what a hostile client can send (a request line without a version
 * crashes it; pipelined requests, chunk extensions and trailers are lost; framing it does not understand is
 * read as the next request). So libevhtp never reads the client's bytes. The guard takes every byte off
 * the socket, reads one request at a time with the strict reader in http_req.c (head and body, Content-Length
 * or chunked), and only then hands libevhtp a canonical re-serialisation of that one request: request line,
 * the end-to-end header fields, Content-Length, the body. The next request, pipelined or not, is read only
 * once the answer to this one is complete, so answers go out in order. Per request, on every request of a
 * connection (the first, a pipelined one, or one after a keep-alive pause):
 *   - head not complete within --header-timeout-ms          -> 408, then close (slowloris defence)
 *   - body stalls longer than --body-idle-timeout-ms         -> 408, then close
 *   - head over --max-header-bytes / --max-headers / a line over --max-header-line-bytes -> 431, then close
 *   - a malformed or ambiguous head or chunked body          -> 400 (or 501/505/417), then close
 *   - a body over --max-body-bytes: read and discarded, the handler answers 413 (never buffered)
 *   - a body that would take the bodies the router holds over --max-body-memory-bytes: read and discarded,
 *     the handler answers 503 + Retry-After (a Content-Length body is admitted whole at its head)
 *   - a connection over --max-connections                    -> 503 + Retry-After, then close
 *   - no new request within --keepalive-timeout-ms           -> closed quietly (nothing was asked)
 * "Expect: 100-continue" is answered by the guard: 100 Continue only when the body will be read (not
 * before a 401 or a 413). After a refusal the connection is half-closed and read and discarded for up to
 * --linger-ms, so the client reads the answer instead of a reset.
 *
 * States: IDLE (between requests) -> HEAD (first byte of a request seen) -> BODY (head accepted, body being
 * read) -> BUSY (handed to libevhtp, answer in progress) -> IDLE (answer finished: the request-fini hook),
 * or REJECTED (answer written, lingering) from HEAD/BODY. */
#include "router.h"
#include "access_log.h"
#include "client_answers.h"
#include "xpyd_reply.h"
#include "http_req.h"

#include "xpyd_oai.h"
#include "xpyd_tls.h"
#include "xpyd_util.h"

#include <assert.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/bufferevent_struct.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <event2/event.h>
#include <evhtp/evhtp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

enum cc_state { CC_IDLE = 0, CC_HEAD, CC_BODY, CC_BUSY, CC_REJECTED };

struct cconn {
    evhtp_connection_t *c;
    struct event *timer;
    struct event *kick;     /* reads the next request once libevhtp has reset its parser */
    enum cc_state state;
    int over_capacity;      /* answer every request with 503 and close */
    int last;               /* the current request is the connection's last (Connection: close, HTTP/1.0) */
    int tls_closed;         /* close_notify sent (a refusal on a TLS connection) */
    int shared_parser;      /* c->parser is the thread's (rt_client_attach), not the connection's */
    struct evbuffer *raw;   /* client bytes not yet taken by a request */
    size_t scanned;         /* head bytes already looked at */
    size_t line_start;      /* offset of the current head line */
    long lines;             /* head lines seen (request line + headers) */
    /* the request being read */
    char *head;             /* the head's bytes (fields point into them), owned */
    struct hr_head h;
    struct hr_field *fields; /* the head's fields, sized by its line count; freed with the head, so an
                              * open stream holds none (owned) */
    struct evbuffer *body;  /* only while a body is read (body_buf): an open stream holds none */
    struct evbuffer *aside; /* a generate request's body, handed to its handler directly (rt_client_take_body),
                             * not through libevhtp's parser, which would copy it twice more */
    int64_t body_left;      /* Content-Length bytes still to come */
    size_t body_bytes;
    struct hr_chunked ck;
    int too_large;          /* over --max-body-bytes: discarded, the handler answers 413 */
    int mem_full;           /* over --max-body-memory-bytes: discarded, the handler answers 503 */
    int64_t reserved;       /* body bytes counted in the router's body memory (rt_body_memory_*) */
    int skip_body;          /* Expect: 100-continue refused early: the body will not be sent */
    int asterisk;           /* "OPTIONS *": the server's own options, answered by asterisk_handler */
    bufferevent_data_cb ev_read, ev_write;
    bufferevent_event_cb ev_event;
    void *ev_arg;
    void (*owner_fini)(void *arg); /* the handler's cleanup, run when libevhtp frees the request */
    int (*owner_gone)(void *arg);  /* the client went away mid-answer (rt_client_pause_reading_on) */
    void *owner_arg;
    struct event *closed_ev; /* the peer closing, watched while reading is held back during an answer */
};

static void arm(struct cconn *cc, long ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(cc->timer, &tv);
}

static void request_reset(struct cconn *cc)
{
    free(cc->head);
    cc->head = NULL;
    free(cc->fields);
    cc->fields = NULL;
    if (cc->body)
        evbuffer_free(cc->body);
    cc->body = NULL;
    if (cc->aside)
        evbuffer_free(cc->aside);
    cc->aside = NULL;
    cc->body_left = 0;
    cc->body_bytes = 0;
    cc->too_large = cc->skip_body = cc->mem_full = cc->asterisk = 0;
    rt_body_memory_release(cc->reserved);
    cc->reserved = 0;
    memset(&cc->ck, 0, sizeof cc->ck);
}

static void cc_free(struct cconn *cc)
{
    if (!cc)
        return;
    event_free(cc->timer);
    event_free(cc->kick);
    if (cc->closed_ev)
        event_free(cc->closed_ev);
    request_reset(cc);
    evbuffer_free(cc->raw);
    free(cc);
}

/* TLS clients are read with OpenSSL's read-ahead (main.c tls_setup): one read takes what the socket has, where
 * OpenSSL alone reads a record's header and then its body (two reads per request). It may then hold whole
 * records the socket will not signal again (a request's body behind its head, a request arriving with the
 * handshake's last flight, pipelined requests): while reading is on, the bufferevent is sent back to OpenSSL
 * for them. libevent's own read loop stops when a read made progress and nothing decrypted is left over.
 * Reading held back (hold_reading) just after such a hand-back still takes that one read: at most one
 * read-ahead buffer (about 16 KiB) over the bound. */
static void tls_read_buffered(struct bufferevent *bev)
{
    SSL *ssl = bufferevent_openssl_get_ssl(bev);
    if (ssl && SSL_has_pending(ssl) && (bufferevent_get_enabled(bev) & EV_READ))
        event_active(&bev->ev_read, EV_READ, 1);
}

/* ---- refusal: a raw answer, then a lingering close ---- */

static void linger_read(struct bufferevent *bev, void *arg)
{
    struct evbuffer *in = bufferevent_get_input(bev);
    evbuffer_drain(in, evbuffer_get_length(in));
}

static void linger_write(struct bufferevent *bev, void *arg)
{
    struct cconn *cc = arg;
    if (evbuffer_get_length(bufferevent_get_output(bev)) == 0) {
        SSL *ssl = bufferevent_openssl_get_ssl(bev);
        if (ssl && !cc->tls_closed) { /* TLS: close_notify first, so the client reads a clean end */
            cc->tls_closed = 1;
            SSL_shutdown(ssl);
        }
        shutdown(cc->c->sock, SHUT_WR);
    }
}

/* The client hung up (or its socket failed) while an answer is in progress: the handler ends the request and
 * frees the connection (1), or leaves an answer already complete to libevhtp (0). */
static int client_gone(struct cconn *cc)
{
    int (*fn)(void *) = cc->state == CC_BUSY ? cc->owner_gone : NULL;
    return fn && fn(cc->owner_arg);
}

static void guard_event(struct bufferevent *bev, short what, void *arg)
{
    struct cconn *cc = arg;
    SSL *ssl = (what & (BEV_EVENT_ERROR | BEV_EVENT_EOF)) ? bufferevent_openssl_get_ssl(bev) : NULL;
    if (ssl && !SSL_is_init_finished(ssl))
        rt_client_tls_failed(cc->c, bev);
    if ((what & (BEV_EVENT_ERROR | BEV_EVENT_EOF)) && client_gone(cc))
        return; /* the connection is freed */
    if (what & BEV_EVENT_CONNECTED) /* handshake done: a request may have come with its last flight */
        tls_read_buffered(bev);
    cc->ev_event(bev, what, cc->ev_arg);
}

/* The peer closed while its pipelined bytes hold reading back (guard_read): as guard_event would have seen. */
static void on_peer_closed(evutil_socket_t fd, short ev, void *arg)
{
    struct cconn *cc = arg;
    if (client_gone(cc))
        return;
    event_del(cc->closed_ev); /* level-triggered: once is enough; the read after the answer sees the end */
}

/* Reading again (between requests, or an answer began with little buffered): the read event sees the peer. */
static void read_again(struct cconn *cc)
{
    if (cc->closed_ev)
        event_del(cc->closed_ev);
    bufferevent_enable(cc->c->bev, EV_READ);
    tls_read_buffered(cc->c->bev);
}

static void reject(struct cconn *cc, int status, const char *reason, int reason_idx, const char *msg)
{
    atomic_fetch_add(&g_rt->ctr.client_rejected[reason_idx], 1);
    xpyd_log_event(XPYD_LOG_WARN, "event=client_rejected status=%d reason=%s detail=\"%s\"", status, reason, msg);
    char *body = xpyd_oai_error_json(status, NULL, msg, NULL);
    struct evbuffer *out = bufferevent_get_output(cc->c->bev);
    evbuffer_add_printf(out, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                             "Connection: close\r\n\r\n%s",
                        status, xpyd_status_reason(status), strlen(body), body);
    free(body);
    cc->state = CC_REJECTED;
    evbuffer_drain(cc->raw, evbuffer_get_length(cc->raw));
    linger_read(cc->c->bev, cc);
    bufferevent_setcb(cc->c->bev, linger_read, linger_write, guard_event, cc);
    bufferevent_enable(cc->c->bev, EV_READ | EV_WRITE);
    arm(cc, g_rt->cfg.linger_ms);
}

static void reject_malformed(struct cconn *cc, int status, const char *why)
{
    int idx = status == 431 ? RT_CR_HEADERS_TOO_LARGE : RT_CR_MALFORMED;
    reject(cc, status, status == 431 ? "headers_too_large" : "malformed", idx, why ? why : "malformed request");
}

static void on_timer(evutil_socket_t fd, short ev, void *arg)
{
    struct cconn *cc = arg;
    switch (cc->state) {
    case CC_IDLE:
        atomic_fetch_add(&g_rt->ctr.client_rejected[RT_CR_IDLE], 1);
        evhtp_connection_free(cc->c); /* frees cc through the connection-fini hook */
        return;
    case CC_HEAD:
        reject(cc, 408, "header_timeout", RT_CR_HEADER_TIMEOUT, "request headers not received in time");
        return;
    case CC_BODY:
        reject(cc, 408, "body_timeout", RT_CR_BODY_TIMEOUT, "request body stalled");
        return;
    case CC_REJECTED:
        evhtp_connection_free(cc->c);
        return;
    case CC_BUSY:
        return;
    }
}

/* Scans the buffered head for its end and its limits. Returns 1 when complete (cc->scanned is its length),
 * 0 when more is needed, -1 after refusing. */
static int scan_head(struct cconn *cc)
{
    struct evbuffer *in = cc->raw;
    size_t len = evbuffer_get_length(in);
    const struct rt_config *cfg = &g_rt->cfg;
    size_t lim = (size_t)cfg->max_header_bytes;
    size_t upto = len < lim + 1 ? len : lim + 1;
    if (upto <= cc->scanned)
        return 0;
    const char *p = (const char *)evbuffer_pullup(in, (ev_ssize_t)upto);
    for (size_t i = cc->scanned; i < upto; i++) {
        if (p[i] != '\n')
            continue;
        size_t line_len = i - cc->line_start;
        if (line_len > 0 && p[i - 1] == '\r')
            line_len--;
        if (line_len == 0 && cc->lines == 0) { /* empty line before a request: allowed, skipped */
            cc->line_start = i + 1;
            continue;
        }
        if (line_len == 0) {
            cc->scanned = i + 1;
            return 1;
        }
        if (++cc->lines > cfg->max_headers + 1) {
            reject(cc, 431, "too_many_headers", RT_CR_HEADERS_TOO_LARGE, "too many request header fields");
            return -1;
        }
        if ((long)line_len > cfg->max_header_line_bytes) {
            reject(cc, 431, "header_line_too_long", RT_CR_HEADERS_TOO_LARGE, "a request header line is too long");
            return -1;
        }
        cc->line_start = i + 1;
    }
    cc->scanned = upto;
    if (upto > lim || (long)(upto - cc->line_start) > cfg->max_header_line_bytes) {
        reject(cc, 431, "headers_too_large", RT_CR_HEADERS_TOO_LARGE, "request headers are too large");
        return -1;
    }
    return 0;
}

/* Would the request pass authentication? (decides "Expect: 100-continue" before the handler runs) */
static int auth_would_pass(struct cconn *cc)
{
    const struct hr_head *h = &cc->h;
    const char *key = g_rt->cfg.api_key;
    if (h->tlen >= 7 && !strncmp(h->target, "/admin/", 7))
        key = g_rt->cfg.admin_key[0] ? g_rt->cfg.admin_key : NULL;
    else if ((h->tlen >= 7 && !strncmp(h->target, "/health", 7)) || (h->tlen >= 8 && !strncmp(h->target, "/metrics", 8)))
        return 1;
    if (!key)
        return 0;
    if (!key[0])
        return 1;
    char auth[512];
    snprintf(auth, sizeof auth, "%.*s", h->auth ? (int)h->authlen : 0, h->auth ? h->auth : "");
    return xpyd_bearer_value_ok(auth, key);
}

static struct evbuffer *body_buf(struct cconn *cc)
{
    if (!cc->body)
        cc->body = XPYD_XALLOC(evbuffer_new());
    return cc->body;
}

/* libevent 2.1 reads a socket at most 4,096 bytes at a time (EVBUFFER_MAX_READ), each read after a FIONREAD
 * ioctl and most after a turn of the loop: a 128 KB body took 33 reads, 33 ioctls and 13 epoll_waits, and each
 * small read opened the client's TCP window a little, so loopback delivered its next segments in the router's
 * time. The rest of a Content-Length body on a plain connection is read here, straight into the request's body,
 * as much as the socket holds and no more than the body still needs (its memory is reserved already, and
 * bytes after it stay in the socket for the bufferevent). TLS bodies go through OpenSSL. */
#define BODY_READ_MAX (1 << 20)
static void read_body_direct(struct cconn *cc)
{
    if (bufferevent_openssl_get_ssl(cc->c->bev)) /* TLS: only OpenSSL reads the socket */
        return;
    struct evbuffer *b = body_buf(cc);
    while (cc->body_left > 0) {
        size_t want = cc->body_left < BODY_READ_MAX ? (size_t)cc->body_left : BODY_READ_MAX;
        struct evbuffer_iovec v;
        if (evbuffer_reserve_space(b, (ev_ssize_t)want, &v, 1) != 1)
            return;
        ssize_t r = recv(cc->c->sock, v.iov_base, want, 0);
        v.iov_len = r > 0 ? (size_t)r : 0;
        evbuffer_commit_space(b, &v, 1);
        if (r <= 0) /* empty for now, or the peer's end or an error: the bufferevent sees those on its next read */
            return;
        cc->body_left -= r;
        if ((size_t)r < want)
            return;
    }
}

/* The body kept so far goes (none is made just to be drained), and its count in the router's body memory. */
static void drop_body(struct cconn *cc)
{
    if (cc->body)
        evbuffer_drain(cc->body, evbuffer_get_length(cc->body));
    rt_body_memory_release(cc->reserved);
    cc->reserved = 0;
}

static void collect_body(void *arg, const char *p, size_t n)
{
    struct cconn *cc = arg;
    cc->body_bytes += n;
    if (cc->too_large || cc->mem_full)
        return;
    if (cc->body_bytes > (size_t)g_rt->cfg.max_body_bytes) {
        cc->too_large = 1;
        drop_body(cc);
        return;
    }
    if (!rt_body_memory_reserve((int64_t)n)) {
        cc->mem_full = 1;
        drop_body(cc);
        return;
    }
    cc->reserved += (int64_t)n;
    evbuffer_add(body_buf(cc), p, n);
}

/* The generate endpoints' paths (a query string allowed): their bodies skip libevhtp's parser. */
static int is_generate(const char *t, size_t n)
{
    static const char *const paths[] = {"/v1/completions", "/v1/chat/completions"};
    for (int i = 0; i < 2; i++) {
        size_t k = strlen(paths[i]);
        if (n >= k && !memcmp(t, paths[i], k) && (n == k || t[k] == '?'))
            return 1;
    }
    return 0;
}

/* The complete request goes to libevhtp as one canonical message, which it parses at once. */
static void hand_over(struct cconn *cc)
{
    struct bufferevent *bev = cc->c->bev;
    struct evbuffer *in = bufferevent_get_input(bev);
    const struct hr_head *h = &cc->h;
    assert(cc->state == CC_BODY && evbuffer_get_length(in) == 0);
    /* libevent keeps the end of a socket bufferevent's input frozen outside its reads; an OpenSSL one does not
     * freeze it, and freezing it here would make its next read fail silently (the socket stays readable, the
     * loop spins, the next request is never read) */
    int frozen = !bufferevent_openssl_get_ssl(bev);
    evbuffer_unfreeze(in, 0);
    /* pieces copied as they are: no printf per line (this runs for every request) */
    evbuffer_add(in, h->method, h->mlen);
    evbuffer_add(in, " ", 1);
    /* "OPTIONS *" (RFC 9110 9.3.7) asks about the server, not a resource; libevhtp's parser takes no "*", so it
     * is handed over as "/" and answered by asterisk_handler (rt_client_headers_hook) */
    cc->asterisk = h->tlen == 1 && h->target[0] == '*';
    evbuffer_add(in, cc->asterisk ? "/" : h->target, cc->asterisk ? 1 : h->tlen);
    evbuffer_add(in, h->minor ? " HTTP/1.1\r\n" : " HTTP/1.0\r\n", 11);
    for (size_t i = 0; i < h->nfields; i++) {
        const struct hr_field *f = &cc->fields[i];
        if (!f->drop && !hr_name_is(f, "x-xpyd-body-too-large") && !hr_name_is(f, "x-xpyd-body-memory-full")) {
            evbuffer_add(in, f->name, f->nlen);
            evbuffer_add(in, ": ", 2);
            evbuffer_add(in, f->val, f->vlen);
            evbuffer_add(in, "\r\n", 2);
        }
    }
    if (cc->too_large)
        evbuffer_add_printf(in, "%s: 1\r\n", XPYD_TOO_LARGE_HEADER);
    else if (cc->mem_full)
        evbuffer_add_printf(in, "%s: 1\r\n", XPYD_BODY_MEMORY_HEADER);
    cc->last = !h->keep_alive || cc->skip_body;
    if (cc->last)
        evbuffer_add(in, "Connection: close\r\n", 19);
    else if (h->minor == 0)
        evbuffer_add(in, "Connection: keep-alive\r\n", 24);
    size_t blen = cc->body ? evbuffer_get_length(cc->body) : 0;
    int has_length = blen || h->content_length >= 0 || h->chunked;
    if (blen && is_generate(h->target, h->tlen)) { /* the handler takes it as it is (rt_client_take_body) */
        cc->aside = cc->body;
        cc->body = NULL;
        blen = 0;
    }
    if (has_length) {
        char cl[40] = "Content-Length: ";
        evbuffer_add(in, cl, (size_t)(xpyd_put_u64(cl + 16, blen) - cl));
    }
    evbuffer_add(in, "\r\n\r\n", has_length ? 4 : 2); /* its line's end, then the head's */
    if (cc->body) {
        evbuffer_add_buffer(in, cc->body);
        evbuffer_free(cc->body);
        cc->body = NULL;
    }
    if (frozen)
        evbuffer_freeze(in, 0);
    cc->state = CC_BUSY;
    evtimer_del(cc->timer);
    free(cc->head);
    cc->head = NULL;
    free(cc->fields);
    cc->fields = NULL;
    /* libevhtp's parser starts afresh for every request (it may be shared: rt_client_attach) */
    htparser_init(cc->c->parser, htp_type_request);
    htparser_set_userdata(cc->c->parser, cc->c);
    int64_t reserved = cc->reserved; /* the handler counts what it keeps (the request's source) itself */
    cc->reserved = 0;
    cc->ev_read(bev, cc->ev_arg); /* may free cc */
    rt_body_memory_release(reserved);
}

/* Reads as far as the buffered bytes allow: at most one request is handed over per call. */
static void advance(struct cconn *cc)
{
    const struct rt_config *cfg = &g_rt->cfg;
    if (cc->state == CC_IDLE) {
        if (evbuffer_get_length(cc->raw) == 0)
            return;
        if (cc->last) { /* the previous request was the connection's last one: nothing more is read */
            evbuffer_drain(cc->raw, evbuffer_get_length(cc->raw));
            return;
        }
        cc->state = CC_HEAD;
        cc->scanned = cc->line_start = 0;
        cc->lines = 0;
        arm(cc, cfg->header_timeout_ms);
    }
    if (cc->state == CC_HEAD) {
        if (scan_head(cc) <= 0)
            return;
        size_t n = cc->scanned;
        cc->head = XPYD_XALLOC(malloc(n));
        evbuffer_remove(cc->raw, cc->head, n);
        /* every field is on a line of its own after the request line, and scan_head bounded the lines by
         * --max-headers + 1 */
        cc->fields = XPYD_XALLOC(calloc((size_t)cc->lines, sizeof *cc->fields));
        int st = hr_parse_head(cc->head, n, cc->fields, (size_t)cc->lines, &cc->h);
        if (st) {
            reject_malformed(cc, st, cc->h.error);
            return;
        }
        cc->state = CC_BODY;
        cc->body_left = cc->h.content_length > 0 ? cc->h.content_length : 0;
        if (cc->h.content_length > cfg->max_body_bytes)
            cc->too_large = 1;
        else if (cc->body_left > 0 && rt_body_memory_reserve(cc->body_left)) /* admitted whole */
            cc->reserved = cc->body_left;
        else if (cc->body_left > 0)
            cc->mem_full = 1;
        int has_body = cc->h.chunked || cc->body_left > 0;
        if (has_body && cc->h.expect_continue && evbuffer_get_length(cc->raw) == 0) {
            if (cc->too_large || cc->mem_full || !auth_would_pass(cc)) {
                cc->skip_body = 1; /* answered without reading the body, then closed */
                cc->body_left = 0;
                hand_over(cc);
                return;
            }
            bufferevent_write(cc->c->bev, "HTTP/1.1 100 Continue\r\n\r\n", 25);
        }
        arm(cc, cfg->body_idle_timeout_ms);
    }
    if (cc->state == CC_BODY) {
        size_t avail = evbuffer_get_length(cc->raw);
        if (!cc->h.chunked) {
            size_t n = (uint64_t)cc->body_left < avail ? (size_t)cc->body_left : avail;
            if (n) {
                if (cc->too_large || cc->mem_full)
                    evbuffer_drain(cc->raw, n);
                else
                    evbuffer_remove_buffer(cc->raw, body_buf(cc), n);
                cc->body_left -= (int64_t)n;
            }
            if (cc->body_left > 0 && !cc->too_large && !cc->mem_full)
                read_body_direct(cc);
            if (cc->body_left > 0)
                return;
        } else {
            int done = 0;
            const char *why = NULL;
            ssize_t used = avail ? hr_chunked_feed(&cc->ck, (const char *)evbuffer_pullup(cc->raw, -1), avail,
                                                   (size_t)cfg->max_header_bytes, collect_body, cc, &done, &why)
                                 : 0;
            if (used < 0) {
                reject_malformed(cc, (int)-used, why);
                return;
            }
            evbuffer_drain(cc->raw, (size_t)used);
            if (!done)
                return;
        }
        hand_over(cc);
    }
}

/* Pipelined bytes over the bound during an answer: the socket is not read (TCP pushes back on the client) until
 * the answer is done, and the peer's closing is watched on its own meanwhile. */
static int reading_held(const struct cconn *cc)
{
    return evbuffer_get_length(cc->raw) > (size_t)g_rt->cfg.max_header_bytes + 65536;
}

static void hold_reading(struct cconn *cc)
{
    bufferevent_disable(cc->c->bev, EV_READ);
    if (!cc->owner_gone)
        return;
    if (!cc->closed_ev)
        cc->closed_ev = XPYD_XALLOC(event_new(bufferevent_get_base(cc->c->bev), cc->c->sock, EV_CLOSED,
                                              on_peer_closed, cc));
    event_add(cc->closed_ev, NULL);
}

static void guard_read(struct bufferevent *bev, void *arg)
{
    struct cconn *cc = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    if (cc->state == CC_REJECTED) {
        linger_read(bev, cc);
        return;
    }
    tls_read_buffered(bev); /* before anything below can free the connection (the event goes with it) */
    if (evbuffer_get_length(in) == 0)
        return;
    evbuffer_add_buffer(cc->raw, in);
    if (cc->state == CC_BODY)
        arm(cc, g_rt->cfg.body_idle_timeout_ms);
    if (cc->state == CC_BUSY) {
        /* pipelined bytes wait for the answer in progress; past a bound the socket is not read (TCP pushes
         * back on the client) until the answer is done */
        if (reading_held(cc))
            hold_reading(cc);
        return;
    }
    advance(cc);
}

/* libevhtp 1.2.18 frees the connection when its write callback runs while no request is in progress
 * ("no request associated with connection"), e.g. a stray write event between requests after a streamed
 * answer. Between requests there is nothing for libevhtp to do on a write event, so it is not told. */
static void guard_write(struct bufferevent *bev, void *arg)
{
    struct cconn *cc = arg;
    if (!cc->c->request)
        return;
    cc->ev_write(bev, cc->ev_arg);
}

static void on_kick(evutil_socket_t fd, short ev, void *arg)
{
    struct cconn *cc = arg;
    if (cc->state != CC_IDLE)
        return;
    read_again(cc);
    advance(cc);
}

/* ---- hooks from libevhtp ---- */

const char *const rt_client_reject_names[RT_CR_COUNT] = {"over_capacity", "header_timeout", "body_timeout",
                                                       "headers_too_large", "keepalive_idle", "malformed"};

int rt_client_headers_hook(evhtp_request_t *req, void *guard)
{
    struct cconn *cc = guard;
    if (cc->over_capacity) {
        atomic_fetch_add(&g_rt->ctr.client_rejected[RT_CR_OVER_CAPACITY], 1);
        req->cb = rt_answer_over_capacity;
        req->cbarg = NULL;
        return 0;
    }
    if (cc->asterisk) {
        req->cb = rt_answer_asterisk;
        req->cbarg = NULL;
        return 0;
    }
    /* the generate endpoints answer 413 and 503 themselves (counted per endpoint, access-logged) */
    const char *path = req->uri && req->uri->path && req->uri->path->full ? req->uri->path->full : "";
    int generate = !strcmp(path, "/v1/completions") || !strcmp(path, "/v1/chat/completions");
    if (!generate && evhtp_header_find(req->headers_in, XPYD_TOO_LARGE_HEADER)) {
        req->cb = rt_answer_too_large;
        req->cbarg = NULL;
    } else if (!generate && evhtp_header_find(req->headers_in, XPYD_BODY_MEMORY_HEADER)) {
        req->cb = rt_answer_body_memory;
        req->cbarg = NULL;
    }
    return 0;
}

struct evbuffer *rt_client_take_body(evhtp_request_t *req)
{
    evhtp_connection_t *c = evhtp_request_get_connection(req);
    struct cconn *cc = c && c->hooks ? c->hooks->on_connection_fini_arg : NULL;
    struct evbuffer *b = cc ? cc->aside : NULL;
    if (cc)
        cc->aside = NULL;
    return b;
}

void rt_client_set_owner(evhtp_request_t *req, void (*fini)(void *arg), void *arg)
{
    evhtp_connection_t *c = evhtp_request_get_connection(req);
    struct cconn *cc = c && c->hooks ? c->hooks->on_connection_fini_arg : NULL;
    if (!cc)
        return;
    cc->owner_fini = fini;
    cc->owner_arg = arg;
}

/* While the answer to req is in progress, the connection is read as between requests (pipelined bytes wait in
 * the guard), so that a client hanging up is seen at once. evhtp_request_pause would stop reading, and
 * reading again after the answer, plus watching the close on its own meanwhile (EV_CLOSED), costs two
 * epoll_ctl per request; nginx, for one, keeps its connections' events as they are. The pause is libevhtp's
 * without its read switch: the request's status and the connection's flag, which evhtp_request_resume ends. */
void rt_client_pause_reading_on(evhtp_request_t *req, int (*gone)(void *arg))
{
    evhtp_connection_t *c = evhtp_request_get_connection(req);
    struct cconn *cc = c && c->hooks ? c->hooks->on_connection_fini_arg : NULL;
    if (!cc) {
        evhtp_request_pause(req);
        return;
    }
    req->status = EVHTP_RES_PAUSE;
    c->flags |= EVHTP_CONN_FLAG_PAUSED;
    cc->owner_gone = gone;
    if (reading_held(cc))
        hold_reading(cc);
    else
        read_again(cc);
}

/* An answer finished without libevhtp's resume (stream.c finish_in_place) ends the pause here, as
 * evhtp_request_resume would, without its event. The pause is ours to end only when libevhtp has no plan of its
 * own for the connection: freed on resume (an error while paused), a write it is waiting on. */
int rt_client_pause_ours(evhtp_request_t *req)
{
    evhtp_connection_t *c = evhtp_request_get_connection(req);
    return c && !(c->flags & (EVHTP_CONN_FLAG_FREE_CONN | EVHTP_CONN_FLAG_ERROR | EVHTP_CONN_FLAG_WAITING)) &&
           (c->flags & EVHTP_CONN_FLAG_PAUSED);
}

/* libevhtp re-pauses a request still marked paused once the handler that answered it returns (an answer given
 * within the request's own read, e.g. no instance can take it): the request's mark goes with the connection's. */
void rt_client_unpause(evhtp_request_t *req)
{
    evhtp_connection_t *c = evhtp_request_get_connection(req);
    req->status = EVHTP_RES_OK;
    c->flags &= (uint16_t)~EVHTP_CONN_FLAG_PAUSED;
}

static void run_owner_fini(struct cconn *cc)
{
    void (*fn)(void *) = cc->owner_fini;
    cc->owner_fini = NULL;
    cc->owner_gone = NULL;
    if (fn)
        fn(cc->owner_arg);
}

/* libevhtp frees the request: its answer is complete (or the connection is going). The connection is idle,
 * and the next request, if any is buffered, is read once libevhtp has reset its parser (after this hook). */
static evhtp_res on_request_fini(evhtp_request_t *req, void *arg)
{
    struct cconn *cc = arg;
    run_owner_fini(cc);
    if (cc->state == CC_REJECTED)
        return EVHTP_RES_OK;
    cc->state = CC_IDLE;
    request_reset(cc);
    arm(cc, g_rt->cfg.keepalive_timeout_ms);
    event_active(cc->kick, EV_READ, 0);
    return EVHTP_RES_OK;
}

static evhtp_res on_conn_fini(evhtp_connection_t *c, void *arg)
{
    struct cconn *cc = arg;
    atomic_fetch_sub(&g_rt->ctr.connections, 1);
    /* libevhtp frees the connection's request after this hook: the handler's cleanup runs now, and the
     * request-fini hook must not see the freed guard */
    run_owner_fini(cc);
    evhtp_connection_unset_hook(c, evhtp_hook_on_request_fini);
    if (cc->shared_parser)
        c->parser = NULL; /* the thread's: libevhtp frees the connection's parser after this hook */
    cc_free(cc);
    return EVHTP_RES_OK;
}

/* The accepting worker, before the connection is set up: counts it; far over the limit (a quarter plus 16 above
 * it) it is closed at once, since even answering costs a buffer. */
int rt_client_pre_accept_check(void)
{
    long n = (long)atomic_fetch_add(&g_rt->ctr.connections, 1);
    long cap = g_rt->cfg.max_connections;
    if (n >= cap + cap / 4 + 16) {
        atomic_fetch_sub(&g_rt->ctr.connections, 1);
        atomic_fetch_add(&g_rt->ctr.connections_rejected, 1);
        return -1;
    }
    return 0;
}

/* Worker thread, the connection's bufferevent exists: installs the guard. Returns the guard, which the
 * caller passes to rt_client_headers_hook. */
void *rt_client_attach(evhtp_connection_t *c)
{
    struct cconn *cc = XPYD_XALLOC(calloc(1, sizeof *cc));
    cc->c = c;
    atomic_fetch_add(&g_rt->ctr.connections_accepted, 1);
    struct event_base *base = bufferevent_get_base(c->bev);
    cc->timer = XPYD_XALLOC(evtimer_new(base, on_timer, cc));
    cc->kick = XPYD_XALLOC(event_new(base, -1, 0, on_kick, cc));
    cc->raw = XPYD_XALLOC(evbuffer_new());
    if (atomic_load(&g_rt->ctr.connections) > g_rt->cfg.max_connections) {
        cc->over_capacity = 1;
        atomic_fetch_add(&g_rt->ctr.connections_rejected, 1);
    }
    /* libevhtp gives every connection its own request parser, 8,320 bytes (an 8 KiB buffer inside), for the
     * connection's whole life (about 4 KiB of it resident per open stream). The guard hands libevhtp one complete
     * request at a time, parsed in one call (hand_over), so one parser per thread serves all its connections.
     * Nothing of libevhtp's reads the parser between requests on the paths the router uses: the request's
     * method and version are copied into the request while parsing, the router writes its answers itself
     * (not evhtp_send_reply, which reads the parser), and the input libevhtp would parse again is empty. */
    struct rthread *t = rt_thread_self();
    if (t) {
        if (!t->parser)
            t->parser = XPYD_XALLOC(htparser_new());
        free(c->parser);
        c->parser = t->parser;
        cc->shared_parser = 1;
    }
    SSL *ssl = bufferevent_openssl_get_ssl(c->bev);
    if (ssl)
        xpyd_tls_use_send(ssl);
    bufferevent_getcb(c->bev, &cc->ev_read, &cc->ev_write, &cc->ev_event, &cc->ev_arg);
    bufferevent_setcb(c->bev, guard_read, guard_write, guard_event, cc);
    evhtp_connection_set_hook(c, evhtp_hook_on_connection_fini, (evhtp_hook)on_conn_fini, cc);
    evhtp_connection_set_hook(c, evhtp_hook_on_request_fini, (evhtp_hook)on_request_fini, cc);
    arm(cc, g_rt->cfg.header_timeout_ms); /* a new connection owes a request head */
    return cc;
}
