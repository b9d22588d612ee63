/* SPDX-License-Identifier: Apache-2.0 */
/* http_req.h - strict HTTP/1.1 request reading (RFC 9112), pure: no I/O, no allocation, no router state.
 *
 * The connection guard (client_conn.c) reads every request head and body with these functions and hands
 * libevhtp only a canonical re-serialisation of what they accepted, so libevhtp's own parser never sees
 * input it mishandles. Unit-tested and fuzzed on its own (tests/fuzz/fuzz_http_req.c). */
#ifndef XPYD_HTTP_REQ_H
#define XPYD_HTTP_REQ_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct hr_field {
    const char *name, *val; /* point into the head; val without surrounding whitespace */
    size_t nlen, vlen;
    int drop;               /* hop-by-hop (framing, Expect, Connection and the fields it names) */
};

struct hr_head {
    const char *method, *target;
    size_t mlen, tlen;
    int minor;                /* HTTP/1.<minor>: 0 or 1 */
    int64_t content_length;   /* -1: none */
    int chunked;              /* Transfer-Encoding: chunked */
    int keep_alive;           /* the connection may carry another request after this one */
    int expect_continue;      /* Expect: 100-continue */
    const char *host, *auth;  /* the single Host / Authorization value, or NULL */
    size_t hostlen, authlen;
    size_t nfields;
    const char *error;        /* why, when the head is refused */
};

/* Parses one complete head p[0..len) (request line, fields, the empty line; leading empty lines skipped).
 * fields has room for cap entries. Returns 0, or the status to answer: 400 malformed or ambiguous (bare LF
 * or CR, obs-fold, whitespace before a colon, bad field name or value bytes, missing/duplicate Host on
 * HTTP/1.1, duplicate Authorization, Content-Length with Transfer-Encoding, differing or invalid
 * Content-Length, a last transfer coding other than chunked, a request line without a version), 431 more
 * than cap fields, 501 an unknown transfer coding or method, 505 a version other than 1.0/1.1, 417 an
 * Expect other than 100-continue. h->error says why. */
int hr_parse_head(const char *p, size_t len, struct hr_field *fields, size_t cap, struct hr_head *h);

/* Case-insensitive comparison of a field name with a NUL-terminated lower-case name. */
int hr_name_is(const struct hr_field *f, const char *lower);

/* The chunked body decoder (RFC 9112 §7.1): chunk extensions accepted and ignored, trailer fields
 * validated and discarded. */
struct hr_chunked {
    int state;
    uint64_t left;         /* bytes left in the current chunk */
    size_t line;           /* bytes of the current size or trailer line */
    size_t trailer_bytes;
    int digits;            /* of the size (leading zeros are allowed, any number of them: RFC 9112 7.1) */
    int significant;       /* size digits from the first non-zero one: at most 15 (below 2^60 bytes) */
    int ext;               /* inside a chunk extension */
    int quote;             /* inside a quoted extension value (1), after a backslash in it (2) */
};
typedef void (*hr_data_fn)(void *arg, const char *p, size_t n);
/* Feeds in[0..len); body bytes go to data(). Returns how many bytes were consumed (the rest belongs to the
 * next request) and sets *done once the last chunk and trailers are read, or returns -400 (malformed) /
 * -431 (trailers over max_trailer_bytes); h_error says why. */
ssize_t hr_chunked_feed(struct hr_chunked *c, const char *in, size_t len, size_t max_trailer_bytes, hr_data_fn data,
                        void *arg, int *done, const char **h_error);

#endif
