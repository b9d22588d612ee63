/* client_conn.c - the router's guard in front of libevhtp for each client connection.
 *
 * libevhtp 1.2.18 parses whatever arrives and, on its own limits, closes the connection without an answer.
 * The guard sits between the socket and libevhtp's parser: while a request head is arriving it holds the
 * bytes back, counts them (header bytes, header lines, line length) and watches the clock, so that a
 * client gets an answer in OpenAI's error shape:
 *   - head not complete within --header-timeout-ms          -> 408, then close (slowloris defence)
 *   - body stalls longer than --body-idle-timeout-ms         -> 408, then close
 *   - head over --max-header-bytes / --max-headers / a line over --max-header-line-bytes -> 431, then close
 *   - a connection over --max-connections                    -> 503 + Retry-After, then close
 *   - no new request within --keepalive-timeout-ms           -> closed quietly (nothing was asked)
 * Only once the head is complete and within limits are the bytes handed to libevhtp, which then parses
 * exactly what it would have parsed anyway. After a 408/431 the connection is half-closed and read and
 * discarded for up to --linger-ms, so the client reads the answer instead of a reset.
 *
 * States: IDLE (between requests) -> HEAD (first byte of a request seen) -> BODY (head complete, handed to
 * libevhtp) -> BUSY (request complete, handler running) -> IDLE (response finished, keep-alive), or
 * REJECTED (answer written, lingering) from HEAD/BODY. */
#include "router.h"

#include "xpyd_oai.h"
#include "xpyd_util.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
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
    enum cc_state state;
    int over_capacity;      /* answer every request with 503 and close */
    size_t scanned;         /* head bytes already looked at (input is not drained while in HEAD) */
    size_t line_start;      /* offset of the current head line */
    long lines;             /* head lines seen (request line + headers) */
    bufferevent_data_cb ev_read, ev_write;
    bufferevent_event_cb ev_event;
    void *ev_arg;
    evhtp_callback_cb handler;   /* the request's own handler, wrapped to mark the request complete */
    void *handler_arg;
};

static void arm(struct cconn *cc, long ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(cc->timer, &tv);
}

static void cc_free(struct cconn *cc)
{
    if (!cc)
        return;
    event_free(cc->timer);
    free(cc);
}

/* ---- rejection: a raw answer, then a lingering close ---- */

static void linger_read(struct bufferevent *bev, void *arg)
{
    struct evbuffer *in = bufferevent_get_input(bev);
    evbuffer_drain(in, evbuffer_get_length(in));
}

static void linger_write(struct bufferevent *bev, void *arg)
{
    struct cconn *cc = arg;
    if (evbuffer_get_length(bufferevent_get_output(bev)) == 0)
        shutdown(cc->c->sock, SHUT_WR);
}

/* libevhtp 1.2.18 frees the connection when its write callback runs while no request is in progress
 * ("no request associated with connection"). That happens on a keep-alive connection between requests:
 * after a streamed answer, EV_WRITE stays enabled and a write event with nothing left to write still runs
 * the callback. The client's idle keep-alive connection was closed under it, racing its next request.
 * Between requests there is nothing for libevhtp to do on a write event, so it is not told. */
static void guard_write(struct bufferevent *bev, void *arg)
{
    struct cconn *cc = arg;
    if (!cc->c->request)
        return;
    cc->ev_write(bev, cc->ev_arg);
}

static void guard_event(struct bufferevent *bev, short what, void *arg)
{
    struct cconn *cc = arg;
    cc->ev_event(bev, what, cc->ev_arg);
}

static void reject(struct cconn *cc, int status, const char *reason, int reason_idx, const char *msg)
{
    atomic_fetch_add(&g_rt->ctr.client_rejected[reason_idx], 1);
    xpyd_log_event("event=client_rejected status=%d reason=%s", status, reason);
    char *body = xpyd_oai_error_json(status, NULL, msg, NULL);
    struct evbuffer *out = bufferevent_get_output(cc->c->bev);
    evbuffer_add_printf(out, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                             "Connection: close\r\n\r\n%s",
                        status, status == 408 ? "Request Timeout" : "Request Header Fields Too Large", strlen(body),
                        body);
    free(body);
    cc->state = CC_REJECTED;
    linger_read(cc->c->bev, cc);
    bufferevent_setcb(cc->c->bev, linger_read, linger_write, guard_event, cc);
    bufferevent_enable(cc->c->bev, EV_READ | EV_WRITE);
    arm(cc, g_rt->cfg.linger_ms);
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

/* Scans the held-back head for its end and its limits. Returns 1 when complete, 0 when more is needed,
 * -1 after rejecting. */
static int scan_head(struct cconn *cc, struct evbuffer *in)
{
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
        if (line_len == 0 && cc->lines == 0) { /* stray CRLF before a request: allowed, skipped */
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

static void guard_read(struct bufferevent *bev, void *arg)
{
    struct cconn *cc = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    if (cc->state == CC_IDLE) {
        if (evbuffer_get_length(in) == 0)
            return;
        cc->state = CC_HEAD;
        cc->scanned = cc->line_start = 0;
        cc->lines = 0;
        arm(cc, g_rt->cfg.header_timeout_ms);
    }
    if (cc->state == CC_HEAD) {
        int r = scan_head(cc, in);
        if (r <= 0)
            return;
        cc->state = CC_BODY; /* the headers hook or the handler moves it on */
        arm(cc, g_rt->cfg.body_idle_timeout_ms);
    } else if (cc->state == CC_BODY) {
        arm(cc, g_rt->cfg.body_idle_timeout_ms);
    } else if (cc->state == CC_REJECTED) {
        linger_read(bev, cc);
        return;
    }
    cc->ev_read(bev, cc->ev_arg);
}

/* ---- hooks from libevhtp ---- */

static void over_capacity_handler(evhtp_request_t *req, void *arg)
{
    evhtp_headers_add_header(req->headers_out, evhtp_header_new("Retry-After", "1", 0, 0));
    rt_close_after_reply(req);
    rt_reply_error(req, 503, "the router is at --max-connections; retry later");
}

/* libevhtp 1.2.18's evhtp_request_set_keepalive(req, 0) does not clear the flag, so the connection would
 * stay open after a "Connection: close" answer; clearing it directly makes libevhtp close once it is sent. */
void rt_close_after_reply(evhtp_request_t *req)
{
    req->flags &= (uint16_t)~EVHTP_REQ_FLAG_KEEPALIVE; /* libevhtp then writes "Connection: close" itself */
}

/* The whole request has arrived: the body timer stops until the response is done. */
static void wrapped_handler(evhtp_request_t *req, void *arg)
{
    struct cconn *cc = arg;
    cc->state = CC_BUSY;
    evtimer_del(cc->timer);
    cc->handler(req, cc->handler_arg);
}

const char *const rt_client_reject_names[RT_CR_COUNT] = {"over_capacity", "header_timeout", "body_timeout",
                                                       "headers_too_large", "keepalive_idle"};

int rt_client_headers_hook(evhtp_request_t *req, void *guard)
{
    struct cconn *cc = guard;
    if (cc->over_capacity) {
        atomic_fetch_add(&g_rt->ctr.client_rejected[RT_CR_OVER_CAPACITY], 1);
        req->cb = over_capacity_handler;
        req->cbarg = NULL;
        return 0;
    }
    cc->handler = req->cb;
    cc->handler_arg = req->cbarg;
    req->cb = wrapped_handler;
    req->cbarg = cc;
    if (cc->state == CC_IDLE || cc->state == CC_HEAD) { /* a pipelined request parsed straight from the buffer */
        cc->state = CC_BODY;
        arm(cc, g_rt->cfg.body_idle_timeout_ms);
    }
    return 0;
}

static evhtp_res on_request_fini(evhtp_request_t *req, void *arg)
{
    struct cconn *cc = arg;
    if (cc->state == CC_REJECTED)
        return EVHTP_RES_OK;
    cc->state = CC_IDLE;
    arm(cc, g_rt->cfg.keepalive_timeout_ms);
    return EVHTP_RES_OK;
}

static evhtp_res on_conn_fini(evhtp_connection_t *c, void *arg)
{
    atomic_fetch_sub(&g_rt->ctr.connections, 1);
    /* libevhtp frees the connection's request after this hook: its fini hook must not see the guard */
    evhtp_connection_unset_hook(c, evhtp_hook_on_request_fini);
    cc_free(arg);
    return EVHTP_RES_OK;
}

/* Accept thread: counts the connection; far over the limit (a quarter plus 16 above it) it is closed at
 * once, since even answering costs a buffer. */
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
    cc->timer = XPYD_XALLOC(evtimer_new(bufferevent_get_base(c->bev), on_timer, cc));
    if (atomic_load(&g_rt->ctr.connections) > g_rt->cfg.max_connections) {
        cc->over_capacity = 1;
        atomic_fetch_add(&g_rt->ctr.connections_rejected, 1);
    }
    bufferevent_getcb(c->bev, &cc->ev_read, &cc->ev_write, &cc->ev_event, &cc->ev_arg);
    bufferevent_setcb(c->bev, guard_read, guard_write, guard_event, cc);
    evhtp_connection_set_hook(c, evhtp_hook_on_connection_fini, (evhtp_hook)on_conn_fini, cc);
    evhtp_connection_set_hook(c, evhtp_hook_on_request_fini, (evhtp_hook)on_request_fini, cc);
    arm(cc, g_rt->cfg.header_timeout_ms); /* a new connection owes a request head */
    return cc;
}
