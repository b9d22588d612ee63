/* SPDX-License-Identifier: Apache-2.0 */
/* stream.c - what the client of a generate request receives: a JSON answer, or an SSE stream relayed event by
 * event from the decode (relay.c decides per event: forward the engine's bytes, rewrite, drop), with the first
 * token spliced in from the prefill (--first-token prefill), usage patched, and backpressure (a slow client
 * pauses the decode leg). Errors take OpenAI's shape: an answer before the first byte, an error event and
 * [DONE] after. Nothing here ends a request: request.c does. */
#include "stream.h"

#include "handoff.h"
#include "relay.h"
#include "rewrite.h"

#include "xpyd_oai.h"
#include "xpyd_sse.h"
#include "xpyd_util.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/bufferevent_struct.h>
#include <event2/event.h>
#include <evhtp/evhtp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdlib.h>
#include <string.h>

static void add_header(evhtp_request_t *req, const char *k, const char *v)
{
    evhtp_headers_add_header(req->headers_out, evhtp_header_new(k, v, 0, 1));
}

static struct bufferevent *client_bev(struct request *r)
{
    return r->ereq ? evhtp_connection_get_bev(evhtp_request_get_connection(r->ereq)) : NULL;
}

/* An OpenSSL bufferevent makes one TLS record, and one write(), of every piece (chain) of its output buffer:
 * the response head, each chunk of a stream and the chunked terminator would each be one. Before the loop
 * writes, what is queued becomes one piece (a copy of at most TLS_COALESCE_MAX bytes; a record holds 16 KiB),
 * so everything one engine read produced goes out as one record and one write. */
#define TLS_COALESCE_MAX 16384
static void tls_coalesce(struct bufferevent *bev)
{
    struct evbuffer *out = bufferevent_get_output(bev);
    size_t n = evbuffer_get_length(out);
    if (n > 1)
        evbuffer_pullup(out, (ev_ssize_t)(n < TLS_COALESCE_MAX ? n : TLS_COALESCE_MAX));
}

/* A stream's chunk and TLS stage keep their room between engine reads up to this size (a typical event needs
 * a few hundred bytes: the first room is 512); past it a buffer is freed once emptied, so an occasional
 * large event does not stay held for the rest of the stream. */
#define BYTES_KEEP 16384

/* Bytes for the client: a TLS client's are staged, a plain client's go to the connection's output. */
static void out_add(struct request *r, struct bufferevent *bev, const void *p, size_t n)
{
    if (bufferevent_openssl_get_ssl(bev))
        xpyd_bytes_add(&r->stage, p, n);
    else
        evbuffer_add(bufferevent_get_output(bev), p, n);
}

/* TLS write-through. An OpenSSL bufferevent arms its write event as soon as bytes land in its empty output, and
 * disarms it once it wrote them on the next loop: two epoll_ctl calls and a trip through the loop per engine
 * read. A TLS client's bytes are staged in r->stage instead (a flat array kept for the request: no buffer
 * chain allocated, joined and freed per engine read), and client_flush encrypts and writes them with
 * one SSL_write (at most one record's worth) when libevent has no write of its own going on this connection:
 * its output is empty, its write event is not pending (a backlog, or a read blocked on a write, keeps it in)
 * and OpenSSL's last call did not stop on a full socket. (The read event is in while a stream is answered, as
 * between requests: a write blocked on a read would have left bytes in the output, and renegotiation is off.)
 * Otherwise, or when SSL_write does not complete, the staged bytes move to the
 * output whole, as one piece at its start, and the bufferevent writes them: its SSL_write is then the retry
 * OpenSSL asks for (libevent sets SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER; renegotiation is off, so a write
 * never waits on a read after the handshake). */
/* The staged bytes go to the bufferevent, which writes them when the socket takes them, as one piece with
 * whatever it still holds. */
static void tls_unstage(struct request *r, struct bufferevent *bev)
{
    if (r->stage.len) {
        evbuffer_add(bufferevent_get_output(bev), r->stage.p, r->stage.len);
        xpyd_bytes_reset(&r->stage, BYTES_KEEP);
    }
    tls_coalesce(bev);
}

static int tls_write_through(struct request *r, struct bufferevent *bev, SSL *ssl)
{
    size_t n = r->stage.len;
    if (n == 0)
        return 1;
    int backlog = evbuffer_get_length(bufferevent_get_output(bev)) > 0 || event_pending(&bev->ev_write, EV_WRITE, NULL);
    if (backlog || n > TLS_COALESCE_MAX || !SSL_is_init_finished(ssl) || SSL_want(ssl) == SSL_WRITING)
        return 0;
    if (ERR_peek_error()) /* SSL_get_error needs an empty queue; clearing it every time showed in profiles */
        ERR_clear_error();
    if (SSL_write(ssl, r->stage.p, (int)n) != (int)n) {
        ERR_clear_error(); /* the bufferevent's retry reports a real error through the event callback */
        return 0;
    }
    xpyd_bytes_reset(&r->stage, BYTES_KEEP);
    return 1;
}

/* Write-through: a stream's bytes are written to a plain client socket from the callback that produced them,
 * with the connection's write event off (client_write_through_again). Only bytes the socket cannot take turn
 * the write event on, and libevent drains that backlog. This saves, per write, the two epoll_ctl calls that
 * arming and disarming the write event cost and one trip through the event loop. TLS connections keep
 * libevent's write event (the OpenSSL bufferevent does the writing). The end of a stream still goes through
 * the write event: libevhtp finishes a request (keep-alive or close) from its write callback. */
static void client_flush(struct request *r)
{
    struct bufferevent *bev = client_bev(r);
    if (!bev)
        return;
    SSL *ssl = bufferevent_openssl_get_ssl(bev);
    if (ssl) {
        if (!tls_write_through(r, bev, ssl))
            tls_unstage(r, bev);
        return;
    }
    if (bufferevent_get_enabled(bev) & EV_WRITE)
        return; /* a backlog is being drained by libevent: these bytes queue behind it */
    struct evbuffer *out = bufferevent_get_output(bev);
    if (evbuffer_get_length(out)) {
        /* a bufferevent keeps its output's start frozen so that only its own write drains it: this is that write */
        evbuffer_unfreeze(out, 1);
        evbuffer_write(out, bufferevent_getfd(bev)); /* an error leaves the bytes: the write event reports it */
        evbuffer_freeze(out, 1);
    }
    if (evbuffer_get_length(out))
        bufferevent_enable(bev, EV_WRITE);
}

/* The client's bytes not written yet: the connection's output and what is staged for TLS. */
static size_t client_pending(const struct request *r, struct bufferevent *bev)
{
    return evbuffer_get_length(bufferevent_get_output(bev)) + r->stage.len;
}

/* Before queueing bytes: with nothing waiting, the write event goes off and writing is write-through (turning
 * it off costs nothing then: libevent took it out of epoll when the buffer last emptied, or never put it in). */
static void client_write_through_again(struct request *r)
{
    struct bufferevent *bev = client_bev(r);
    if (bev && !bufferevent_openssl_get_ssl(bev) && (bufferevent_get_enabled(bev) & EV_WRITE) &&
        evbuffer_get_length(bufferevent_get_output(bev)) == 0)
        bufferevent_disable(bev, EV_WRITE);
}

void client_stream_start(struct request *r)
{
    if (r->client != CLIENT_NOTHING || !r->ereq)
        return;
    r->client = CLIENT_STREAMING;
    r->status = 200;
    r->t_first = xpyd_now_us();
    rt_hist_observe(&g_rt->ctr.ttft, (double)(r->t_first - r->t_start) / 1e6);
    atomic_fetch_add(&g_rt->ctr.active_streams, 1);
    client_write_through_again(r);
    /* The head is written here, not by libevhtp (whose head builder prints it through a scratch buffer
     * allocated per request). HTTP/1.1: chunked. HTTP/1.0 clients do not know the chunked coding (RFC 9112
     * section 6.1: a server must not send it to them): the stream is sent as it is and ends when the connection
     * closes. Queued: it goes out in one write with the first event, which every caller queues next. */
    evhtp_request_t *req = r->ereq;
    struct bufferevent *bev = client_bev(r);
    if (!bev)
        return;
    static const char head11[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                                 "Transfer-Encoding: chunked\r\n";
    static const char head10[] = "HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                                 "Connection: close\r\n\r\n";
    if (req->proto != EVHTP_PROTO_11) {
        xpyd_close_after_reply(req);
        req->flags &= (uint16_t)~EVHTP_REQ_FLAG_CHUNKED;
        out_add(r, bev, head10, sizeof head10 - 1);
        return;
    }
    req->flags |= EVHTP_REQ_FLAG_CHUNKED; /* evhtp_send_reply_chunk_end writes the last chunk */
    out_add(r, bev, head11, sizeof head11 - 1);
    static const char end_keep[] = "\r\n", end_close[] = "Connection: close\r\n\r\n";
    if (req->flags & EVHTP_REQ_FLAG_KEEPALIVE)
        out_add(r, bev, end_keep, sizeof end_keep - 1);
    else
        out_add(r, bev, end_close, sizeof end_close - 1);
}

/* While the decode leg is paused for a slow client: resume once the client's buffer drained to half. */
static void on_backpressure_tick(evutil_socket_t fd, short ev, void *arg)
{
    struct request *r = arg;
    struct up_leg *dleg = r->legs[RT_DECODE].up;
    if (!r->paused || !r->ereq || !dleg)
        return;
    struct bufferevent *bev = evhtp_connection_get_bev(evhtp_request_get_connection(r->ereq));
    if (bev && client_pending(r, bev) > (size_t)g_rt->cfg.client_buffer_bytes / 2) {
        struct timeval tv = {0, 2000};
        event_add(r->bp_timer, &tv);
        return;
    }
    r->paused = 0;
    XLOG_DEBUG("msg=\"client caught up: decode leg resumed\" request_id=%s", r->xid);
    up_leg_resume(dleg);
}

/* One SSE event ("data: <payload>\n\n") into the next chunk. */
static void chunk_event(struct request *r, const char *payload, size_t len)
{
    xpyd_bytes_add(&r->chunk, "data: ", 6);
    xpyd_bytes_add(&r->chunk, payload, len);
    xpyd_bytes_add(&r->chunk, "\n\n", 2);
}

/* "<n in hex>\r\n" into p (room for 16 digits and CRLF); returns its length. */
static size_t chunk_size_line(char *p, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    char tmp[16];
    size_t k = 0;
    do {
        tmp[k++] = hex[n & 15];
        n >>= 4;
    } while (n && k < sizeof tmp);
    for (size_t i = 0; i < k; i++)
        p[i] = tmp[k - 1 - i];
    p[k] = '\r';
    p[k + 1] = '\n';
    return k + 2;
}

/* Sends what r->chunk holds as one chunk (then empty, its room kept for the next). */
static void queue_chunk(struct request *r)
{
    struct bufferevent *bev = client_bev(r);
    size_t n = r->chunk.len;
    client_write_through_again(r);
    if (bev && n) {
        /* the chunk framing written here, as libevhtp's chunk writer would, without its printf per chunk (a
         * tenth of the router's user time on short streams); a TLS client's go to its stage (out_add) */
        if (r->ereq->flags & EVHTP_REQ_FLAG_CHUNKED) {
            char head[24];
            out_add(r, bev, head, chunk_size_line(head, n));
            out_add(r, bev, r->chunk.p, n);
            out_add(r, bev, "\r\n", 2);
        } else {
            out_add(r, bev, r->chunk.p, n);
        }
    }
    xpyd_bytes_reset(&r->chunk, BYTES_KEEP);
}

static void send_chunk(struct request *r)
{
    if (!r->ereq) {
        xpyd_bytes_reset(&r->chunk, BYTES_KEEP);
        return;
    }
    queue_chunk(r);
    struct bufferevent *bev = client_bev(r);
    if (!r->in_read || !r->legs[RT_DECODE].up)
        client_flush(r); /* else client_read_done writes it with the rest of the read */
    /* Backpressure: a slow client pauses the decode leg instead of growing this buffer without bound. */
    struct up_leg *dleg = r->legs[RT_DECODE].up;
    if (bev && client_pending(r, bev) > (size_t)g_rt->cfg.client_buffer_bytes && dleg && !r->paused) {
        r->paused = 1;
        XLOG_DEBUG("msg=\"client slow: decode leg paused\" request_id=%s", r->xid);
        up_leg_pause(dleg);
        if (!r->bp_timer)
            r->bp_timer = XPYD_XALLOC(event_new(r->t->base, -1, 0, on_backpressure_tick, r));
        struct timeval tv = {0, 2000};
        event_add(r->bp_timer, &tv);
    }
}

/* An event is ready for the client. While one upstream read is being relayed (r->batch), events collect in
 * r->chunk and go out together once the read is done: one chunk, one TLS record, one write for everything
 * that arrived at once (the relay's cost per event stays, the client connection's is paid once). */
static void flush_chunk(struct request *r)
{
    if (!r->batch)
        send_chunk(r);
}

static void flush_pending(struct request *r)
{
    if (r->chunk.len)
        send_chunk(r);
}

static void write_event_json(struct request *r, const cJSON *o)
{
    char *s = XPYD_XALLOC(cJSON_PrintUnformatted(o));
    chunk_event(r, s, strlen(s));
    free(s);
    flush_chunk(r);
}

void client_read_done(struct request *r)
{
    r->in_read = 0;
    client_flush(r);
}

/* The end of a stream, written through. When the last events and the terminator went out at once, nothing is
 * left for libevent to write, and resuming the request as libevhtp does (evhtp_request_resume: its resume
 * event arms the write event, and libevhtp finishes the request from its write callback once the output
 * drained) would cost an epoll_ctl to arm it, a trip through the loop and an epoll_ctl to disarm it, per
 * request. libevhtp's write callback is run instead, deferred to after the current callback as a write event
 * would have run it: the request is finished and its output empty, so libevhtp frees it (keep-alive: the guard
 * reads the next request) or closes the connection. The connection stops being paused here, as
 * evhtp_connection_resume would have done without its event; a connection libevhtp marked to be freed on
 * resume (an error while paused), or one already waiting on a write, takes libevhtp's own way. */
static int finish_in_place(struct request *r, struct bufferevent *bev)
{
    if (!rt_client_pause_ours(r->ereq))
        return 0;
    SSL *ssl = bufferevent_openssl_get_ssl(bev);
    if (ssl ? !tls_write_through(r, bev, ssl) : (client_flush(r), 0))
        return 0;
    if (client_pending(r, bev) || event_pending(&bev->ev_write, EV_WRITE, NULL))
        return 0;
    /* Plain: write-through turned the write event off, and the next answer on this connection (a JSON answer, a
     * 100 Continue, a refusal) is queued to the output for libevent to write, which it does only with the write
     * event on. Turning it on would arm it in epoll to find nothing to write; the bufferevent is put in the state
     * libevent leaves it in after draining its output instead: on, not pending. */
    if (!ssl)
        bev->enabled |= EV_WRITE;
    rt_client_unpause(r->ereq);
    bufferevent_trigger(bev, EV_WRITE, BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
    return 1;
}

/* The answer is complete (staged or in the output, FINISHED set): finished in place, or its bytes left to the
 * bufferevent and the request to libevhtp's resume, which finishes it from the write callback. */
static void client_finish(struct request *r, struct bufferevent *bev)
{
    if (r->state != REQ_DONE) {
        r->finish_held = 1; /* req_end writes it, once the request is counted */
        return;
    }
    if (finish_in_place(r, bev))
        return;
    if (bufferevent_openssl_get_ssl(bev))
        tls_unstage(r, bev);
    else if (evbuffer_get_length(bufferevent_get_output(bev)))
        bufferevent_enable(bev, EV_WRITE);
    evhtp_request_resume(r->ereq); /* deferred by libevhtp: the keep-alive connection reads again */
}

void client_finish_held(struct request *r)
{
    if (!r->finish_held)
        return;
    r->finish_held = 0;
    struct bufferevent *bev = client_bev(r);
    if (r->ereq && bev)
        client_finish(r, bev);
}

void client_stream_end(struct request *r)
{
    r->in_read = 0;
    struct bufferevent *bev = client_bev(r);
    if (!r->ereq || !bev) {
        flush_pending(r);
        return;
    }
    client_write_through_again(r); /* a backlog drained since: the end is written through too */
    if (r->chunk.len)
        queue_chunk(r); /* the last events and the terminator, together: one write (one record on TLS) */
    if (r->ereq->flags & EVHTP_REQ_FLAG_CHUNKED)
        out_add(r, bev, "0\r\n\r\n", 5);
    evhtp_send_reply_end(r->ereq); /* finished: libevhtp's write callback ends it once the output drained */
    client_finish(r, bev);
}

/* A complete JSON answer, finished as a stream's end is. */
void client_answer_json(struct request *r, int status, const char *body, size_t len)
{
    evhtp_request_t *req = r->ereq;
    struct bufferevent *bev = client_bev(r);
    if (!req || !bev || r->client != CLIENT_NOTHING)
        return;
    r->client = CLIENT_ANSWERED;
    r->status = status;
    if ((status == 429 || status == 503) && r->retry_after[0])
        add_header(req, "Retry-After", r->retry_after);
    client_write_through_again(r);
    if (bufferevent_openssl_get_ssl(bev)) {
        struct evbuffer *b = XPYD_XALLOC(evbuffer_new());
        xpyd_reply_to(req, b, status, "application/json", body, len);
        size_t n = evbuffer_get_length(b);
        evbuffer_remove(b, xpyd_bytes_room(&r->stage, n), n);
        r->stage.len += n;
        evbuffer_free(b);
    } else {
        xpyd_reply_to(req, bufferevent_get_output(bev), status, "application/json", body, len);
    }
    client_finish(r, bev);
}

void client_error(struct request *r, int status, const char *msg)
{
    char *e = xpyd_oai_error_json(status, NULL, msg, NULL);
    if (r->client == CLIENT_STREAMING) { /* one error event, then [DONE] */
        chunk_event(r, e, strlen(e));
        chunk_event(r, "[DONE]", 6);
        flush_chunk(r);
        client_stream_end(r);
    } else {
        client_answer_json(r, status, e, strlen(e));
    }
    free(e);
}

void client_stream_free(struct request *r)
{
    if (r->bp_timer) {
        event_free(r->bp_timer);
        r->bp_timer = NULL;
    }
    if (r->client == CLIENT_STREAMING)
        atomic_fetch_sub(&g_rt->ctr.active_streams, 1);
}

/* A content event is going to the client: count it and record the inter-token gap. */
static void token_out(struct request *r)
{
    uint64_t now = xpyd_now_us();
    if (r->t_last_tok)
        rt_hist_observe(&g_rt->ctr.itl, (double)(now - r->t_last_tok) / 1e6);
    r->t_last_tok = now;
    r->tokens_out++;
}

/* The decode produced one more token: its load falls by one, down to the KV part it still holds. */
static void decode_token_done(struct request *r)
{
    struct leg *d = &r->legs[RT_DECODE];
    if (d->charge > r->prompt_tokens) {
        xb_adjust(g_rt->pools[RT_DECODE], d->idx, -1);
        d->charge--;
    }
}

/* One decode SSE event: relay.c decides (forward, rewrite, drop); here the side effects happen. */
static int on_decode_event(void *arg, const char *data, size_t len, const char *raw, size_t rawlen)
{
    struct request *r = arg;
    struct relay_state st = {.prefill_mode = r->prefill_token_sent,
                             .prefill_answered = r->legs[RT_PREFILL].answered,
                             .cached_tokens = r->cached_tokens,
                             .first_text = r->first_text,
                             .resp_id = r->resp_id,
                             .track_text = r->gen_text != NULL,
                             .continuation = r->migrations > 0,
                             .delivered = (long)r->tokens_before,
                             .role_sent = r->role_sent,
                             .first_dropped = r->first_dropped,
                             .done_seen = r->done_seen,
                             .preempted = r->preempted};
    struct relay_out out;
    relay_event(&st, data, len, &out);
    r->role_sent = st.role_sent;
    r->first_dropped = st.first_dropped;
    r->done_seen = st.done_seen;
    r->preempted = st.preempted;
    if (out.id) { /* the id the client sees: a continuation keeps it */
        if (!r->resp_id)
            r->resp_id = out.id;
        else
            free(out.id);
    }
    if (out.text && out.action != RELAY_DROP) /* what the client has, for a continuation (decode migration) */
        evbuffer_add(r->gen_text, out.text, out.text_len);
    free(out.text_buf);
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
        write_event_json(r, out.json);
        cJSON_Delete(out.json);
    } else {
        xpyd_bytes_add(&r->chunk, raw, rawlen);
        flush_chunk(r);
    }
    if (out.content && !r->first_token_seen) {
        r->first_token_seen = 1;
        if (r->ho->first_token)
            r->ho->first_token(r);
    }
    return 0;
}

int client_relay(struct request *r, const char *data, size_t len)
{
    r->batch = 1;
    int rc = xpyd_sse_feed(&r->sse, data, len, on_decode_event, r) < 0 ? -1 : 0;
    r->batch = 0;
    flush_pending(r);
    return rc;
}

void client_prefill_first_token(struct request *r)
{
    const char *model = r->model;
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
        write_event_json(r, o);
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
    write_event_json(r, o);
    cJSON_Delete(o);
    token_out(r);
    r->prefill_token_sent = 1; /* the relay now drops the decode's copy of this token */
    if (r->gen_text && r->first_text)
        evbuffer_add(r->gen_text, r->first_text, strlen(r->first_text));
}

int client_finish_json(struct request *r)
{
    struct evbuffer *b = r->legs[RT_DECODE].buf;
    size_t n = b ? evbuffer_get_length(b) : 0;
    cJSON *o = n ? cJSON_ParseWithLength((const char *)evbuffer_pullup(b, (ssize_t)n), n) : NULL;
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return -1;
    }
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, "usage"), "completion_tokens");
    if (cJSON_IsNumber(ct) && ct->valuedouble >= 0 && ct->valuedouble <= 1e12) /* range first: no UB cast */
        r->tokens_out = (int64_t)ct->valuedouble;
    cJSON_DeleteItemFromObjectCaseSensitive(o, "kv_transfer_params");
    if (r->legs[RT_PREFILL].answered)
        rw_patch_usage(o, r->cached_tokens);
    size_t len;
    char *s = rw_print(o, &len);
    cJSON_Delete(o);
    r->t_first = xpyd_now_us();
    client_answer_json(r, 200, s, len);
    free(s);
    return 0;
}
