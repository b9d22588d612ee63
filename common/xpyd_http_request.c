/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_http_request.c - the request bytes a leg holds: pieces queued on a connection's output by reference
 * (a long prompt is not copied again to be sent) and freed at their last release (see xpyd_http_internal.h). */
#include "xpyd_http_internal.h"

#include <event2/buffer.h>
#include <stdlib.h>

struct up_piece *up_piece_new(char *p, size_t n)
{
    struct up_piece *x = malloc(sizeof *x);
    if (!x) {
        free(p);
        return NULL;
    }
    *x = (struct up_piece){p, n, 1};
    return x;
}

void up_piece_unref(struct up_piece *x)
{
    if (x && --x->refs == 0) {
        free(x->p);
        free(x);
    }
}

static void piece_cleanup(const void *data, size_t len, void *arg)
{
    up_piece_unref(arg);
}

/* Queues x from byte `from` on out, by reference. */
void up_piece_queue(struct evbuffer *out, struct up_piece *x, size_t from)
{
    x->refs++;
    if (evbuffer_add_reference(out, x->p + from, x->n - from, piece_cleanup, x) != 0)
        x->refs--; /* not queued (out of memory): the write fails, the leg with it */
}

void up_leg_release_req(struct up_leg *leg)
{
    for (int i = 0; i < leg->nreq; i++) {
        up_piece_unref(leg->req[i]);
        leg->req[i] = NULL;
    }
}
