/* SPDX-License-Identifier: Apache-2.0 */
/* threads.c - the router's event-loop threads: the list of them (so that an instance freeing a slot can wake
 * every thread's admission queue, from any thread) and the calling thread's own state. The threads themselves
 * are workers.c's. */
#include "router.h"

#include <event2/event.h>
#include <pthread.h>

static pthread_mutex_t threads_mu = PTHREAD_MUTEX_INITIALIZER;
static struct rthread *all_threads;
static __thread struct rthread *self;

void rt_threads_add(struct rthread *t)
{
    pthread_mutex_lock(&threads_mu);
    t->next_thread = all_threads;
    all_threads = t;
    pthread_mutex_unlock(&threads_mu);
    self = t;
}

void rt_threads_remove(struct rthread *t)
{
    pthread_mutex_lock(&threads_mu);
    for (struct rthread **pp = &all_threads; *pp; pp = &(*pp)->next_thread)
        if (*pp == t) {
            *pp = t->next_thread;
            break;
        }
    pthread_mutex_unlock(&threads_mu);
    if (self == t)
        self = NULL;
}

struct rthread *rt_thread_self(void)
{
    return self;
}

void rt_threads_kick_all(void)
{
    pthread_mutex_lock(&threads_mu);
    for (struct rthread *t = all_threads; t; t = t->next_thread)
        if (t->kick)
            event_active(t->kick, EV_READ, 0);
    pthread_mutex_unlock(&threads_mu);
}
