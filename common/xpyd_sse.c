/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_sse.c - SSE writer and incremental event splitter (see xpyd_sse.h for the contract). */
#include "xpyd_sse.h"

#include <errno.h>
#include <event2/buffer.h>
#include <stdlib.h>
#include <string.h>

int xpyd_sse_write(struct evbuffer *out, const char *payload, size_t len)
{
    if (evbuffer_add(out, "data: ", 6) || evbuffer_add(out, payload, len) || evbuffer_add(out, "\n\n", 2))
        return -ENOMEM;
    return 0;
}

int xpyd_sse_write_done(struct evbuffer *out)
{
    return evbuffer_add(out, "data: [DONE]\n\n", 14) ? -ENOMEM : 0;
}

static int grow(char **p, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    size_t nc = *cap ? *cap : 256;
    while (nc < need)
        nc *= 2;
    char *np = realloc(*p, nc);
    if (!np)
        return -ENOMEM;
    *p = np;
    *cap = nc;
    return 0;
}

static int data_append(struct xpyd_sse_parser *p, const char *v, size_t n)
{
    size_t extra = p->has_data ? 1 : 0;
    if (grow(&p->data, &p->dcap, p->dlen + extra + n + 1))
        return -ENOMEM;
    if (extra)
        p->data[p->dlen++] = '\n';
    memcpy(p->data + p->dlen, v, n);
    p->dlen += n;
    p->data[p->dlen] = '\0';
    p->has_data = 1;
    return 0;
}

/* Handles one line (without its terminator). Returns 1 when the line ends an event. */
static int handle_line(struct xpyd_sse_parser *p, const char *line, size_t n)
{
    if (n == 0)
        return 1;
    if (line[0] == ':')
        return 0; /* comment */
    const char *colon = memchr(line, ':', n);
    size_t flen = colon ? (size_t)(colon - line) : n;
    if (flen == 4 && memcmp(line, "data", 4) == 0) {
        const char *v = colon ? colon + 1 : line + n;
        size_t vn = (size_t)(line + n - v);
        if (vn && *v == ' ') {
            v++;
            vn--;
        }
        return data_append(p, v, vn) ? -ENOMEM : 0;
    }
    return 0; /* event:, id:, retry: and unknown fields are kept in raw only */
}

int xpyd_sse_feed(struct xpyd_sse_parser *p, const char *bytes, size_t n, xpyd_sse_event_cb cb, void *arg)
{
    if (n == 0) /* nothing new (and no buffer yet: no pointer arithmetic on NULL) */
        return 0;
    size_t max_event = p->max_event ? p->max_event : (1u << 20);
    if (grow(&p->buf, &p->cap, p->len + n))
        return -ENOMEM;
    memcpy(p->buf + p->len, bytes, n);
    p->len += n;
    size_t line_start = p->scan;
    /* p->scan always sits at a line start: lines are consumed whole. */
    while (1) {
        char *nl = memchr(p->buf + line_start, '\n', p->len - line_start);
        if (!nl)
            break;
        size_t end = (size_t)(nl - p->buf);
        size_t ln = end - line_start;
        if (ln && p->buf[line_start + ln - 1] == '\r')
            ln--;
        int r = handle_line(p, p->buf + line_start, ln);
        if (r < 0)
            return r;
        line_start = end + 1;
        if (r == 1) {
            if (p->has_data) {
                int rc = cb(arg, p->data, p->dlen, p->buf + p->ev_start, line_start - p->ev_start);
                p->dlen = 0;
                p->has_data = 0;
                if (rc) {
                    p->ev_start = p->scan = line_start;
                    return rc;
                }
            }
            p->ev_start = line_start;
        }
    }
    p->scan = line_start;
    /* Compact consumed events out of the buffer. */
    if (p->ev_start > 0) {
        memmove(p->buf, p->buf + p->ev_start, p->len - p->ev_start);
        p->len -= p->ev_start;
        p->scan -= p->ev_start;
        p->ev_start = 0;
    }
    if (p->len > max_event)
        return -EMSGSIZE;
    return 0;
}

size_t xpyd_sse_pending(const struct xpyd_sse_parser *p)
{
    return p->len - p->ev_start;
}

void xpyd_sse_reset(struct xpyd_sse_parser *p)
{
    size_t max_event = p->max_event;
    free(p->buf);
    free(p->data);
    memset(p, 0, sizeof *p);
    p->max_event = max_event;
}
