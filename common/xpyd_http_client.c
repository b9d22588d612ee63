/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_http_client.c - pooled HTTP/1.1 client legs to engines (see xpyd_http_client.h for the callback contract). */
#include "xpyd_http_client.h"
#include "xpyd_http_internal.h"
#include "xpyd_tls.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <openssl/err.h>
#include <event2/event.h>
#include <event2/util.h>
#include <http_parser.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include "xpyd_util.h"

static void conn_free(struct up_conn *c);
static void leg_finish(struct up_leg *leg, int err);
static void leg_read_cb(struct bufferevent *bev, void *arg);
static void leg_read_direct(struct up_conn *c, evutil_socket_t fd, short what);
static void leg_event_cb(struct bufferevent *bev, short what, void *arg);
static int leg_attach(struct up_leg *leg, int allow_idle);

static struct timeval ms_tv(long ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    return tv;
}

/* ---------- reading a plain connection (see struct up_conn) ---------- */

static int conn_own_read(const struct up_conn *c)
{
    return !c->t->eps[c->ep].tls;
}

/* An edge-triggered read event (conn_read_arm) is reported once per arrival: what a read leaves in the socket
 * waits for the next arrival, which may never come. So the event is made active again (the loop reads on
 * before it waits) after a read that filled its buffer (the socket may hold more), and after a read of bytes
 * that came with the engine's FIN or reset (EV_CLOSED: epoll reported the end with them, and the read that
 * returns it has not been made yet). A short read with neither means the socket was empty. */
static void conn_read_more(struct up_conn *c, short what, ssize_t got, size_t asked)
{
    if (c->edge && got > 0 && (got == (ssize_t)asked || (what & EV_CLOSED)))
        event_active(c->rev, EV_READ, 1);
}

/* One read per readiness, as a bufferevent does, into the bufferevent's input; then its read callback, or
 * its event callback for the end, an error or the read timeout. Nothing of c is touched after a callback (it
 * may have freed c). */
static void conn_read_cb(evutil_socket_t fd, short what, void *arg)
{
    struct up_conn *c = arg;
    bufferevent_data_cb readcb;
    bufferevent_event_cb eventcb;
    void *cbarg;
    bufferevent_getcb(c->bev, &readcb, NULL, &eventcb, &cbarg);
    if (what & EV_TIMEOUT) {
        if (eventcb)
            eventcb(c->bev, BEV_EVENT_READING | BEV_EVENT_TIMEOUT, cbarg);
        return;
    }
    struct evbuffer *in = bufferevent_get_input(c->bev);
    if (readcb == leg_read_cb && evbuffer_get_length(in) == 0) {
        leg_read_direct(c, fd, what);
        return;
    }
    struct evbuffer_iovec v;
    evbuffer_unfreeze(in, 0); /* a socket bufferevent keeps its input's end frozen outside its own reads */
    if (evbuffer_reserve_space(in, 4096, &v, 1) < 1) {
        evbuffer_freeze(in, 0);
        if (eventcb) /* out of memory: as the bufferevent would, an error */
            eventcb(c->bev, BEV_EVENT_READING | BEV_EVENT_ERROR, cbarg);
        return;
    }
    ssize_t n = recv(fd, v.iov_base, v.iov_len, 0);
    int err = errno;
    conn_read_more(c, what, n, v.iov_len);
    if (n > 0) {
        v.iov_len = (size_t)n;
        evbuffer_commit_space(in, &v, 1);
    }
    evbuffer_freeze(in, 0);
    if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK || err == EINTR))
        return;
    if (n <= 0) {
        errno = err;
        if (eventcb)
            eventcb(c->bev, BEV_EVENT_READING | (n == 0 ? BEV_EVENT_EOF : BEV_EVENT_ERROR), cbarg);
        return;
    }
    if (readcb)
        readcb(c->bev, cbarg);
}

/* The read event is edge-triggered (EV_ET) on a connected socket with nothing queued to write: epoll then
 * reports the socket once per arrival, where level-triggered it polls every reported socket again at the
 * next wait (a tcp_poll per engine read, ≈ 1 % of a streaming router's CPU). It is level-triggered while the
 * bufferevent may have its write event on the same socket (connecting, or a request not sent whole): libevent
 * registers one set of flags per socket. Edge-triggered reads go on until a read comes back short with no
 * end reported (conn_read_more), and reading turned on again reads once whatever came while it was off. */
static void conn_read_arm(struct up_conn *c)
{
    if (!c->reading)
        return;
    evutil_socket_t fd = bufferevent_getfd(c->bev);
    int edge = c->connected && evbuffer_get_length(bufferevent_get_output(c->bev)) == 0;
    /* EV_CLOSED both ways: switched from edge to level within one loop iteration, libevent's change list keeps
     * the edge flag of a removed EV_CLOSED interest and registers the socket's write event edge-triggered too;
     * a bufferevent writes 16 KiB per write event, so the rest of a request larger than the socket's buffer
     * (a 16 MiB prompt on a reused connection) was then never written */
    short what = EV_READ | EV_PERSIST | EV_CLOSED | (edge ? EV_ET : 0);
    if (!c->rev) {
        if (fd < 0)
            return;
        c->rev = event_new(c->t->base, fd, what, conn_read_cb, c);
        if (!c->rev)
            return;
        c->edge = edge;
    } else if (c->edge != edge) {
        event_del(c->rev);
        event_assign(c->rev, c->t->base, fd, what, conn_read_cb, c);
        c->edge = edge;
    }
    if (c->has_rtv) {
        event_add(c->rev, &c->rtv); /* a persistent event's timeout restarts at each read */
    } else {
        event_add(c->rev, NULL);
        event_remove_timer(c->rev); /* adding without a timeout keeps one set before (a parked connection) */
    }
}

static void conn_read(struct up_conn *c, int on)
{
    if (!conn_own_read(c)) {
        if (on)
            bufferevent_enable(c->bev, EV_READ);
        else
            bufferevent_disable(c->bev, EV_READ);
        return;
    }
    int was = c->reading;
    c->reading = on;
    if (!on) {
        if (c->rev)
            event_del(c->rev);
        return;
    }
    conn_read_arm(c);
    if (!was && c->rev && c->edge)
        event_active(c->rev, EV_READ, 1); /* bytes that came while paused gave their edge already */
}

/* bufferevent_set_timeouts, with the read timeout kept by the connection's own read event. */
static void conn_timeouts(struct up_conn *c, const struct timeval *rd, const struct timeval *wr)
{
    struct timeval keep;
    if (rd) { /* (rd may be &c->rtv itself) */
        keep = *rd;
        rd = &keep;
    }
    c->has_rtv = rd && evutil_timerisset(rd); /* a zero timeout is none, as for a bufferevent */
    if (c->has_rtv)
        c->rtv = *rd;
    if (!conn_own_read(c)) {
        bufferevent_set_timeouts(c->bev, rd, wr);
        return;
    }
    bufferevent_set_timeouts(c->bev, NULL, wr);
    if (c->reading && c->rev)
        conn_read_arm(c);
}

static void conn_close(struct up_conn *c)
{
    if (c->rev)
        event_free(c->rev);
    bufferevent_free(c->bev);
    free(c);
}

struct up_thread *up_thread_new(struct event_base *base, const struct up_endpoint *eps, size_t n, size_t idle_max)
{
    struct up_thread *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->base = base;
    t->n = n;
    t->idle_max = idle_max;
    t->eps = calloc(n ? n : 1, sizeof *t->eps);
    t->idle = calloc(n ? n : 1, sizeof *t->idle);
    if (!t->eps || !t->idle) {
        free(t->eps);
        free(t->idle);
        free(t);
        return NULL;
    }
    memcpy(t->eps, eps, n * sizeof *eps);
    for (size_t i = 0; i < n; i++)
        TAILQ_INIT(&t->idle[i].list);
    return t;
}

struct up_thread *up_thread_new_shared(struct event_base *base, const struct up_endpoint *eps, size_t cap,
                                       size_t idle_max)
{
    struct up_thread *t = up_thread_new(base, eps, 0, idle_max);
    if (!t)
        return NULL;
    struct up_idle *idle = calloc(cap ? cap : 1, sizeof *idle);
    if (!idle) {
        up_thread_free(t);
        return NULL;
    }
    free(t->eps);
    free(t->idle);
    t->eps = (struct up_endpoint *)eps;
    t->shared_eps = 1;
    t->idle = idle;
    t->n = cap;
    for (size_t i = 0; i < cap; i++)
        TAILQ_INIT(&t->idle[i].list);
    return t;
}

void (*up_tls_failure_hook)(const struct up_endpoint *ep, const char *reason);

void up_thread_set_tls(struct up_thread *t, SSL_CTX *ctx)
{
    t->tls = ctx;
    if (!t->sessions) {
        t->sessions = calloc(t->n ? t->n : 1, sizeof *t->sessions);
        t->session_gen = calloc(t->n ? t->n : 1, sizeof *t->session_gen);
    }
}

void up_thread_free(struct up_thread *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->n; i++)
        while (!TAILQ_EMPTY(&t->idle[i].list))
            conn_free(TAILQ_FIRST(&t->idle[i].list));
    for (size_t i = 0; t->sessions && i < t->n; i++)
        SSL_SESSION_free(t->sessions[i]);
    free(t->sessions);
    free(t->session_gen);
    if (!t->shared_eps)
        free(t->eps);
    free(t->idle);
    free(t);
}

size_t up_thread_idle(const struct up_thread *t)
{
    size_t n = 0;
    for (size_t i = 0; i < t->n; i++)
        n += t->idle[i].n;
    return n;
}

size_t up_thread_open(const struct up_thread *t)
{
    return t->open_count;
}

uint64_t up_leg_bytes_in(const struct up_leg *leg)
{
    return leg->bytes_in;
}

/* ---------- connections ---------- */

static void conn_free(struct up_conn *c)
{
    if (!c->leg) {
        TAILQ_REMOVE(&c->t->idle[c->ep].list, c, link);
        c->t->idle[c->ep].n--;
    }
    c->t->open_count--;
    conn_close(c);
}

static void idle_event_cb(struct bufferevent *bev, short what, void *arg)
{
    conn_free(arg); /* the engine closed an idle connection (or sent junk): drop it */
}

static void idle_read_cb(struct bufferevent *bev, void *arg)
{
    conn_free(arg);
}

static void conn_park(struct up_conn *c)
{
    struct up_thread *t = c->t;
    c->leg = NULL;
    /* bytes after the answer, or a request the engine answered before it was all written (an early error):
     * this connection is out of step with the protocol */
    if (t->idle[c->ep].n >= t->idle_max || evbuffer_get_length(bufferevent_get_input(c->bev)) > 0 ||
        evbuffer_get_length(bufferevent_get_output(c->bev)) > 0) {
        t->open_count--;
        conn_close(c);
        return;
    }
    bufferevent_setcb(c->bev, idle_read_cb, NULL, idle_event_cb, c);
    conn_timeouts(c, NULL, NULL);
    conn_read(c, 1);
    TAILQ_INSERT_HEAD(&t->idle[c->ep].list, c, link);
    t->idle[c->ep].n++;
}

/* Detaches and closes the leg's connection. */
static void leg_drop_conn(struct up_leg *leg)
{
    struct up_conn *c = leg->c;
    if (!c)
        return;
    leg->c = NULL;
    c->leg = NULL;
    c->t->open_count--;
    conn_close(c);
}

static void leg_free(struct up_leg *leg)
{
    up_leg_release_req(leg);
    free(leg->hdr);
    if (leg->defer_ev)
        event_free(leg->defer_ev);
    free(leg);
}

static void leg_finish(struct up_leg *leg, int err)
{
    if (leg->c) {
        if (err == 0 && leg->keepalive) {
            struct up_conn *c = leg->c;
            leg->c = NULL;
            conn_park(c);
        } else {
            leg_drop_conn(leg);
        }
    }
    if (leg->cbs->on_done)
        leg->cbs->on_done(leg, err, leg->arg);
    leg_free(leg);
}

/* A reused keep-alive connection that failed before any response byte: the engine had closed it. */
static int leg_try_again(struct up_leg *leg)
{
    if (!leg->reused || leg->retried || leg->bytes_in > 0 || !leg->req[0])
        return 0;
    leg->retried = 1;
    leg_drop_conn(leg);
    return leg_attach(leg, 0) == 0;
}

/* One piece of an engine's answer through the leg's parser. Returns 0 to go on, 1 when the parser paused (the
 * answer is complete; *used bytes were its, what follows is not), -1 when the leg is gone (finished, canceled:
 * nothing of it may be touched). */
static int leg_parse(struct up_conn *c, struct up_leg *leg, const char *data, size_t len, size_t *used)
{
    if (leg->bytes_in == 0) {
        struct timeval idle = ms_tv(leg->to.idle_ms);
        conn_timeouts(c, &idle, NULL);
        up_leg_release_req(leg);
    }
    leg->bytes_in += len;
    leg->in_cb = 1;
    size_t n = http_parser_execute(&leg->parser, &up_parser_settings, data, len);
    leg->in_cb = 0;
    *used = n;
    if (leg->canceled) {
        leg_drop_conn(leg);
        leg_free(leg);
        return -1;
    }
    enum http_errno e = HTTP_PARSER_ERRNO(&leg->parser);
    if (e == HPE_PAUSED)
        return 1;
    if (e != HPE_OK || n != len) {
        leg_finish(leg, -EPROTO);
        return -1;
    }
    return 0;
}

/* After a read was parsed: the answer's end, or the read's (on_read_end). */
static void leg_read_end(struct up_leg *leg)
{
    if (leg->complete) {
        leg_finish(leg, 0);
        return;
    }
    if (leg->cbs->on_read_end) {
        leg->in_cb = 1;
        leg->cbs->on_read_end(leg, leg->arg);
        leg->in_cb = 0;
        if (leg->canceled) {
            leg_drop_conn(leg);
            leg_free(leg);
        }
    }
}

static void leg_read_cb(struct bufferevent *bev, void *arg)
{
    struct up_conn *c = arg;
    struct up_leg *leg = c->leg;
    struct evbuffer *in = bufferevent_get_input(bev);
    if (leg->orphan) {
        leg_drop_conn(leg);
        leg_free(leg);
        return;
    }
    while (evbuffer_get_length(in) > 0 && !leg->complete) {
        size_t chunk = evbuffer_get_contiguous_space(in);
        const char *data = (const char *)evbuffer_pullup(in, (ssize_t)chunk);
        size_t used;
        int rc = leg_parse(c, leg, data, chunk, &used);
        if (rc < 0)
            return; /* the leg is gone, and its connection with it */
        evbuffer_drain(in, rc > 0 ? used : chunk); /* bytes after the answer stay: the connection is not reused */
        if (rc > 0)
            break;
    }
    leg_read_end(leg);
}

/* conn_read_cb's usual case: a leg reading its answer with nothing left in the input. The read goes to a buffer
 * on the stack and straight to the parser (no reserve, commit, pull-up and drain of the input per read: about a
 * dozen calls into libevent per streamed token); bytes after the answer's end go to the input, where they keep
 * the connection from being reused (conn_park), as with the input's own path. */
static void leg_read_direct(struct up_conn *c, evutil_socket_t fd, short what)
{
    struct up_leg *leg = c->leg;
    char buf[4096];
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    int err = errno;
    conn_read_more(c, what, n, sizeof buf);
    if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK || err == EINTR))
        return;
    if (n <= 0) {
        errno = err;
        leg_event_cb(c->bev, BEV_EVENT_READING | (n == 0 ? BEV_EVENT_EOF : BEV_EVENT_ERROR), c);
        return;
    }
    if (leg->orphan) {
        leg_drop_conn(leg);
        leg_free(leg);
        return;
    }
    size_t used = 0;
    int rc = leg->complete ? 1 : leg_parse(c, leg, buf, (size_t)n, &used);
    if (rc < 0)
        return;
    if (rc > 0 && used < (size_t)n)
        evbuffer_add(bufferevent_get_input(c->bev), buf + used, (size_t)n - used);
    leg_read_end(leg);
}

static void leg_write_cb(struct bufferevent *bev, void *arg)
{
    struct up_conn *c = arg;
    struct up_leg *leg = c->leg;
    if (leg->orphan) {
        leg_drop_conn(leg);
        leg_free(leg);
        return;
    }
    if (leg->sent)
        return;
    leg->sent = 1;
    if (leg->cbs->on_sent) {
        leg->in_cb = 1;
        leg->cbs->on_sent(leg, leg->arg);
        leg->in_cb = 0;
        if (leg->canceled) {
            leg_drop_conn(leg);
            leg_free(leg);
        }
    }
}

static void leg_event_cb(struct bufferevent *bev, short what, void *arg)
{
    struct up_conn *c = arg;
    struct up_leg *leg = c->leg;
    if (what & BEV_EVENT_CONNECTED) {
        c->connected = 1;
        xpyd_tcp_nodelay(bufferevent_getfd(bev));
        /* --connect-timeout-ms bounded the connect; the request's upload (a long prompt to a slow reader) is
         * bounded by the first-byte timeout (the read timeout, set when the leg attached), as the rest of the
         * wait for the answer */
        conn_timeouts(c, c->has_rtv ? &c->rtv : NULL, NULL);
        return;
    }
    int err = EVUTIL_SOCKET_ERROR();
    unsigned long tls_err = (what & BEV_EVENT_ERROR) ? bufferevent_get_openssl_error(bev) : 0;
    if (tls_err) { /* a TLS failure (handshake, or a broken record later): like a connect error */
        char why[300];
        ERR_error_string_n(tls_err, why, sizeof why);
        const char *r = strrchr(why, ':');
        while (bufferevent_get_openssl_error(bev))
            ; /* the rest of this connection's queue */
        if (!c->connected && up_tls_failure_hook)
            up_tls_failure_hook(&c->t->eps[c->ep], r ? r + 1 : why);
        if (leg->orphan) {
            leg_drop_conn(leg);
            leg_free(leg);
            return;
        }
        leg_finish(leg, -UP_ETLS);
        return;
    }
    if (leg->orphan) {
        leg_drop_conn(leg);
        leg_free(leg);
        return;
    }
    if (what & BEV_EVENT_EOF) {
        /* A body delimited by the connection's end completes here. */
        leg->in_cb = 1;
        http_parser_execute(&leg->parser, &up_parser_settings, NULL, 0);
        leg->in_cb = 0;
        if (leg->canceled) {
            leg_drop_conn(leg);
            leg_free(leg);
            return;
        }
        if (leg->complete) {
            leg->keepalive = 0;
            leg_finish(leg, 0);
            return;
        }
        if (leg_try_again(leg))
            return;
        leg_finish(leg, -ECONNRESET);
        return;
    }
    if (what & BEV_EVENT_TIMEOUT) {
        leg_finish(leg, c->connected ? -ETIME : -ETIMEDOUT);
        return;
    }
    if (leg_try_again(leg))
        return;
    leg_finish(leg, err ? -err : -ECONNREFUSED);
}

static void deferred_fail_cb(evutil_socket_t fd, short ev, void *arg)
{
    struct up_leg *leg = arg;
    if (leg->orphan) {
        leg_drop_conn(leg);
        leg_free(leg);
        return;
    }
    leg_finish(leg, leg->defer_err);
}

static void leg_fail_later(struct up_leg *leg, int err)
{
    leg->defer_err = err;
    leg->defer_ev = event_new(leg->t->base, -1, 0, deferred_fail_cb, leg);
    struct timeval zero = {0, 0};
    event_add(leg->defer_ev, &zero);
}

/* Binds the leg to an idle or new connection and writes the request. 0, or negative errno. */
static int leg_attach(struct up_leg *leg, int allow_idle)
{
    struct up_thread *t = leg->t;
    unsigned gen = __atomic_load_n(&t->eps[leg->ep].gen, __ATOMIC_ACQUIRE);
    struct up_conn *c = NULL;
    while (allow_idle && (c = TAILQ_FIRST(&t->idle[leg->ep].list)) && c->gen != gen)
        conn_free(c); /* to the address the endpoint's slot had before: never reused */
    if (c) {
        TAILQ_REMOVE(&t->idle[leg->ep].list, c, link);
        t->idle[leg->ep].n--;
        leg->reused = 1;
    } else {
        c = calloc(1, sizeof *c);
        if (!c)
            return -ENOMEM;
        c->t = t;
        c->ep = leg->ep;
        c->gen = gen;
        const struct up_endpoint *ep = &t->eps[leg->ep];
        if (ep->tls && t->sessions && t->session_gen[leg->ep] != gen) { /* another server's session */
            SSL_SESSION_free(t->sessions[leg->ep]);
            t->sessions[leg->ep] = NULL;
            t->session_gen[leg->ep] = gen;
        }
        if (ep->tls) {
            SSL *ssl = t->tls ? xpyd_tls_client_ssl(t->tls, ep->host, t->sessions[leg->ep]) : NULL;
            if (!ssl) {
                free(c);
                return t->tls ? -UP_ETLS : -EPROTONOSUPPORT;
            }
            xpyd_tls_client_session_slot(ssl, &t->sessions[leg->ep]);
            c->bev = bufferevent_openssl_socket_new(t->base, -1, ssl, BUFFEREVENT_SSL_CONNECTING,
                                                    BEV_OPT_CLOSE_ON_FREE);
            if (c->bev) /* a peer that closes without close_notify ends a body the same as plain TCP */
                bufferevent_openssl_set_allow_dirty_shutdown(c->bev, 1);
        } else {
            c->bev = bufferevent_socket_new(t->base, -1, BEV_OPT_CLOSE_ON_FREE);
        }
        if (!c->bev) {
            free(c);
            return -ENOMEM;
        }
        t->open_count++;
        c->leg = leg; /* so a synchronous connect error finds its leg */
        leg->c = c;
        leg->reused = 0;
        bufferevent_setcb(c->bev, leg_read_cb, leg_write_cb, leg_event_cb, c);
        struct timeval cto = ms_tv(leg->to.connect_ms);
        conn_timeouts(c, NULL, &cto);
        if (bufferevent_socket_connect(c->bev, (struct sockaddr *)&ep->addr, (int)ep->addrlen) != 0) {
            leg_drop_conn(leg);
            return -ECONNREFUSED;
        }
    }
    c->leg = leg;
    leg->c = c;
    bufferevent_setcb(c->bev, leg_read_cb, leg_write_cb, leg_event_cb, c);
    struct timeval fb = ms_tv(leg->to.first_byte_ms), cto = ms_tv(leg->to.connect_ms);
    conn_timeouts(c, &fb, c->connected || leg->reused ? NULL : &cto);
    if (leg->reused)
        c->connected = 1;
    http_parser_init(&leg->parser, HTTP_RESPONSE);
    leg->parser.data = leg;
    leg->sent = 0;
    size_t len = leg->req_len;
    struct evbuffer *out = bufferevent_get_output(c->bev);
    if (!leg->reused) {
        /* A new connection is never tried again (leg_try_again): the request is not kept once written. A
         * stream waiting for its engine's first byte holds ~1 KiB less (section 4 of bench/overhead.sh). */
        for (int i = 0; i < leg->nreq; i++)
            up_piece_queue(out, leg->req[i], 0);
        up_leg_release_req(leg);
        bufferevent_enable(c->bev, EV_WRITE);
        conn_read(c, 1);
        return 0;
    }
    /* A pooled plain connection with nothing queued: send now. The request usually goes out whole, and then
     * the write event is never armed: that saves two epoll_ctl calls and a loop iteration per request (the
     * write callback would only run to find an empty buffer). leg->req stays intact either way: a stale
     * connection's error sends it again on a new one. Whatever did not fit (or an error) takes the
     * bufferevent's path, which also reports the error. */
    size_t done = 0;
    if (!t->eps[leg->ep].tls && !leg->cbs->on_sent && evbuffer_get_length(out) == 0) {
        struct iovec iov[2];
        for (int i = 0; i < leg->nreq; i++)
            iov[i] = (struct iovec){leg->req[i]->p, leg->req[i]->n};
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)leg->nreq};
        ssize_t n = sendmsg(bufferevent_getfd(c->bev), &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        done = n > 0 ? (size_t)n : 0;
    }
    if (done == len) {
        leg->sent = 1;
        conn_read(c, 1);
        return 0;
    }
    for (int i = 0; i < leg->nreq; i++) { /* the rest, by reference (the leg keeps its own for a retry) */
        if (done >= leg->req[i]->n) {
            done -= leg->req[i]->n;
            continue;
        }
        up_piece_queue(out, leg->req[i], done);
        done = 0;
    }
    bufferevent_enable(c->bev, EV_WRITE);
    conn_read(c, 1);
    return 0;
}

struct up_leg *up_leg_start_parts(struct up_thread *t, int ep, char *head, size_t head_len, char *body,
                                  size_t body_len, const struct up_timeouts *to, const struct up_leg_cbs *cbs, void *arg)
{
    struct up_leg *leg = ep >= 0 && (size_t)ep < t->n ? calloc(1, sizeof *leg) : NULL;
    if (!leg) {
        free(head);
        free(body);
        return NULL;
    }
    leg->t = t;
    leg->ep = ep;
    leg->cbs = cbs;
    leg->arg = arg;
    leg->to = *to;
    leg->req[0] = up_piece_new(head, head_len);
    leg->nreq = 1;
    if (body && body_len) {
        leg->req[1] = up_piece_new(body, body_len);
        leg->nreq = 2;
    } else {
        free(body);
    }
    if (!leg->req[0] || (leg->nreq == 2 && !leg->req[1])) {
        leg_free(leg);
        return NULL;
    }
    leg->req_len = head_len + (leg->nreq == 2 ? body_len : 0);
    int rc = leg_attach(leg, 1);
    if (rc != 0)
        leg_fail_later(leg, rc);
    return leg;
}

struct up_leg *up_leg_start(struct up_thread *t, int ep, struct evbuffer *req, const struct up_timeouts *to,
                            const struct up_leg_cbs *cbs, void *arg)
{
    size_t n = evbuffer_get_length(req);
    char *bytes = malloc(n ? n : 1);
    if (!bytes)
        return NULL;
    evbuffer_remove(req, bytes, n);
    return up_leg_start_parts(t, ep, bytes, n, NULL, 0, to, cbs, arg);
}

void up_leg_cancel(struct up_leg *leg)
{
    if (!leg || leg->canceled)
        return;
    leg->canceled = 1;
    if (leg->in_cb)
        return; /* the callback that is running frees it when it unwinds */
    leg_drop_conn(leg);
    leg_free(leg);
}

void up_leg_cancel_after_send(struct up_leg *leg)
{
    if (!leg || leg->canceled || leg->orphan)
        return;
    if (leg->sent || leg->in_cb || !leg->c) {
        up_leg_cancel(leg);
        return;
    }
    leg->orphan = 1;
    /* Output still pending: the write callback closes the connection once it drained. */
    if (evbuffer_get_length(bufferevent_get_output(leg->c->bev)) == 0 && leg->c->connected) {
        leg_drop_conn(leg);
        leg_free(leg);
    }
}

void up_leg_pause(struct up_leg *leg)
{
    if (leg && leg->c)
        conn_read(leg->c, 0);
}

void up_leg_resume(struct up_leg *leg)
{
    if (leg && leg->c)
        conn_read(leg->c, 1);
}
