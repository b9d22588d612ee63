/* SPDX-License-Identifier: Apache-2.0 */
/* xb_prefix.c - the prefix index (xb_prefix.h): one open-addressing hash table of (rank, block hash)
 * entries, each entry also on its rank's LRU list. Entries live in one array with a free list; the array and
 * the table grow by doubling up to the byte bound, after which inserting evicts. */
#include "xb_prefix.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#define NIL UINT32_MAX
#define CHAIN_SEED 0x78707964u /* "xpyd": the seed of a chain's first block */

struct ent {
    uint64_t h;       /* block hash */
    uint64_t t_us;    /* last use */
    uint32_t rank;
    uint32_t prev, next; /* rank's LRU list (prev: more recent); next is the free list for free entries */
};

struct rank_lru {
    uint32_t head, tail; /* head: most recent */
    size_t n;
    long cap;            /* <= 0: the index default */
};

struct xb_prefix {
    long per_rank;
    size_t max_entries;
    uint64_t ttl_us;
    struct ent *e;
    size_t ne, ecap;     /* entries in use, array size */
    uint32_t free_head;
    uint32_t *slot;      /* table: entry index + 1, 0 = empty */
    size_t nslot;        /* power of two, >= 2 * ecap */
    struct rank_lru *ranks;
    size_t nranks;
    uint64_t seed;       /* random: where a block lands cannot be aimed (see key_of) */
};

size_t xb_hash_tokens(const int64_t *ids, size_t n, size_t block_tokens, uint64_t *out, size_t cap)
{
    if (block_tokens == 0)
        return 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    /* the array already is little-endian 64-bit values: the same chain as its bytes, 8 per token */
    return xb_hash_bytes(ids, n * sizeof *ids, block_tokens * sizeof *ids, out, cap);
#else
    size_t nb = 0;
    uint64_t prev = CHAIN_SEED;
    uint64_t buf[64];
    for (size_t b = 0; b + block_tokens <= n && nb < cap; b += block_tokens) {
        XXH3_state_t st;
        XXH3_64bits_reset_withSeed(&st, prev);
        for (size_t k = 0; k < block_tokens; k += 64) { /* ids as little-endian 64-bit values */
            size_t m = block_tokens - k < 64 ? block_tokens - k : 64;
            for (size_t j = 0; j < m; j++) {
                uint64_t v = (uint64_t)ids[b + k + j];
                unsigned char *o = (unsigned char *)&buf[j];
                for (int s = 0; s < 8; s++)
                    o[s] = (unsigned char)(v >> (8 * s));
            }
            XXH3_64bits_update(&st, buf, m * sizeof buf[0]);
        }
        prev = XXH3_64bits_digest(&st);
        out[nb++] = prev;
    }
    return nb;
#endif
}

uint64_t xb_chain_seed(void)
{
    return CHAIN_SEED;
}

/* m ids as little-endian 64-bit values, as a token-id prompt is hashed */
static void ids_le64(const uint32_t *ids, size_t m, unsigned char *buf)
{
    for (size_t j = 0; j < m; j++)
        for (int s = 0; s < 8; s++)
            buf[8 * j + (size_t)s] = (unsigned char)((uint64_t)ids[j] >> (8 * s));
}

uint64_t xb_hash_block_ids(uint64_t prev, const uint32_t *ids, size_t n)
{
    unsigned char buf[64 * 8];
    if (n <= 64) { /* a block of the usual sizes: one call (the same hash as the streaming below) */
        ids_le64(ids, n, buf);
        return XXH3_64bits_withSeed(buf, n * 8, prev);
    }
    XXH3_state_t st;
    XXH3_64bits_reset_withSeed(&st, prev);
    for (size_t k = 0; k < n; k += 64) {
        size_t m = n - k < 64 ? n - k : 64;
        ids_le64(ids + k, m, buf);
        XXH3_64bits_update(&st, buf, m * 8);
    }
    return XXH3_64bits_digest(&st);
}

size_t xb_hash_bytes(const void *data, size_t len, size_t block_bytes, uint64_t *out, size_t cap)
{
    if (block_bytes == 0)
        return 0;
    size_t nb = 0;
    uint64_t prev = CHAIN_SEED;
    for (size_t b = 0; b + block_bytes <= len && nb < cap; b += block_bytes) {
        prev = XXH3_64bits_withSeed((const char *)data + b, block_bytes, prev);
        out[nb++] = prev;
    }
    return nb;
}

/* A prompt's blocks hashed as it is read: the current block's bytes gathered, then hashed at once with the chain
 * so far as its seed (XXH3_64bits_withSeed: what the streaming API gives for the same bytes, at one call a block
 * instead of one per id, about a tenth of the router's time on prompts of ids) */
struct xb_hasher {
    unsigned char *buf;  /* the current block */
    size_t block, fill;  /* block size, bytes of the current block so far */
    uint64_t prev;
    uint64_t extra[2]; /* xb_hasher_extra: the first block's, the others' (0: none) */
    uint64_t *out;
    size_t n, cap;
};

static void *hasher_alloc(void *p, size_t n)
{
    void *q = realloc(p, n);
    if (!q)
        abort(); /* the library's one allocation failure policy for an executable's prompt reading */
    return q;
}

struct xb_hasher *xb_hasher_new(size_t block_bytes)
{
    struct xb_hasher *h = hasher_alloc(NULL, sizeof *h);
    memset(h, 0, sizeof *h);
    h->block = block_bytes ? block_bytes : 1;
    h->prev = CHAIN_SEED;
    h->buf = hasher_alloc(NULL, h->block);
    return h;
}

static void block_done(struct xb_hasher *h)
{
    h->prev = xb_chain_extra(XXH3_64bits_withSeed(h->buf, h->block, h->prev), h->extra[h->n > 0]);
    if (h->n == h->cap) {
        h->cap = h->cap ? 2 * h->cap : 64;
        h->out = hasher_alloc(h->out, h->cap * sizeof *h->out);
    }
    h->out[h->n++] = h->prev;
    h->fill = 0;
}

void xb_hasher_feed(struct xb_hasher *h, const void *data, size_t len)
{
    const char *p = data;
    while (len) {
        size_t k = h->block - h->fill < len ? h->block - h->fill : len;
        memcpy(h->buf + h->fill, p, k);
        h->fill += k;
        p += k;
        len -= k;
        if (h->fill == h->block)
            block_done(h);
    }
}

void xb_hasher_feed_id(struct xb_hasher *h, int64_t id)
{
    unsigned char b[8];
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(b, &id, sizeof b); /* already little-endian */
#else
    for (int s = 0; s < 8; s++)
        b[s] = (unsigned char)((uint64_t)id >> (8 * s));
#endif
    if (h->block - h->fill >= sizeof b) { /* the common case: the id lies within the block */
        memcpy(h->buf + h->fill, b, sizeof b);
        if ((h->fill += sizeof b) == h->block)
            block_done(h);
        return;
    }
    xb_hasher_feed(h, b, sizeof b);
}

uint64_t xb_chain_extra(uint64_t chain, uint64_t extra)
{
    return extra ? XXH3_64bits_withSeed(&extra, sizeof extra, chain) : chain;
}

void xb_hasher_extra(struct xb_hasher *h, const uint64_t extra[2])
{
    h->extra[0] = extra ? extra[0] : 0;
    h->extra[1] = extra ? extra[1] : 0;
}

size_t xb_hasher_finish(struct xb_hasher *h, uint64_t **out)
{
    size_t n = h->n;
    *out = h->out;
    free(h->buf);
    free(h);
    return n;
}

size_t xb_prefix_longest_run(const struct xb_prefix *x)
{
    size_t best = 0, run = 0;
    for (size_t i = 0; i < 2 * x->nslot && run < x->nslot; i++) { /* twice round: a run can wrap */
        run = x->slot[i & (x->nslot - 1)] ? run + 1 : 0;
        best = run > best ? run : best;
    }
    return best;
}

size_t xb_prefix_entry_bytes(void)
{
    /* the entry, and its share of the table: a power of two at least twice the entries, so at most 4 slots */
    return sizeof(struct ent) + 4 * sizeof(uint32_t);
}

struct xb_prefix *xb_prefix_new(long per_rank_blocks, size_t max_bytes, uint64_t ttl_us)
{
    if (per_rank_blocks < 1 || max_bytes < 4096)
        return NULL;
    struct xb_prefix *x = calloc(1, sizeof *x);
    if (!x)
        return NULL;
    x->per_rank = per_rank_blocks;
    x->max_entries = max_bytes / xb_prefix_entry_bytes();
    x->ttl_us = ttl_us;
    x->free_head = NIL;
    x->seed = (uint64_t)arc4random() << 32 | arc4random();
    return x;
}

void xb_prefix_free(struct xb_prefix *x)
{
    if (!x)
        return;
    free(x->e);
    free(x->slot);
    free(x->ranks);
    free(x);
}

static uint64_t key_of(const struct xb_prefix *x, uint64_t h, uint32_t rank)
{
    /* seeded (xb_slot_mix); the rank moves a block to an unrelated slot (rank 0 included) */
    return xb_slot_mix(h ^ x->seed ^ (((uint64_t)rank + 1) * 0x9e3779b97f4a7c15ULL));
}

static size_t find_slot(const struct xb_prefix *x, uint64_t h, uint32_t rank)
{
    size_t mask = x->nslot - 1;
    for (size_t s = key_of(x, h, rank) & mask;; s = (s + 1) & mask) {
        uint32_t v = x->slot[s];
        if (v == 0 || (x->e[v - 1].h == h && x->e[v - 1].rank == rank))
            return s;
    }
}

static uint32_t lookup(const struct xb_prefix *x, uint64_t h, uint32_t rank)
{
    if (!x->nslot)
        return NIL;
    uint32_t v = x->slot[find_slot(x, h, rank)];
    return v ? v - 1 : NIL;
}

/* Removes slot s by shifting the rest of its probe run back (no tombstones: lookups stay short). */
static void slot_delete(struct xb_prefix *x, size_t s)
{
    size_t mask = x->nslot - 1;
    size_t i = s;
    for (size_t j = (s + 1) & mask; x->slot[j]; j = (j + 1) & mask) {
        const struct ent *e = &x->e[x->slot[j] - 1];
        size_t home = key_of(x, e->h, e->rank) & mask;
        /* j's entry may move to i when its home is not in the cyclic interval (i, j] */
        int between = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!between) {
            x->slot[i] = x->slot[j];
            i = j;
        }
    }
    x->slot[i] = 0;
}

static int rehash(struct xb_prefix *x, size_t nslot)
{
    uint32_t *ns = calloc(nslot, sizeof *ns);
    if (!ns)
        return -ENOMEM;
    free(x->slot);
    x->slot = ns;
    x->nslot = nslot;
    for (uint32_t i = 0; i < x->ecap; i++)
        if (x->e[i].rank != NIL)
            x->slot[find_slot(x, x->e[i].h, x->e[i].rank)] = i + 1;
    return 0;
}

static struct rank_lru *rank_of(struct xb_prefix *x, int rank)
{
    if (rank < 0)
        return NULL;
    if ((size_t)rank >= x->nranks) {
        size_t n = (size_t)rank + 1 > x->nranks * 2 ? (size_t)rank + 1 : x->nranks * 2;
        struct rank_lru *r = realloc(x->ranks, n * sizeof *r);
        if (!r)
            return NULL;
        for (size_t i = x->nranks; i < n; i++)
            r[i] = (struct rank_lru){NIL, NIL, 0, 0};
        x->ranks = r;
        x->nranks = n;
    }
    return &x->ranks[rank];
}

static void lru_unlink(struct xb_prefix *x, struct rank_lru *r, uint32_t i)
{
    struct ent *e = &x->e[i];
    if (e->prev != NIL)
        x->e[e->prev].next = e->next;
    else
        r->head = e->next;
    if (e->next != NIL)
        x->e[e->next].prev = e->prev;
    else
        r->tail = e->prev;
    r->n--;
}

static void lru_push_front(struct xb_prefix *x, struct rank_lru *r, uint32_t i)
{
    struct ent *e = &x->e[i];
    e->prev = NIL;
    e->next = r->head;
    if (r->head != NIL)
        x->e[r->head].prev = i;
    r->head = i;
    if (r->tail == NIL)
        r->tail = i;
    r->n++;
}

static void evict(struct xb_prefix *x, uint32_t i)
{
    struct ent *e = &x->e[i];
    lru_unlink(x, &x->ranks[e->rank], i);
    slot_delete(x, find_slot(x, e->h, e->rank));
    e->rank = NIL;
    e->next = x->free_head;
    x->free_head = i;
    x->ne--;
}

/* A free entry, growing the arrays while under the byte bound; NIL when full or out of memory. */
static uint32_t take_entry(struct xb_prefix *x)
{
    if (x->free_head == NIL && x->ecap < x->max_entries) {
        size_t nc = x->ecap ? x->ecap * 2 : 1024;
        if (nc > x->max_entries)
            nc = x->max_entries;
        struct ent *ne = realloc(x->e, nc * sizeof *ne);
        if (!ne)
            return NIL;
        x->e = ne;
        for (size_t i = nc; i-- > x->ecap;) {
            ne[i].rank = NIL;
            ne[i].next = x->free_head;
            x->free_head = (uint32_t)i;
        }
        x->ecap = nc;
        size_t want = 16;
        while (want < 2 * nc)
            want *= 2;
        if (want > x->nslot && rehash(x, want) != 0)
            return NIL;
    }
    uint32_t i = x->free_head;
    if (i != NIL) {
        x->free_head = x->e[i].next;
        x->ne++;
    }
    return i;
}

/* The rank whose LRU end goes when the whole index is full: the one holding the most blocks. */
static int fullest_rank(const struct xb_prefix *x)
{
    int best = -1;
    for (size_t r = 0; r < x->nranks; r++)
        if (x->ranks[r].n && (best < 0 || x->ranks[r].n > x->ranks[best].n))
            best = (int)r;
    return best;
}

void xb_prefix_set_capacity(struct xb_prefix *x, int rank, long blocks)
{
    struct rank_lru *r = rank_of(x, rank);
    if (!r)
        return;
    r->cap = blocks;
    long cap = r->cap > 0 ? r->cap : x->per_rank;
    while (r->n > (size_t)cap)
        evict(x, r->tail);
}

static int fresh(const struct xb_prefix *x, uint32_t i, uint64_t now_us)
{
    return i != NIL && (!x->ttl_us || now_us < x->e[i].t_us || now_us - x->e[i].t_us <= x->ttl_us);
}

static int held_since(const struct xb_prefix *x, uint32_t i, uint64_t now_us, uint64_t since_us)
{
    return fresh(x, i, now_us) && x->e[i].t_us >= since_us;
}

size_t xb_prefix_match_since(const struct xb_prefix *x, int rank, const uint64_t *h, size_t n, uint64_t now_us,
                             uint64_t since_us)
{
    if (rank < 0 || (size_t)rank >= x->nranks || !x->ranks[rank].n || !n)
        return 0;
    uint32_t rk = (uint32_t)rank;
#define HELD(k) held_since(x, lookup(x, h[k], rk), now_us, since_us)
    if (!HELD(0))
        return 0;
    /* invariant: blocks [0, lo) held, block hi not (hi == n: past the end) */
    size_t lo = 1, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (HELD(mid))
            lo = mid + 1;
        else
            hi = mid;
    }
#undef HELD
    return lo;
}

size_t xb_prefix_match(const struct xb_prefix *x, int rank, const uint64_t *h, size_t n, uint64_t now_us)
{
    return xb_prefix_match_since(x, rank, h, n, now_us, 0);
}

int xb_prefix_insert(struct xb_prefix *x, int rank, const uint64_t *h, size_t n, uint64_t now_us)
{
    struct rank_lru *r = rank_of(x, rank);
    if (!r)
        return -ENOMEM;
    long cap = r->cap > 0 ? r->cap : x->per_rank;
    if (n > (size_t)cap)
        n = (size_t)cap; /* a chain longer than the rank's cache: its first blocks are what is kept */
    uint32_t rk = (uint32_t)rank;
    for (size_t k = n; k-- > 0;) { /* last block first: the chain's first block ends up most recent */
        uint32_t i = lookup(x, h[k], rk);
        if (i != NIL) {
            lru_unlink(x, r, i);
        } else {
            while (r->n >= (size_t)cap)
                evict(x, r->tail);
            i = take_entry(x);
            if (i == NIL) { /* the whole index is at its byte bound: the fullest rank gives a block */
                int victim = fullest_rank(x);
                if (victim < 0)
                    return -ENOMEM;
                evict(x, x->ranks[victim].tail);
                i = take_entry(x);
                if (i == NIL)
                    return -ENOMEM;
            }
            x->e[i].h = h[k];
            x->e[i].rank = rk;
            x->slot[find_slot(x, h[k], rk)] = i + 1;
        }
        x->e[i].t_us = now_us;
        lru_push_front(x, r, i);
    }
    return 0;
}

void xb_prefix_drop_rank(struct xb_prefix *x, int rank)
{
    if (rank < 0 || (size_t)rank >= x->nranks)
        return;
    while (x->ranks[rank].n)
        evict(x, x->ranks[rank].tail);
}

long xb_prefix_capacity_of(const struct xb_prefix *x, int rank)
{
    return rank >= 0 && (size_t)rank < x->nranks && x->ranks[rank].cap > 0 ? x->ranks[rank].cap : x->per_rank;
}

size_t xb_prefix_blocks(const struct xb_prefix *x, int rank)
{
    return rank >= 0 && (size_t)rank < x->nranks ? x->ranks[rank].n : 0;
}

size_t xb_prefix_bytes(const struct xb_prefix *x)
{
    return sizeof *x + x->ecap * sizeof(struct ent) + x->nslot * sizeof(uint32_t) + x->nranks * sizeof(struct rank_lru);
}
