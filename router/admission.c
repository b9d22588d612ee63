/* SPDX-License-Identifier: Apache-2.0 */
/* admission.c - the admission queue: when every eligible rank of a pool is at its max_inflight, a request
 * waits here (FIFO, per router thread) until an instance frees a slot, up to --queue-timeout-ms; beyond
 * --admission-queue waiting requests the answer is "full". It returns outcomes and calls the request's own
 * callbacks; it never answers or ends a request itself. */
#include "admission.h"

#include "xpyd_util.h"

#include <event2/event.h>

/* An instance of role freed a slot: every thread with requests waiting for that role tries again (in its
 * own loop, soon; event_active is safe from any thread). */
void admission_wake(int role)
{
    if (atomic_load(&g_rt->ctr.queued[role]) > 0)
        rt_threads_kick_all();
}

/* Takes r out of its thread's queue (it keeps its deadline timer: the next pick may queue it again). */
static void unlink_request(struct request *r)
{
    int role = r->queued_role;
    if (role < 0)
        return;
    struct rthread *t = r->t;
    if (r->qprev)
        r->qprev->qnext = r->qnext;
    else
        t->qhead[role] = r->qnext;
    if (r->qnext)
        r->qnext->qprev = r->qprev;
    else
        t->qtail[role] = r->qprev;
    r->qprev = r->qnext = NULL;
    r->queued_role = -1;
    atomic_fetch_sub(&g_rt->ctr.queued[role], 1);
}

static void drop_timer(struct request *r)
{
    if (r->queue_timer) {
        event_free(r->queue_timer);
        r->queue_timer = NULL;
    }
}

void admission_leave(struct request *r)
{
    unlink_request(r);
    drop_timer(r);
}

void admission_admitted(struct request *r, int role)
{
    if (r->queue_timer) { /* it waited, and now has an instance */
        drop_timer(r);
        atomic_fetch_add(&g_rt->ctr.queue_admitted[role], 1);
    }
}

static void on_queue_timeout(evutil_socket_t fd, short ev, void *arg)
{
    struct request *r = arg;
    int role = r->queued_role;
    unlink_request(r);
    r->expired(r, role < 0 ? RT_DECODE : role);
}

int admission_wait(struct request *r, int role, void (*again)(struct request *r),
                   void (*expired)(struct request *r, int role))
{
    struct rthread *t = r->t;
    r->next = again;
    r->expired = expired;
    if (t->kick_role == role) { /* tried again from the queue and still no room: back to the front */
        r->queued_role = role;
        r->qprev = NULL;
        r->qnext = t->qhead[role];
        if (t->qhead[role])
            t->qhead[role]->qprev = r;
        else
            t->qtail[role] = r;
        t->qhead[role] = r;
        atomic_fetch_add(&g_rt->ctr.queued[role], 1);
        t->kick_blocked = 1;
        return ADMISSION_QUEUED;
    }
    if (atomic_fetch_add(&g_rt->ctr.queued[role], 1) >= g_rt->cfg.admission_queue) {
        atomic_fetch_sub(&g_rt->ctr.queued[role], 1);
        return ADMISSION_FULL;
    }
    r->queued_role = role;
    r->qnext = NULL;
    r->qprev = t->qtail[role];
    if (t->qtail[role])
        t->qtail[role]->qnext = r;
    else
        t->qhead[role] = r;
    t->qtail[role] = r;
    if (!r->queue_timer) {
        r->queue_timer = XPYD_XALLOC(evtimer_new(t->base, on_queue_timeout, r));
        struct timeval tv = {g_rt->cfg.queue_timeout_ms / 1000, (g_rt->cfg.queue_timeout_ms % 1000) * 1000};
        evtimer_add(r->queue_timer, &tv);
    }
    /* a slot may have been freed between the pick and the enqueue: look once more */
    event_active(t->kick, EV_READ, 0);
    return ADMISSION_QUEUED;
}

void admission_on_kick(evutil_socket_t fd, short ev, void *arg)
{
    struct rthread *t = arg;
    for (int role = 0; role < 2; role++) {
        t->kick_role = role;
        t->kick_blocked = 0;
        struct request *r;
        while (!t->kick_blocked && (r = t->qhead[role]) != NULL) {
            unlink_request(r);
            r->next(r);
        }
    }
    t->kick_role = -1;
}
