/* SPDX-License-Identifier: Apache-2.0 */
/* xb_load.c - the arithmetic every policy shares: which instances may take a request, which of two is less
 * loaded per unit of capacity, and the pool's seeded random numbers. A leaf: policies call it, it calls
 * nobody. */
#include "xb_internal.h"

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

uint64_t xb_rand(struct xb_pool *p)
{
    p->rng = mix(p->rng);
    return p->rng;
}

int64_t xb_load_of(const struct xb_inst *in)
{
    int64_t l = __atomic_load_n(&in->outstanding, __ATOMIC_RELAXED) + __atomic_load_n(&in->feedback, __ATOMIC_RELAXED) +
                __atomic_load_n(&in->remote, __ATOMIC_RELAXED);
    return l > 0 ? l : 0;
}

int64_t xb_inflight_of(const struct xb_inst *in)
{
    return in->inflight + __atomic_load_n(&in->remote_inflight, __ATOMIC_RELAXED);
}

long xb_mml(const struct xb_inst *in)
{
    return in->cfg.max_model_len > 0 ? in->cfg.max_model_len : in->learned_mml;
}

int xb_eligible(const struct xb_pool *p, size_t i, uint64_t need_len, const int *exclude, int nexclude)
{
    const struct xb_inst *in = &p->inst[i];
    if (in->removed || in->unready || !in->healthy || in->ejected_until > p->now)
        return 0;
    if (p->skip_full && in->cfg.max_inflight > 0 && xb_inflight_of(in) >= in->cfg.max_inflight)
        return 0;
    for (int k = 0; k < nexclude; k++)
        if (exclude[k] == (int)i)
            return 0;
    long mml = p->q && p->q->estimated ? in->cfg.max_model_len : xb_mml(in);
    return mml <= 0 || need_len <= (uint64_t)mml;
}

int xb_less_loaded(const struct xb_inst *a, const struct xb_inst *b)
{
    /* load_a / cap_a < load_b / cap_b  <=>  load_a * cap_b < load_b * cap_a (all non-negative, fits 64 bits
     * for loads below 2^40 tokens and capacities below 2^23). Ties fall back to fewer in-flight requests. */
    uint64_t ca = (uint64_t)a->cfg.weight * (uint64_t)a->cfg.tp, cb = (uint64_t)b->cfg.weight * (uint64_t)b->cfg.tp;
    uint64_t la = (uint64_t)xb_load_of(a), lb = (uint64_t)xb_load_of(b);
    if (la * cb != lb * ca)
        return la * cb < lb * ca;
    return (uint64_t)xb_inflight_of(a) * cb < (uint64_t)xb_inflight_of(b) * ca;
}

int xb_pick_random_eligible(struct xb_pool *p, uint64_t need_len, const int *exclude, int nexclude)
{
    size_t count = 0;
    for (size_t i = 0; i < p->n; i++)
        count += (size_t)xb_eligible(p, i, need_len, exclude, nexclude);
    if (count == 0)
        return -1;
    size_t want = (size_t)(xb_rand(p) % count);
    for (size_t i = 0; i < p->n; i++)
        if (xb_eligible(p, i, need_len, exclude, nexclude) && want-- == 0)
            return (int)i;
    return -1;
}
