/* SPDX-License-Identifier: Apache-2.0 */
/* xb.c - balancer pools: the instance table, load accounting, health and ejection, and the dispatch to the
 * pool's policy (xb_<policy>.c, behind struct xb_policy_ops). */
#include "xb_internal.h"

#include <errno.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

struct xb_pool *xb_pool_new(int policy, uint64_t seed)
{
    struct xb_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    pthread_mutex_init(&p->mu, NULL);
    p->policy = policy;
    p->session_eps = -1;
    p->uncached_milli = 1000;
    p->rng = seed ? seed : 1;
    return p;
}

void xb_pool_free(struct xb_pool *p)
{
    if (!p)
        return;
    free(p->inst);
    xb_prefix_free(p->prefix);
    free(p->ring);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

int xb_pool_reserve(struct xb_pool *p, size_t cap)
{
    if (cap <= p->cap)
        return 0;
    struct xb_inst *ni = realloc(p->inst, cap * sizeof *ni);
    if (!ni)
        return -ENOMEM;
    p->inst = ni;
    p->cap = cap;
    p->fixed = 1;
    return 0;
}

int xb_pool_add(struct xb_pool *p, const struct xb_instance_cfg *cfg)
{
    if (cfg->tp < 1 || cfg->weight < 1)
        return -EINVAL;
    pthread_mutex_lock(&p->mu);
    if (p->n == p->cap && p->fixed) {
        pthread_mutex_unlock(&p->mu);
        return -ENOSPC;
    }
    if (p->n == p->cap) {
        size_t nc = p->cap ? p->cap * 2 : 8;
        struct xb_inst *ni = realloc(p->inst, nc * sizeof *ni);
        if (!ni) {
            pthread_mutex_unlock(&p->mu);
            return -ENOMEM;
        }
        p->inst = ni;
        p->cap = nc;
    }
    struct xb_inst *in = &p->inst[p->n];
    memset(in, 0, sizeof *in);
    in->cfg = *cfg;
    in->healthy = 1;
    p->ring_dirty = 1;
    int idx = (int)p->n;
    __atomic_store_n(&p->n, p->n + 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&p->mu);
    return idx;
}

int xb_set_removed(struct xb_pool *p, int idx, int removed)
{
    if (idx < 0 || (size_t)idx >= p->n)
        return -EINVAL;
    pthread_mutex_lock(&p->mu);
    if (p->prefix && p->inst[idx].removed != removed) /* out of placement; a returning engine starts cold */
        xb_prefix_drop_rank(p->prefix, idx);
    p->inst[idx].removed = removed;
    p->ring_dirty = 1;
    if (!removed) { /* back in the pool: a clean slate for health and ejection */
        p->inst[idx].healthy = 1;
        p->inst[idx].failures = 0;
        p->inst[idx].ejected_until = 0;
        p->inst[idx].ejections = 0;
    }
    pthread_mutex_unlock(&p->mu);
    return 0;
}

int xb_reuse(struct xb_pool *p, int idx, const struct xb_instance_cfg *cfg)
{
    if (idx < 0 || (size_t)idx >= p->n || cfg->tp < 1 || cfg->weight < 1)
        return -EINVAL;
    pthread_mutex_lock(&p->mu);
    struct xb_inst *in = &p->inst[idx];
    if (!in->removed || in->inflight != 0) {
        pthread_mutex_unlock(&p->mu);
        return -EBUSY;
    }
    if (p->prefix) { /* another engine: nothing of the old one's cache, and the default capacity */
        xb_prefix_drop_rank(p->prefix, idx);
        xb_prefix_set_capacity(p->prefix, idx, 0);
    }
    memset(in, 0, sizeof *in);
    in->cfg = *cfg;
    in->healthy = 1;
    p->ring_dirty = 1;
    pthread_mutex_unlock(&p->mu);
    return 0;
}

int xb_update(struct xb_pool *p, int idx, const struct xb_instance_cfg *cfg)
{
    if (idx < 0 || (size_t)idx >= p->n || cfg->tp < 1 || cfg->weight < 1)
        return -EINVAL;
    pthread_mutex_lock(&p->mu);
    struct xb_inst *in = &p->inst[idx];
    in->cfg.tp = cfg->tp;
    in->cfg.weight = cfg->weight;
    in->cfg.max_model_len = cfg->max_model_len;
    in->cfg.max_inflight = cfg->max_inflight;
    if (cfg->key && cfg->key != in->cfg.key) {
        in->cfg.key = cfg->key;
        p->ring_dirty = 1;
    }
    pthread_mutex_unlock(&p->mu);
    return 0;
}

size_t xb_pool_size(const struct xb_pool *p)
{
    return p->n;
}

long xb_max_model_len(struct xb_pool *p)
{
    long most = 0;
    int unknown = 0;
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < p->n; i++) {
        const struct xb_inst *in = &p->inst[i];
        if (in->removed || in->unready || !in->healthy)
            continue;
        if (xb_mml(in) <= 0)
            unknown = 1;
        else if (xb_mml(in) > most)
            most = xb_mml(in);
    }
    pthread_mutex_unlock(&p->mu);
    return unknown ? 0 : most;
}

/* The policies, indexed by enum xb_policy (xb.h). Adding one: a new xb_<name>.c defining its
 * `const struct xb_policy_ops`, a row here, a value in enum xb_policy. */
static const struct xb_policy_ops *const policies[] = {&xb_policy_lot, &xb_policy_p2c, &xb_policy_rr,
                                                      &xb_policy_random, &xb_policy_cache};
#define NPOLICIES (int)(sizeof policies / sizeof policies[0])

int xb_policy_parse(const char *s)
{
    for (int i = 0; i < NPOLICIES; i++)
        if (strcmp(s, policies[i]->name) == 0)
            return i;
    return -1;
}

const char *xb_policy_name(int policy)
{
    return policy >= 0 && policy < NPOLICIES ? policies[policy]->name : "?";
}

int xb_pick(struct xb_pool *p, uint64_t need_len, int64_t tokens, const int *exclude, int nexclude)
{
    struct xb_query q = {.need_len = need_len, .tokens = tokens, .exclude = exclude, .nexclude = nexclude};
    return xb_pick_q(p, &q);
}

int xb_pick_q(struct xb_pool *p, struct xb_query *q)
{
    uint64_t need_len = q->need_len;
    const int *exclude = q->exclude;
    int nexclude = q->nexclude;
    q->cached = 0;
    q->charged = q->tokens;
    q->by_session = 0;
    pthread_mutex_lock(&p->mu);
    p->now = mono_us();
    p->q = q;
    p->pick_cached = -1;
    uint64_t rotor = p->rotor, rng = p->rng; /* a peek leaves the tie-breaking state as it found it */
    int idx = -1;
    int last_pass = p->hard_cap ? 1 : 0;
    for (p->skip_full = 1; p->skip_full >= last_pass && idx < 0; p->skip_full--) {
        if (q->session && p->session_eps >= 0)
            idx = xb_session_pick(p, q);
        if (idx >= 0)
            q->by_session = 1;
        else
            idx = policies[p->policy >= 0 && p->policy < NPOLICIES ? p->policy : XB_POLICY_LOT]->pick(
                p, need_len, exclude, nexclude);
    }
    p->skip_full = 0;
    if (idx >= 0) {
        if (p->prefix && q->nblocks) {
            /* the cache policy computed it for the rank it chose; any other choice asks the index now */
            q->cached = p->pick_cached >= 0 ? p->pick_cached
                                            : xb_cached_tokens(p, (size_t)idx, q, -1.0);
            q->charged = q->tokens - q->cached;
            if (!q->peek)
                xb_prefix_insert(p->prefix, idx, q->blocks, q->nblocks, p->now); /* it will hold them now */
        }
        if (!q->peek) {
            p->inst[idx].inflight++;
            __atomic_fetch_add(&p->inst[idx].outstanding, q->charged, __ATOMIC_RELAXED);
            p->inst[idx].selected++;
        }
    } else {
        /* Tell "nothing healthy" from "nothing large enough" from "all full" (hard cap). */
        idx = -ENOENT;
        p->skip_full = 0;
        for (size_t i = 0; i < p->n; i++)
            if (xb_eligible(p, i, 0, exclude, nexclude))
                idx = -E2BIG;
        for (size_t i = 0; p->hard_cap && i < p->n; i++)
            if (xb_eligible(p, i, need_len, exclude, nexclude))
                idx = -EBUSY;
    }
    p->q = NULL;
    if (q->peek) { /* else the pick after a peek would always skip a rotation step (every other rank) */
        p->rotor = rotor;
        p->rng = rng;
    }
    pthread_mutex_unlock(&p->mu);
    return idx;
}

int xb_prefix_enable(struct xb_pool *p, long per_rank_blocks, size_t max_bytes, long ttl_ms, double max_imbalance)
{
    if (max_imbalance < 1.0 || ttl_ms < 0)
        return -EINVAL;
    struct xb_prefix *x = xb_prefix_new(per_rank_blocks, max_bytes, (uint64_t)ttl_ms * 1000u);
    if (!x)
        return per_rank_blocks < 1 || max_bytes < 4096 ? -EINVAL : -ENOMEM;
    pthread_mutex_lock(&p->mu);
    xb_prefix_free(p->prefix);
    p->prefix = x;
    p->max_imbalance = max_imbalance;
    pthread_mutex_unlock(&p->mu);
    return 0;
}

void xb_cache_weight(struct xb_pool *p, double weight)
{
    pthread_mutex_lock(&p->mu);
    p->uncached_milli = weight >= 1 && weight <= 1000 ? (uint64_t)(weight * 1000 + 0.5) : 1000;
    pthread_mutex_unlock(&p->mu);
}

void xb_prefix_capacity(struct xb_pool *p, int idx, long blocks)
{
    pthread_mutex_lock(&p->mu);
    if (p->prefix && idx >= 0 && (size_t)idx < p->n)
        xb_prefix_set_capacity(p->prefix, idx, blocks);
    pthread_mutex_unlock(&p->mu);
}

size_t xb_prefix_memory(struct xb_pool *p)
{
    pthread_mutex_lock(&p->mu);
    size_t n = p->prefix ? xb_prefix_bytes(p->prefix) : 0;
    pthread_mutex_unlock(&p->mu);
    return n;
}

void xb_session_enable(struct xb_pool *p, double epsilon)
{
    pthread_mutex_lock(&p->mu);
    p->session_eps = epsilon;
    p->ring_dirty = 1;
    pthread_mutex_unlock(&p->mu);
}

int xb_saturated(struct xb_pool *p)
{
    pthread_mutex_lock(&p->mu);
    p->now = mono_us();
    p->skip_full = 0;
    int usable = 0, full = 1;
    for (size_t i = 0; i < p->n; i++) {
        if (!xb_eligible(p, i, 0, NULL, 0))
            continue;
        usable = 1;
        const struct xb_inst *in = &p->inst[i];
        if (in->cfg.max_inflight <= 0 || xb_inflight_of(in) < in->cfg.max_inflight)
            full = 0;
    }
    pthread_mutex_unlock(&p->mu);
    return usable && full;
}

void xb_set_hard_cap(struct xb_pool *p, int on)
{
    pthread_mutex_lock(&p->mu);
    p->hard_cap = on;
    pthread_mutex_unlock(&p->mu);
}

void xb_adjust(struct xb_pool *p, int idx, int64_t delta)
{
    if (idx < 0 || (size_t)idx >= p->n)
        return;
    /* Called once per streamed token: an atomic add, no lock. Pickers read the field under the pool lock
     * with an atomic load, so they see either value, never a torn one. */
    __atomic_fetch_add(&p->inst[idx].outstanding, delta, __ATOMIC_RELAXED);
}

void xb_release(struct xb_pool *p, int idx, int64_t tokens)
{
    if (idx < 0 || (size_t)idx >= p->n)
        return;
    pthread_mutex_lock(&p->mu);
    p->inst[idx].inflight--;
    __atomic_fetch_sub(&p->inst[idx].outstanding, tokens, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&p->mu);
}

void xb_set_ejection(struct xb_pool *p, int after, long base_ms, long max_ms)
{
    pthread_mutex_lock(&p->mu);
    p->eject_after = after;
    p->eject_base_ms = base_ms > 0 ? base_ms : 1;
    p->eject_max_ms = max_ms > p->eject_base_ms ? max_ms : p->eject_base_ms;
    pthread_mutex_unlock(&p->mu);
}

long xb_report(struct xb_pool *p, int idx, int ok)
{
    return xb_report_from(p, idx, ok, -1, 0);
}

long xb_report_from(struct xb_pool *p, int idx, int ok, int src, uint64_t src_uses)
{
    if (idx < 0 || (size_t)idx >= p->n)
        return 0;
    long ms = 0;
    pthread_mutex_lock(&p->mu);
    struct xb_inst *in = &p->inst[idx];
    uint64_t now = mono_us();
    in->last_failed = !ok;
    /* a failure for want of the same source as the streak's last one, which no one has used since, adds nothing
     * to the streak */
    int repeat = !ok && src >= 0 && in->failures > 0 && in->fail_src == src + 1 && in->fail_src_uses == src_uses;
    in->fail_src = ok || src < 0 ? 0 : src + 1;
    in->fail_src_uses = src_uses;
    if (ok) {
        in->failures = 0;
        in->kv_lost_by = 0;
        if (in->ejected_until <= now)
            in->ejections = 0; /* back and working: the next ejection starts short again */
    } else if (!repeat && p->eject_after > 0 && ++in->failures >= p->eject_after && in->ejected_until <= now) {
        size_t ejected = 0;
        for (size_t i = 0; i < p->n; i++)
            ejected += p->inst[i].ejected_until > now;
        if (ejected + 1 <= p->n / 2) { /* never more than half of the pool */
            ms = p->eject_base_ms;
            for (uint64_t k = 0; k < in->ejections && ms < p->eject_max_ms; k++)
                ms *= 2;
            if (ms > p->eject_max_ms)
                ms = p->eject_max_ms;
            in->ejected_until = now + (uint64_t)ms * 1000u;
            in->ejections++;
            in->ejections_total++;
            in->failures = 0;
        }
    }
    pthread_mutex_unlock(&p->mu);
    return ms;
}

int xb_unejected(struct xb_pool *p, int idx)
{
    if (idx < 0 || (size_t)idx >= p->n)
        return 0;
    pthread_mutex_lock(&p->mu);
    struct xb_inst *in = &p->inst[idx];
    int was = in->ejected_until > mono_us();
    in->ejected_until = 0;
    in->ejections = 0;
    in->failures = 0;
    in->fail_src = 0;
    pthread_mutex_unlock(&p->mu);
    return was;
}

void xb_report_used(struct xb_pool *p, int idx)
{
    if (idx >= 0 && (size_t)idx < p->n)
        __atomic_fetch_add(&p->inst[idx].used, 1, __ATOMIC_RELAXED);
}

uint64_t xb_uses(struct xb_pool *p, int idx)
{
    return idx >= 0 && (size_t)idx < p->n ? __atomic_load_n(&p->inst[idx].used, __ATOMIC_RELAXED) : 0;
}

int xb_report_kv_lost(struct xb_pool *p, int idx, int by)
{
    if (idx < 0 || (size_t)idx >= p->n || by < 0)
        return 0;
    pthread_mutex_lock(&p->mu);
    struct xb_inst *in = &p->inst[idx];
    if (!in->kv_lost_by)
        in->kv_lost_by = by + 1;
    else if (in->kv_lost_by != by + 1)
        in->last_failed = 1; /* a second decode: the instance holding the KV, not a decode, is failing */
    int failing = in->last_failed;
    pthread_mutex_unlock(&p->mu);
    return failing;
}

void xb_set_feedback(struct xb_pool *p, int idx, int64_t tokens)
{
    if (idx < 0 || (size_t)idx >= p->n)
        return;
    __atomic_store_n(&p->inst[idx].feedback, tokens < 0 ? 0 : tokens, __ATOMIC_RELAXED);
}

void xb_set_remote(struct xb_pool *p, int idx, int64_t tokens, int64_t inflight)
{
    if (idx < 0 || (size_t)idx >= p->n)
        return;
    __atomic_store_n(&p->inst[idx].remote, tokens < 0 ? 0 : tokens, __ATOMIC_RELAXED);
    __atomic_store_n(&p->inst[idx].remote_inflight, inflight < 0 ? 0 : inflight, __ATOMIC_RELAXED);
}

void xb_set_healthy(struct xb_pool *p, int idx, int healthy)
{
    if (idx < 0 || (size_t)idx >= p->n)
        return;
    pthread_mutex_lock(&p->mu);
    if (p->prefix && p->inst[idx].healthy && !healthy) /* it may come back restarted, its cache empty */
        xb_prefix_drop_rank(p->prefix, idx);
    p->inst[idx].healthy = healthy;
    pthread_mutex_unlock(&p->mu);
}

void xb_set_learned_max_model_len(struct xb_pool *p, int idx, long mml)
{
    if (idx < 0 || (size_t)idx >= p->n)
        return;
    pthread_mutex_lock(&p->mu);
    p->inst[idx].learned_mml = mml > 0 ? mml : 0;
    pthread_mutex_unlock(&p->mu);
}

void xb_set_ready(struct xb_pool *p, int idx, int ready)
{
    if (idx < 0 || (size_t)idx >= p->n)
        return;
    pthread_mutex_lock(&p->mu);
    p->inst[idx].unready = !ready;
    pthread_mutex_unlock(&p->mu);
}

int xb_stats(struct xb_pool *p, int idx, struct xb_instance_stats *out)
{
    if (idx < 0 || (size_t)idx >= p->n)
        return -EINVAL;
    pthread_mutex_lock(&p->mu);
    const struct xb_inst *in = &p->inst[idx];
    out->tp = in->cfg.tp;
    out->weight = in->cfg.weight;
    out->max_model_len = in->cfg.max_model_len;
    out->learned_max_model_len = in->learned_mml;
    out->max_inflight = in->cfg.max_inflight;
    out->healthy = in->healthy;
    out->inflight = in->inflight;
    out->outstanding = __atomic_load_n(&in->outstanding, __ATOMIC_RELAXED);
    out->selected = in->selected;
    out->feedback = __atomic_load_n(&in->feedback, __ATOMIC_RELAXED);
    out->remote = __atomic_load_n(&in->remote, __ATOMIC_RELAXED);
    out->remote_inflight = __atomic_load_n(&in->remote_inflight, __ATOMIC_RELAXED);
    out->ejected = in->ejected_until > mono_us();
    out->ejections = in->ejections_total;
    out->removed = in->removed;
    out->failing = in->last_failed;
    out->ready = !in->unready;
    out->prefix_blocks = p->prefix ? (int64_t)xb_prefix_blocks(p->prefix, idx) : 0;
    out->prefix_capacity = p->prefix ? xb_prefix_capacity_of(p->prefix, idx) : 0;
    pthread_mutex_unlock(&p->mu);
    return 0;
}

void xb_totals(struct xb_pool *p, int64_t *inflight, int64_t *outstanding)
{
    int64_t a = 0, b = 0;
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < p->n; i++) {
        a += p->inst[i].inflight;
        b += __atomic_load_n(&p->inst[i].outstanding, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&p->mu);
    *inflight = a;
    *outstanding = b;
}
