/* SPDX-License-Identifier: Apache-2.0 */
/* xb_internal.h - pool layout shared by the balancer's policy files. */
#ifndef XB_INTERNAL_H
#define XB_INTERNAL_H

#include "xb.h"
#include "xb_prefix.h"

#include <pthread.h>

struct xb_inst {
    struct xb_instance_cfg cfg;
    int healthy;
    int64_t inflight, outstanding;
    int64_t feedback; /* atomic: engine-reported load in tokens */
    int64_t remote, remote_inflight; /* atomic: what other routers report charging it (xb_set_remote) */
    uint64_t selected;
    int failures;            /* consecutive failed attempts */
    int last_failed;         /* the last reported attempt failed (counted even with ejection off) */
    int kv_lost_by;          /* 1 + the first decode that failed with its KV since its last success; 0: none */
    int fail_src;            /* 1 + the source its last failure lacked (xb_report_from), 0: none or another cause */
    uint64_t fail_src_uses;  /* that source's uses (xb_uses) then */
    uint64_t used;           /* atomic: its output used by another instance (xb_report_used) */
    uint64_t ejected_until;  /* monotonic µs; skipped until then */
    uint64_t ejections;      /* ejections so far; the next one lasts longer; reset by a success */
    uint64_t ejections_total;
    int removed;             /* taken out at runtime (admin API, reload): never picked; slot kept */
    int unready;             /* xb_set_ready(0): never picked until ready again */
    long learned_mml;        /* max_model_len the engine reported (xb_set_learned_max_model_len); 0: none */
};

struct xb_pool {
    pthread_mutex_t mu;
    int policy;
    uint64_t rng;
    uint64_t rotor; /* rotating start for tie-breaking and round robin */
    int skip_full;  /* during a pick: pass over instances at max_inflight */
    int hard_cap;   /* max_inflight is a limit: when every candidate is full, xb_pick says -EBUSY */
    uint64_t now;   /* during a pick: monotonic µs */
    int eject_after;
    long eject_base_ms, eject_max_ms;
    struct xb_inst *inst;
    size_t n, cap;
    int fixed;      /* capacity reserved up front: never reallocated (instances added while picking) */
    /* cache-aware placement (xb_cache.c) */
    struct xb_prefix *prefix; /* NULL: off */
    double max_imbalance;
    uint64_t uncached_milli;  /* weight of a request's uncached tokens in the cache policy's cost, × 1000 */
    struct xb_query *q;       /* during a pick: the question (NULL for plain xb_pick) */
    int64_t pick_cached;      /* set by the cache policy: the chosen rank's predicted cached tokens */
    /* session affinity (xb_session.c) */
    double session_eps;       /* < 0: off */
    struct xb_ring_point *ring;
    size_t nring;
    int ring_dirty;           /* membership changed since the ring was built */
};

struct xb_ring_point {
    uint64_t h;
    int idx;
};

/* xb_load.c: the arithmetic every policy shares. */
/* The load placement compares: the router's own outstanding tokens, the engine's feedback and the other
 * routers' published load (never negative). */
int64_t xb_load_of(const struct xb_inst *in);
/* Requests in flight on it from every router (this one's and the others' published ones). */
int64_t xb_inflight_of(const struct xb_inst *in);
/* The max_model_len placement holds an instance to: the configured one, else what its engine reported; 0:
 * unknown (no filtering) */
long xb_mml(const struct xb_inst *in);
/* Candidate filter used by every policy. */
int xb_eligible(const struct xb_pool *p, size_t i, uint64_t need_len, const int *exclude, int nexclude);
/* a less loaded than b, normalised by capacity (weight * tp), by 64-bit cross-multiplication. */
int xb_less_loaded(const struct xb_inst *a, const struct xb_inst *b);
uint64_t xb_rand(struct xb_pool *p);
/* A uniformly random eligible instance, or -1. */
int xb_pick_random_eligible(struct xb_pool *p, uint64_t need_len, const int *exclude, int nexclude);

/* A policy: pick returns the chosen index among eligible ones, or -1. Called under p->mu. */
struct xb_policy_ops {
    const char *name;
    int (*pick)(struct xb_pool *p, uint64_t need_len, const int *exclude, int nexclude);
};
extern const struct xb_policy_ops xb_policy_lot, xb_policy_p2c, xb_policy_rr, xb_policy_random, xb_policy_cache;

/* xb_cache.c: tokens of q's prefix instance i probably holds, 0 when the load guard denies it credit. */
int64_t xb_cached_tokens(struct xb_pool *p, size_t i, const struct xb_query *q, double mean_norm_load);
/* Mean load per capacity over the eligible instances. */
double xb_mean_load(struct xb_pool *p, uint64_t need_len, const int *exclude, int nexclude);
/* xb_session.c: the session's rank within the load bound, or -1 (then the policy picks). */
int xb_session_pick(struct xb_pool *p, const struct xb_query *q);

#endif
