/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_http_internal.h - the HTTP client's own structures, shared by its files (not its API: that is
 * xpyd_http_client.h): xpyd_http_client.c (threads, connections, legs), xpyd_http_response.c (reading an
 * engine's answer), xpyd_endpoint.c (resolving an engine's address). */
#ifndef XPYD_HTTP_INTERNAL_H
#define XPYD_HTTP_INTERNAL_H

#include "xpyd_http_client.h"

#include <event2/event.h>
#include <http_parser.h>
#include <openssl/ssl.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/time.h>

struct up_conn {
    struct up_thread *t;
    int ep;
    unsigned gen;       /* the endpoint's generation when connected (up_endpoint.gen) */
    struct bufferevent *bev;
    struct up_leg *leg; /* NULL while idle */
    int connected;
    /* Plain connections read through their own event (conn_read_cb), not the bufferevent's: libevent's
     * socket read asks the kernel how much is readable (ioctl FIONREAD) before every read, one syscall more
     * per engine read (per streamed token, often). The bufferevent still connects, writes and holds the
     * input buffer; the callbacks set on it are the ones called. TLS connections read through it. */
    struct event *rev;  /* NULL for TLS, or until the socket exists */
    int reading;        /* EV_READ wanted */
    int edge;           /* rev is edge-triggered (see conn_read_arm) */
    int has_rtv;        /* a read (idle) timeout is set */
    struct timeval rtv;
    TAILQ_ENTRY(up_conn) link;
};
TAILQ_HEAD(up_conn_list, up_conn);
struct up_idle {
    struct up_conn_list list; /* most recently used first */
    size_t n;
};

struct up_thread {
    struct event_base *base;
    struct up_endpoint *eps; /* owned copy, or the caller's array (shared) */
    int shared_eps;
    size_t n;
    SSL_CTX *tls;            /* for endpoints with tls set (the caller's) */
    SSL_SESSION **sessions;  /* per endpoint: the last session, offered again (resumption); owned */
    unsigned *session_gen;   /* per endpoint: the generation the session is of */
    struct up_idle *idle;    /* per endpoint */
    size_t open_count;
    size_t idle_max;         /* per endpoint: a P->D request uses a connection to each of two engines, and a
                              * cap shared by all engines closed (and reopened) one in ten of them at 64
                              * streams (a TCP handshake and teardown each, ≈ 15 % of the router's CPU) */
};

struct up_leg {
    struct up_thread *t;
    struct up_conn *c;
    int ep;
    const struct up_leg_cbs *cbs;
    void *arg;
    struct up_timeouts to;
    struct up_piece *req[2]; /* the request's bytes (a head, and a body the caller built), kept for one
                              * transparent retry (a pooled connection the engine had closed) until the response
                              * starts; NULL when not (or no longer) held */
    int nreq;
    size_t req_len;
    http_parser parser;
    int status;
    int complete;
    int keepalive;
    int in_cb;
    int canceled;
    int sent;
    int retried;
    int reused;
    int orphan;             /* cancelled after send: finish writing, then close silently */
    uint64_t bytes_in;
    struct event *defer_ev; /* deferred failure delivery */
    int defer_err;
    struct leg_header *hdr; /* only while the head is read, for cbs->on_header (owned) */
};

/* A response header being assembled for cbs->on_header (http-parser may split names and values across
 * reads). Allocated at the head's first field and freed when the head is complete: not held by an open
 * stream. */
struct leg_header {
    char name[64], value[256];
    size_t nl, vl;
    int state, skip; /* 0 none, 1 in a name, 2 in a value; skip: too long, not reported */
};

/* Request bytes held by a leg and, while queued on a connection's output, by that output too (referred to, not
 * copied: a 16 MiB prompt is not copied again to be sent); freed at the last release. The owning thread's only. */
struct up_piece {
    char *p;
    size_t n;
    unsigned refs;
};

/* xpyd_http_request.c: a piece owning p (freed with it; NULL, p freed, when out of memory); a reference
 * dropped (the last frees it); the piece queued on out from byte `from`, by reference (the output holds one);
 * every piece of a leg's request let go. */
struct up_piece *up_piece_new(char *p, size_t n);
void up_piece_unref(struct up_piece *x);
void up_piece_queue(struct evbuffer *out, struct up_piece *x, size_t from);
void up_leg_release_req(struct up_leg *leg);

/* xpyd_http_response.c: an engine's answer read into its leg (status, headers for cbs->on_header, body for
 * cbs->on_body, its end; http_parser's data is the leg). */
extern const http_parser_settings up_parser_settings;

#endif
