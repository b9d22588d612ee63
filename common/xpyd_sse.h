/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_sse.h - Server-Sent Events: writing `data:` events and splitting a byte stream into events. */
#ifndef XPYD_SSE_H
#define XPYD_SSE_H

#include <stddef.h>

struct evbuffer;

/* Appends "data: <payload>\n\n" to out. Returns 0, or -ENOMEM (out unchanged or partially written). */
int xpyd_sse_write(struct evbuffer *out, const char *payload, size_t len);
/* Appends "data: [DONE]\n\n". */
int xpyd_sse_write_done(struct evbuffer *out);

/* Called once per complete event. data is the joined `data:` field values (lines joined with '\n',
 * NUL-terminated, len excludes the NUL); raw/rawlen are the event's bytes as received including the
 * terminating blank line. Events with no data field (comments only) are not reported. Return 0 to go
 * on, non-zero to stop xpyd_sse_feed (which then returns that value). */
typedef int (*xpyd_sse_event_cb)(void *arg, const char *data, size_t len, const char *raw, size_t rawlen);

/* Incremental SSE splitter. Zero-initialise, set max_event (0 means 1 MiB), feed bytes, reset at the end. */
struct xpyd_sse_parser {
    size_t max_event; /* bytes one event may take before it is rejected */
    char *buf;        /* owned: bytes not yet consumed */
    size_t len, cap;
    size_t scan;      /* how far buf has been searched for line ends */
    size_t ev_start;  /* where the current event's raw bytes begin in buf */
    char *data;       /* owned: the current event's joined data */
    size_t dlen, dcap;
    int has_data;
};

/* Feeds n bytes. Returns 0, the callback's non-zero value, -EMSGSIZE when one event exceeds max_event,
 * or -ENOMEM. After an error the parser must be reset before reuse. Single-threaded. */
int xpyd_sse_feed(struct xpyd_sse_parser *p, const char *bytes, size_t n, xpyd_sse_event_cb cb, void *arg);
/* Bytes buffered that do not yet form a complete event. */
size_t xpyd_sse_pending(const struct xpyd_sse_parser *p);
/* Frees buffers; the parser is zeroed except max_event and can be fed again. */
void xpyd_sse_reset(struct xpyd_sse_parser *p);

#endif
