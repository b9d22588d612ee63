/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_http_req.c - libFuzzer harness: the strict request reader the connection guard runs on every client
 * byte (router/http_req.c). The input is taken as a request head and as a chunked body. Beyond "no crash,
 * no UB": an accepted head only points inside the input, its values carry no CR/LF/NUL, its target is
 * routable, and the canonical head the guard hands libevhtp parses again to the same request (so libevhtp
 * only ever sees what this reader accepted); the chunked decoder gives the same bytes and the same end
 * whether the body arrives at once or byte by byte. */
#include "http_req.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CAP 64

static int inside(const char *p, size_t n, const char *base, size_t len)
{
    return p >= base && p + n <= base + len;
}

struct sink {
    char buf[1 << 16];
    size_t n;
};

static void collect(void *arg, const char *p, size_t n)
{
    struct sink *s = arg;
    if (s->n + n <= sizeof s->buf)
        memcpy(s->buf + s->n, p, n);
    s->n += n;
}

static void check_head(const char *in, size_t len)
{
    struct hr_field f[CAP], g[CAP + 2]; /* the canonical head may add Content-Length and Connection */
    struct hr_head h, h2;
    int st = hr_parse_head(in, len, f, CAP, &h);
    if (st) {
        if (!h.error || (st != 400 && st != 417 && st != 431 && st != 501 && st != 505))
            abort();
        return;
    }
    if (!h.mlen || !h.tlen || (h.minor != 0 && h.minor != 1) || h.nfields > CAP)
        abort();
    if (h.target[0] != '/' && !(h.tlen == 1 && h.target[0] == '*'))
        abort();
    if (h.chunked && h.content_length >= 0)
        abort();
    char canon[70000];
    size_t n = (size_t)snprintf(canon, sizeof canon, "%.*s %.*s HTTP/1.%d\r\n", (int)h.mlen, h.method, (int)h.tlen,
                                h.target, h.minor);
    for (size_t i = 0; i < h.nfields; i++) {
        if (!inside(f[i].name, f[i].nlen, in, len) || !inside(f[i].val, f[i].vlen, in, len) || !f[i].nlen)
            abort();
        for (size_t k = 0; k < f[i].vlen; k++)
            if (f[i].val[k] == '\r' || f[i].val[k] == '\n' || f[i].val[k] == 0)
                abort();
        if (!f[i].drop && n + f[i].nlen + f[i].vlen + 8 < sizeof canon)
            n += (size_t)snprintf(canon + n, sizeof canon - n, "%.*s: %.*s\r\n", (int)f[i].nlen, f[i].name,
                                  (int)f[i].vlen, f[i].val);
    }
    if (h.content_length >= 0 || h.chunked)
        n += (size_t)snprintf(canon + n, sizeof canon - n, "Content-Length: 0\r\n");
    if (!h.keep_alive)
        n += (size_t)snprintf(canon + n, sizeof canon - n, "Connection: close\r\n");
    else if (h.minor == 0)
        n += (size_t)snprintf(canon + n, sizeof canon - n, "Connection: keep-alive\r\n");
    n += (size_t)snprintf(canon + n, sizeof canon - n, "\r\n");
    if (n >= sizeof canon)
        return;
    if (hr_parse_head(canon, n, g, CAP + 2, &h2) != 0)
        abort(); /* the canonical form of an accepted head must be accepted */
    if (h2.mlen != h.mlen || memcmp(h2.method, h.method, h.mlen) || h2.tlen != h.tlen ||
        memcmp(h2.target, h.target, h.tlen) || h2.minor != h.minor || h2.keep_alive != h.keep_alive)
        abort();
}

static void check_chunked(const char *in, size_t len)
{
    static struct sink a, b;
    struct hr_chunked ca = {0}, cb = {0};
    const char *ea = NULL, *eb = NULL;
    int da = 0, db = 0;
    a.n = b.n = 0;
    ssize_t ra = hr_chunked_feed(&ca, in, len, 4096, collect, &a, &da, &ea);
    ssize_t rb = 0;
    for (size_t i = 0; i < len && !db; i++) {
        ssize_t r = hr_chunked_feed(&cb, in + i, 1, 4096, collect, &b, &db, &eb);
        if (r < 0) {
            rb = r;
            break;
        }
        rb += r;
    }
    if ((ra < 0) != (rb < 0) || (ra >= 0 && (ra != rb || da != db || a.n != b.n)))
        abort(); /* the same input read in one piece or byte by byte gives the same result */
    if (ra >= 0 && a.n <= sizeof a.buf && memcmp(a.buf, b.buf, a.n))
        abort();
    if (ra > (ssize_t)len || (ra < 0 && !ea))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 65536)
        return 0;
    check_head((const char *)data, size);
    check_chunked((const char *)data, size);
    return 0;
}
