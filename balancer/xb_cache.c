/* SPDX-License-Identifier: Apache-2.0 */
/* xb_cache.c - policy `cache`: least outstanding tokens where the request's own cost on a rank is only the
 * tokens that rank would compute, its prompt minus the prefix the rank holds (what its KV events report when
 * the query has them for it, else the pool's prefix index's guess, xb_prefix.h), under a load guard. Without
 * either, or without blocks, it is exactly `lot`. */
#include "xb_internal.h"

static uint64_t capacity(const struct xb_inst *in)
{
    return (uint64_t)in->cfg.weight * (uint64_t)in->cfg.tp;
}


double xb_mean_load(struct xb_pool *p, uint64_t need_len, const int *exclude, int nexclude)
{
    double sum = 0;
    size_t n = 0;
    for (size_t i = 0; i < p->n; i++) {
        if (!xb_eligible(p, i, need_len, exclude, nexclude))
            continue;
        sum += (double)xb_load_of(&p->inst[i]) / (double)capacity(&p->inst[i]);
        n++;
    }
    return n ? sum / (double)n : 0;
}

int64_t xb_cached_tokens(struct xb_pool *p, size_t i, const struct xb_query *q, double mean)
{
    int precise = q->precise && q->precise[i] >= 0;
    if ((!p->prefix && !precise) || !q->nblocks || q->block_tokens <= 0)
        return 0;
    const struct xb_inst *in = &p->inst[i];
    if (mean >= 0) { /* the load guard (mean < 0: asked after the choice, no guard) */
        double own = (double)xb_load_of(in) / (double)capacity(in);
        double floor = (double)q->tokens / (double)capacity(in); /* a nearly idle pool: the request's own size */
        if (own > p->max_imbalance * (mean > floor ? mean : floor))
            return 0;
        if (in->cfg.max_inflight > 0 && xb_inflight_of(in) >= in->cfg.max_inflight)
            return 0;
    }
    size_t held = precise ? (size_t)q->precise[i] : xb_prefix_match(p->prefix, (int)i, q->blocks, q->nblocks, p->now);
    if (precise && p->prefix && q->pending_since && q->pending_since[i]) {
        /* blocks sent to it that its events have not caught up with (a prompt still queued or computing there):
         * held soon (rt_kv_query gives none where another rank reports more: it evicted some, or never had them) */
        size_t sent = xb_prefix_match_since(p->prefix, (int)i, q->blocks, q->nblocks, p->now, q->pending_since[i]);
        if (q->pending_unit && q->pending_unit[i] > 1) /* the engine will hold whole blocks of its own */
            sent -= sent % q->pending_unit[i];
        held = sent > held ? sent : held;
    }
    int64_t c = (int64_t)(held < q->nblocks ? held : q->nblocks) * q->block_tokens;
    return c < q->tokens ? c : q->tokens;
}

static int pick_cache(struct xb_pool *p, uint64_t need_len, const int *exclude, int nexclude)
{
    const struct xb_query *q = p->q;
    int64_t tokens = q ? q->tokens : 0;
    double mean = q && p->prefix && q->nblocks ? xb_mean_load(p, need_len, exclude, nexclude) : 0;
    int best = -1;
    int64_t best_cached = 0;
    uint64_t best_cost = 0, best_cap = 1;
    size_t start = p->n ? (size_t)(p->rotor++ % p->n) : 0;
    for (size_t k = 0; k < p->n; k++) {
        size_t i = (start + k) % p->n;
        if (!xb_eligible(p, i, need_len, exclude, nexclude))
            continue;
        const struct xb_inst *in = &p->inst[i];
        int64_t cached = q ? xb_cached_tokens(p, i, q, mean) : 0;
        /* cost_i / cap_i < best_cost / best_cap, by cross-multiplication as in xb_less_loaded; the cost in
         * thousandths of a token (the uncached part weighted, xb_cache_weight); fits 64 bits for loads below
         * 2^40 tokens and capacities below 2^13 */
        uint64_t cost = (uint64_t)xb_load_of(in) * 1000u + p->uncached_milli * (uint64_t)(tokens - cached),
                 cap = capacity(in);
        int better = best < 0 || cost * best_cap < best_cost * cap ||
                     (cost * best_cap == best_cost * cap &&
                      (uint64_t)in->inflight * best_cap < (uint64_t)p->inst[best].inflight * cap);
        if (better) {
            best = (int)i;
            best_cost = cost;
            best_cap = cap;
            best_cached = cached;
        }
    }
    if (best >= 0 && q && p->prefix && q->nblocks)
        p->pick_cached = best_cached;
    return best;
}

const struct xb_policy_ops xb_policy_cache = {"cache", pick_cache};
