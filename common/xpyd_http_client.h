/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_http_client.h - the router's HTTP/1.1 client to engines: per-thread keep-alive pools, http-parser framing.
 *
 * A leg is one request to one endpoint. Contract (libuv style): if up_leg_start() returns NULL no callback
 * ever fires; otherwise on_done fires exactly once (err 0 = whole response read; negative errno otherwise),
 * unless the owner calls up_leg_cancel() first, after which nothing fires. on_head and on_body fire before
 * on_done. The leg is freed by this module right after on_done returns; the owner must drop its pointer.
 * Everything runs on the event loop of the thread that owns the up_thread. */
#ifndef XPYD_HTTP_CLIENT_H
#define XPYD_HTTP_CLIENT_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

struct event_base;
struct evbuffer;
struct up_leg;
struct up_thread;

struct ssl_ctx_st; /* OpenSSL SSL_CTX */

/* on_done's err for a TLS failure (handshake or record) with an https endpoint; the reason goes to
 * up_tls_failure_hook. */
#define UP_ETLS EKEYREJECTED

struct up_endpoint {
    char host[256];          /* as configured (for the Host header, SNI, certificate checks and messages) */
    int port;
    char hostport[272];      /* host:port as the Host header gives it ([v6]:port), made once by up_endpoint_resolve */
    int tls;                 /* https: connections are TLS (up_thread_set_tls gives the context) */
    struct sockaddr_storage addr; /* resolved once at startup */
    socklen_t addrlen;
    unsigned gen;            /* bumped (atomically, release) when the slot is given to another address: pooled
                              * connections and TLS sessions of an older generation are not used again */
};

struct up_timeouts {
    long connect_ms;     /* TCP connect */
    long first_byte_ms;  /* request written -> first response byte */
    long idle_ms;        /* between response bytes once it started */
};

struct up_leg_cbs {
    void (*on_head)(struct up_leg *leg, int status, void *arg);
    void (*on_body)(struct up_leg *leg, const char *data, size_t len, void *arg);
    void (*on_done)(struct up_leg *leg, int err, void *arg);
    /* Optional: the request has been fully written to the socket. */
    void (*on_sent)(struct up_leg *leg, void *arg);
    /* Optional: one response header (name up to 63 bytes, value up to 255; longer ones are not reported),
     * before on_head. */
    void (*on_header)(struct up_leg *leg, const char *name, const char *value, void *arg);
    /* Optional: every on_body of one socket read has run (the leg goes on): what they queued can go out
     * together. */
    void (*on_read_end)(struct up_leg *leg, void *arg);
};

/* Creates the per-thread state for n endpoints (idle pools of at most idle_max connections per endpoint: a
 * finished connection beyond that is closed). NULL on OOM. Owner thread only. */
struct up_thread *up_thread_new(struct event_base *base, const struct up_endpoint *eps, size_t n, size_t idle_max);
/* Like up_thread_new, but the endpoints are the caller's array of cap entries, read in place: entries may
 * be filled in later (before any leg uses them) and the array must outlive the thread. */
struct up_thread *up_thread_new_shared(struct event_base *base, const struct up_endpoint *eps, size_t cap,
                                       size_t idle_max);
void up_thread_free(struct up_thread *t);
/* The client TLS context (xpyd_tls_client_new) for endpoints with tls set; the caller keeps it alive. Each
 * thread remembers the last session per endpoint and offers it on the next connection (resumption). */
void up_thread_set_tls(struct up_thread *t, struct ssl_ctx_st *ctx);
/* Called (any thread) when a TLS handshake with an upstream fails: for counting and logging. */
extern void (*up_tls_failure_hook)(const struct up_endpoint *ep, const char *reason);
/* Idle pooled connections held right now (tests, /status). */
size_t up_thread_idle(const struct up_thread *t);
/* Connections currently open (busy + idle). */
size_t up_thread_open(const struct up_thread *t);

/* Sends req (a whole serialized HTTP request; drained) to endpoint ep over a pooled or new connection. */
struct up_leg *up_leg_start(struct up_thread *t, int ep, struct evbuffer *req, const struct up_timeouts *to,
                            const struct up_leg_cbs *cbs, void *arg);
/* The same with the request in two pieces, a head and a body (NULL: none), both malloc'd and owned by the leg
 * from the call on (freed on failure too): nothing is copied again to be sent. */
struct up_leg *up_leg_start_parts(struct up_thread *t, int ep, char *head, size_t head_len, char *body,
                                  size_t body_len, const struct up_timeouts *to, const struct up_leg_cbs *cbs, void *arg);
/* Stops the leg: no more callbacks; its connection is closed (never reused mid-response). */
void up_leg_cancel(struct up_leg *leg);
/* Dispatch-and-cancel: no more callbacks; the request is still written out completely, then the
 * connection is closed (so the engine sees the request and its cancellation, and frees what it holds). */
void up_leg_cancel_after_send(struct up_leg *leg);
/* Backpressure: stop/restart reading the response (timeouts are suspended while paused). */
void up_leg_pause(struct up_leg *leg);
void up_leg_resume(struct up_leg *leg);
/* Bytes of response received so far (0 means nothing came back yet: safe to retry elsewhere). */
uint64_t up_leg_bytes_in(const struct up_leg *leg);

/* Appends "METHOD path HTTP/1.1\r\nHost: host:port\r\n" for ep; the caller adds the other headers, the
 * blank line and the body. */
void up_request_line(struct evbuffer *b, const struct up_endpoint *ep, const char *method, const char *path);

/* Resolves "host" + port into ep (numeric or by name). 0 or -EINVAL. */
int up_endpoint_resolve(struct up_endpoint *ep, const char *host, int port);

#endif
