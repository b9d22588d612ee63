/* SPDX-License-Identifier: Apache-2.0 */
/* xb_session.c - session affinity by consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam,
 * "Consistent Hashing with Bounded Loads", 2018): every rank has RING_POINTS points on a 64-bit ring, placed
 * by hashing its stable key; a session goes to the first rank clockwise from its own hash whose load, once it
 * takes the request, stays within (1 + eps) × the pool's mean. Removing a rank moves only its sessions; no
 * state is shared, so router replicas with the same membership agree. In tokens: a rank may take the request
 * while its load before it is within (1 + eps) × the mean load per capacity counting the request (the paper's
 * "a bin below its capacity accepts one more ball"), so an idle pool always accepts. */
#include "xb_internal.h"

#include <stdlib.h>
#include <xxhash.h>

#define RING_POINTS 64

static int by_hash(const void *a, const void *b)
{
    const struct xb_ring_point *x = a, *y = b;
    return x->h < y->h ? -1 : x->h > y->h ? 1 : x->idx - y->idx;
}

static void rebuild(struct xb_pool *p)
{
    size_t live = 0;
    for (size_t i = 0; i < p->n; i++)
        live += !p->inst[i].removed;
    struct xb_ring_point *r = realloc(p->ring, (live ? live : 1) * RING_POINTS * sizeof *r);
    if (!r)
        return; /* keep the old ring; retried at the next pick */
    size_t n = 0;
    for (size_t i = 0; i < p->n; i++) {
        if (p->inst[i].removed)
            continue;
        uint64_t key = p->inst[i].cfg.key ? p->inst[i].cfg.key : (uint64_t)i + 1;
        for (uint64_t v = 0; v < RING_POINTS; v++) {
            uint64_t in[2] = {key, v};
            r[n++] = (struct xb_ring_point){XXH3_64bits(in, sizeof in), (int)i};
        }
    }
    qsort(r, n, sizeof *r, by_hash);
    p->ring = r;
    p->nring = n;
    p->ring_dirty = 0;
}

int xb_session_pick(struct xb_pool *p, const struct xb_query *q)
{
    if (p->ring_dirty)
        rebuild(p);
    if (!p->nring)
        return -1;
    /* the bound: load_i / cap_i <= (1 + eps) × (total load + tokens) / total capacity */
    double total = (double)q->tokens, cap = 0;
    for (size_t i = 0; i < p->n; i++) {
        if (!xb_eligible(p, i, q->need_len, q->exclude, q->nexclude))
            continue;
        total += (double)xb_load_of(&p->inst[i]);
        cap += (double)p->inst[i].cfg.weight * p->inst[i].cfg.tp;
    }
    if (cap <= 0)
        return -1;
    double bound = (1.0 + p->session_eps) * total / cap;
    size_t lo = 0, hi = p->nring; /* first point >= session */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (p->ring[mid].h < q->session)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (size_t k = 0; k < p->nring; k++) {
        int i = p->ring[(lo + k) % p->nring].idx;
        if (!xb_eligible(p, (size_t)i, q->need_len, q->exclude, q->nexclude))
            continue;
        const struct xb_inst *in = &p->inst[i];
        double before = (double)xb_load_of(in) / ((double)in->cfg.weight * in->cfg.tp);
        if (before <= bound)
            return i;
    }
    return -1;
}
