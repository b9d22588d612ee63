/* SPDX-License-Identifier: Apache-2.0 */
/* admission.h - waiting for a rank under max_inflight (admission.c): a FIFO per thread and role, woken from any
 * thread when a slot frees. */
#ifndef XPYD_ADMISSION_H
#define XPYD_ADMISSION_H

#include "request_state.h"

enum admission_outcome { ADMISSION_QUEUED = 0, ADMISSION_FULL };
/* Every eligible rank of role is full: r waits (FIFO per thread), and again(r) runs when a slot frees, or
 * expired(r) at --queue-timeout-ms. ADMISSION_FULL: the queue is full; the caller answers (429). */
int admission_wait(struct request *r, int role, void (*again)(struct request *r),
                   void (*expired)(struct request *r, int role));
/* The request leaves the queue, if it is in it (it ended). */
void admission_leave(struct request *r);
/* The request got an instance of role: a waiting one is counted as admitted and its deadline dropped. */
void admission_admitted(struct request *r, int role);
/* An instance of role freed a slot: every thread's queue for role tries again. */
void admission_wake(int role);
/* The thread's kick event (rthread.kick): its queues try again, in order. */
void admission_on_kick(int fd, short ev, void *arg);

#endif
