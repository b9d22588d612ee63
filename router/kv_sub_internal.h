/* SPDX-License-Identifier: Apache-2.0 */
/* kv_sub_internal.h - the KV-event consumer's state, shared by its thread (kv_sub.c) and its /metrics page
 * (kv_metrics.c). Not for other modules: they use kv_sub.h. */
#ifndef XPYD_KV_SUB_INTERNAL_H
#define XPYD_KV_SUB_INTERNAL_H

#include "kv_events.h"
#include "kv_index.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define BIND_MAX 256  /* --kv-events-bind-ranks' bound */
#define PEND_SLOTS 16 /* a rank's requests in flight, by the period they were sent in (--kv-events-pending-ms / 16) */

struct kv_src {
    char ep[300];  /* the endpoint subscribed to ("" none); the consumer thread's alone */
    char bound[300]; /* bind mode: the engine (HOST:PORT) whose messages on the bound port + bound_r are this
                      * rank's ("" none); the consumer thread's alone */
    int bound_r;
    void *sub, *mon; /* the SUB socket, and the PAIR its connection events come on (zmq_socket_monitor) */
    int have_seq;
    uint64_t seq;
    void *rep;       /* a replay under way: its DEALER, read instead of the SUB until it ends (the consumer's) */
    uint64_t rep_from, rep_next, rep_upto, rep_deadline;
    int rep_strict;
    void *held;      /* the message whose number started the replay: applied after it */
    size_t held_len;
    uint64_t held_seq;
    struct kv_wait *wait, *wait_tail; /* bind mode: the rank's messages heard during its replay, in order (the
                                       * bound socket serves every engine, so they cannot stay in it); taken
                                       * after the replay; at most --kv-events-hwm (the consumer's) */
    size_t nwait;
    atomic_int on;                    /* subscribed */
    atomic_int up;                    /* connected to the publisher now (placement may trust it) */
    atomic_uint_fast64_t first_sent;  /* µs of the first prompt sent since its last message; 0: none */
    atomic_uint_fast64_t events;      /* events received from it (all kinds) */
    atomic_uint_fast64_t dropped_at;  /* µs its blocks were last forgotten (restart, clear, gap, lost connection) */
    atomic_uint_fast64_t pend[PEND_SLOTS]; /* period << 24 | requests sent to it then and still in flight */
    atomic_int hint; /* for the health checks: KV_HINT_GONE / KV_HINT_BACK since rt_kv_take_hint last took it */
    atomic_long unlike_bs; /* the block size its last full-attention BlockStored came in when unlike
                            * --prefix-block-tokens (its blocks can never match a prompt's: placement is approximate
                            * for it, rt_kv_source_trusted); 0: alike */
    atomic_uint_fast64_t bs_said_at; /* µs the block size's change was last logged (at most once every 10 s) */
};

/* 1 when placement may use what the rank reports: connected to its publisher, not silent past
 * --kv-events-stale-ms since a prompt was sent it, and its blocks of the router's size */
int rt_kv_source_trusted(const struct kv_src *s, uint64_t now);

/* A message kept for after its rank's replay: its number and payload. */
struct kv_wait {
    struct kv_wait *next;
    uint64_t seq;
    size_t len;
    unsigned char data[];
};

struct kv_consumer {
    int on[2];
    struct kvi *idx[2];
    struct kv_src *src[2];
    size_t cap;
    void *ctx;
    pthread_t th;
    int started;
    atomic_int stop;
    atomic_uint_fast64_t batches[2], events[2][3], gaps[2], replays_ok[2], replays_failed[2], resets[2];
    atomic_uint_fast64_t decode_errors[2][KVE_ECOUNT], skipped[2][KVI_COUNT], picks[2][2];
    atomic_uint_fast64_t lag_us[2]; /* the last batch: its arrival minus its ts */
    atomic_uint_fast64_t disconnects[2];
    atomic_long waiting[2]; /* messages kept while their ranks' replays are under way (bind mode) */
    atomic_int subscribed[2]; /* sources with an endpoint: none, and a query costs nothing */
    void *bsub[BIND_MAX]; /* bind mode: SUB sockets bound on PORT + r */
    int nbound;
    atomic_uint_fast64_t unmatched; /* bind mode: messages whose topic names no rank */
    pthread_mutex_t wake_mu; /* held while wake is called or changed (rt_kv_on_hint) */
    void (*wake)(void *);
    void *wake_arg;
};

extern struct kv_consumer kv_K;
int kv_query_init(void); /* kv_query.c: its per-thread memory (0, or -1) */
extern const char *const kv_roles[2];

#endif
