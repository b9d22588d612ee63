/* SPDX-License-Identifier: Apache-2.0 */
/* kv_query.c - placement's side of the KV events (kv_sub.h): what each rank reports holding of a prompt, from the
 * event loops' threads (per-thread memory, the index's read lock), and what the router sent a rank that its events
 * cannot tell yet (requests in flight there, by the period they were sent in: --kv-events-pending-ms). */
#include "kv_sub.h"

#include "kv_events.h"
#include "kv_index.h"
#include "kv_sub_internal.h"
#include "prompt.h"
#include "router.h"
#include "xb.h"
#include "xpyd_util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define K kv_K

static pthread_key_t scratch_key; /* rt_kv_query's per-thread memory */
static pthread_key_t mix_key;     /* and its request's blocks in an adapter's key space */

int kv_query_init(void)
{
    return pthread_key_create(&scratch_key, free) || pthread_key_create(&mix_key, free) ? -1 : 0;
}

/* Per thread: the query's per-slot blocks, the index's answer and its ranks' block units (one allocation, freed
 * when the thread ends) */

static void *scratch(void)
{
    int64_t *p = pthread_getspecific(scratch_key);
    if (p || !(p = malloc(K.cap * (4 * sizeof(int64_t) + sizeof(uint32_t) + sizeof(uint16_t)))))
        return p;
    for (size_t i = 0; i < 2 * K.cap; i++) /* each pool's answer; a slot no rank has taken yet reads "not known" */
        p[i] = -1;
    memset(p + 2 * K.cap, 0, 2 * K.cap * sizeof(int64_t)); /* and nothing pending */
    if (pthread_setspecific(scratch_key, p)) {
        free(p);
        p = NULL;
    }
    return p;
}

/* Requests in flight on a rank, counted by the period they were sent in: PEND_SLOTS periods make up
 * --kv-events-pending-ms (a request in flight longer is forgotten as its slot is reused) */
static uint64_t period_us(void)
{
    uint64_t w = (uint64_t)g_rt->cfg.kv_events_pending_ms * 1000u / PEND_SLOTS;
    return w > 1000 ? w : 1000; /* a period of 1 ms at least: its number << 24 fits 64 bits for 35 years of uptime */
}

static uint64_t period(uint64_t now)
{
    return now / period_us() + 1; /* 0: none */
}

/* When the oldest request the rank is still computing (as far as the router knows) was sent, to the period; 0
 * when none: blocks sent to it since then are pending there, its events not yet told */
static uint64_t pending_from(const struct kv_src *s, uint64_t now)
{
    uint64_t cur = period(now), oldest = 0;
    if (!g_rt->cfg.kv_events_pending_ms)
        return 0;
    for (int k = 0; k < PEND_SLOTS; k++) {
        uint64_t v = atomic_load(&s->pend[k]), e = v >> 24;
        if ((v & 0xffffff) && e <= cur && e + PEND_SLOTS > cur && (!oldest || e < oldest))
            oldest = e;
    }
    return oldest ? (oldest - 1) * period_us() : 0;
}

/* blocks in key space `space` (kv_index.h: a block's key XOR its space), in this thread's memory; NULL: none */
static const uint64_t *in_space(const uint64_t *blocks, size_t n, uint64_t space)
{
    struct mixbuf {
        size_t cap;
        uint64_t v[];
    } *m = pthread_getspecific(mix_key);
    if (!m || m->cap < n) {
        free(m);
        pthread_setspecific(mix_key, NULL);
        if (!(m = malloc(sizeof *m + n * sizeof(uint64_t))))
            return NULL;
        m->cap = n;
        if (pthread_setspecific(mix_key, m)) {
            free(m);
            return NULL;
        }
    }
    for (size_t i = 0; i < n; i++)
        m->v[i] = blocks[i] ^ space;
    return m->v;
}

int rt_kv_source_trusted(const struct kv_src *s, uint64_t now)
{
    uint64_t sent = atomic_load(&s->first_sent), stale = (uint64_t)g_rt->cfg.kv_events_stale_ms * 1000u;
    return atomic_load(&s->up) && !(sent && now - sent > stale) && !atomic_load(&s->unlike_bs);
}

void rt_kv_adapter_listed(void *unused, const char *name, size_t n)
{
    for (int role = 0; role < 2; role++) /* (past --kv-index-max-adapters: not remembered, as for an event) */
        if (K.idx[role])
            kvi_add_adapter(K.idx[role], name, n);
}

void rt_kv_query(struct xb_query *q, int role, const uint64_t *blocks, size_t n, const char *model)
{
    q->blocks = blocks;
    q->nblocks = n;
    q->block_tokens = g_rt->cfg.prefix_block_tokens;
    q->precise = NULL;
    int64_t *base = K.on[role] && n && atomic_load(&K.subscribed[role]) ? scratch() : NULL;
    if (!base)
        return;
    int64_t *out = base + (size_t)role * K.cap;
    uint64_t *since = (uint64_t *)(base + (2 + (size_t)role) * K.cap);
    uint32_t *held = (uint32_t *)(base + 4 * K.cap);
    uint16_t *unit = (uint16_t *)(held + K.cap);
    uint64_t space = kvi_space_for(K.idx[role], model);
    if (space) { /* an adapter's request: its blocks in its key space for the router's own index too (the blocks
                  * sent under an adapter are not the base model's, nor what is pending there) */
        if (!(blocks = in_space(blocks, n, space)))
            return;
        q->blocks = blocks;
    }
    kvi_match_units(K.idx[role], blocks, n, 0, held, unit);
    uint64_t now = xpyd_now_us();
    int trusted = 0;
    int64_t most = 0; /* the most leading blocks any trusted rank reports */
    size_t n_ranks = __atomic_load_n(&g_rt->reg.n_ranks[role], __ATOMIC_ACQUIRE); /* it only grows: the slots above
                                                                                    * it still read -1 */
    for (size_t i = 0; i < n_ranks && i < K.cap; i++) {
        int ok = rt_kv_source_trusted(&K.src[role][i], now);
        out[i] = ok ? (int64_t)held[i] : -1;
        trusted += ok;
        if (ok && out[i] > most)
            most = out[i];
    }
    for (size_t i = 0; i < n_ranks && i < K.cap; i++) { /* pending counts only where no rank reports more */
        const struct kv_src *s = &K.src[role][i];
        uint64_t from = out[i] >= 0 && out[i] >= most ? pending_from(s, now) : 0;
        uint64_t dropped = from ? atomic_load(&s->dropped_at) : 0;
        since[i] = from && dropped >= from ? dropped + 1 : from;
    }
    if (trusted) {
        q->precise = out;
        q->pending_since = since;
        q->pending_unit = unit;
    }
}

int rt_kv_extras(const struct rw_src *body, uint64_t extra[2])
{
    char *salt = rw_string_member(body, "cache_salt");
    size_t n = salt ? strlen(salt) : 0;
    const char *s = salt;
    extra[0] = n ? kve_extra_hash(&s, &n, 1) : 0; /* vLLM: [cache_salt] on the first block, if not empty */
    extra[1] = 0;
    free(salt);
    return extra[0] != 0;
}

uint64_t rt_kv_picked(int role, int idx, const struct xb_query *q)
{
    if (!K.on[role] || !q->nblocks || idx < 0 || (size_t)idx >= K.cap)
        return 0;
    uint64_t e = 0;
    if (!q->peek) {
        struct kv_src *s = &K.src[role][idx];
        uint64_t now = xpyd_now_us(), none = 0, v;
        atomic_compare_exchange_strong(&s->first_sent, &none, now);
        if (g_rt->cfg.kv_events_pending_ms) {
            e = period(now);
            _Atomic uint_fast64_t *slot = &s->pend[e % PEND_SLOTS];
            do
                v = atomic_load(slot);
            while (!atomic_compare_exchange_weak(slot, &v, v >> 24 == e ? v + 1 : e << 24 | 1));
        }
    }
    /* counted last: a placement xpyd_kv_placements_total shows is pending on its rank already */
    atomic_fetch_add(&K.picks[role][q->precise && q->precise[idx] >= 0], 1);
    return e;
}

void rt_kv_released(int role, int idx, uint64_t e)
{
    if (!e || !K.on[role] || idx < 0 || (size_t)idx >= K.cap)
        return;
    _Atomic uint_fast64_t *slot = &K.src[role][idx].pend[e % PEND_SLOTS];
    uint64_t v = atomic_load(slot);
    while (v >> 24 == e && (v & 0xffffff) && !atomic_compare_exchange_weak(slot, &v, v - 1))
        ; /* a period gone round the ring: forgotten already */
}
