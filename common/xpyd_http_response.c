/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_http_response.c - an engine's HTTP answer read into its leg (http-parser's callbacks): the status, the
 * headers a leg asked for, the body as it comes, and where one response ends (see xpyd_http_internal.h). */
#include "xpyd_http_internal.h"

#include <stdlib.h>
#include <string.h>

static void header_emit(struct leg_header *h, struct up_leg *leg)
{
    if (h->state == 2 && !h->skip) {
        h->name[h->nl] = 0;
        h->value[h->vl] = 0;
        leg->cbs->on_header(leg, h->name, h->value, leg->arg);
    }
    h->nl = h->vl = 0;
    h->skip = 0;
    h->state = 0;
}

/* The header being assembled, NULL when headers are not wanted (no on_header, trailers after the head, out
 * of memory: the header is then not reported). */
static struct leg_header *leg_header_of(struct up_leg *leg)
{
    if (!leg->cbs->on_header || leg->status)
        return NULL; /* chunked trailers (after the head) are not headers of the answer */
    if (!leg->hdr)
        leg->hdr = calloc(1, sizeof *leg->hdr);
    return leg->hdr;
}

static int p_header_field(http_parser *p, const char *at, size_t len)
{
    struct up_leg *leg = p->data;
    struct leg_header *h = leg_header_of(leg);
    if (!h)
        return 0;
    if (h->state == 2)
        header_emit(h, leg);
    h->state = 1;
    if (h->nl + len >= sizeof h->name)
        h->skip = 1;
    else {
        memcpy(h->name + h->nl, at, len);
        h->nl += len;
    }
    return 0;
}

static int p_header_value(http_parser *p, const char *at, size_t len)
{
    struct up_leg *leg = p->data;
    struct leg_header *h = leg_header_of(leg);
    if (!h)
        return 0;
    h->state = 2;
    if (h->vl + len >= sizeof h->value)
        h->skip = 1;
    else {
        memcpy(h->value + h->vl, at, len);
        h->vl += len;
    }
    return 0;
}

static int p_headers_complete(http_parser *p)
{
    struct up_leg *leg = p->data;
    if (leg->hdr) {
        header_emit(leg->hdr, leg);
        free(leg->hdr);
        leg->hdr = NULL;
    }
    leg->status = (int)p->status_code;
    if (leg->status < 200 || leg->status > 599)
        return -1; /* not a final HTTP status (1xx, or nonsense like "HTTP/1.1 5"): a malformed response */
    if (leg->cbs->on_head)
        leg->cbs->on_head(leg, leg->status, leg->arg);
    return leg->canceled ? -1 : 0;
}

static int p_body(http_parser *p, const char *at, size_t len)
{
    struct up_leg *leg = p->data;
    if (leg->cbs->on_body)
        leg->cbs->on_body(leg, at, len, leg->arg);
    return leg->canceled ? -1 : 0;
}

static int p_complete(http_parser *p)
{
    struct up_leg *leg = p->data;
    leg->complete = 1;
    leg->keepalive = http_should_keep_alive(p);
    http_parser_pause(p, 1); /* nothing after one response is ours */
    return 0;
}

const http_parser_settings up_parser_settings = {
    .on_header_field = p_header_field,
    .on_header_value = p_header_value,
    .on_headers_complete = p_headers_complete,
    .on_body = p_body,
    .on_message_complete = p_complete,
};
