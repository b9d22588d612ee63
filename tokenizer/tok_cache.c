/* SPDX-License-Identifier: Apache-2.0 */
/* tok_cache.c - the tokenization cache (xpyd_tokenizer.h): the ids of text pieces between added tokens, found by
 * a hash of the piece's length and its first and last 32 bytes and verified by comparing the whole piece with the
 * text kept beside its ids (exact: no hash decides a hit; memcmp reads a long piece about 4x faster than XXH3
 * hashes it), least recently used first out when the cache passes its byte bound. A piece between added tokens
 * is encoded on its own by Hugging Face's pipeline (the added tokens split the text before normalization and
 * pre-tokenization), so its ids do not depend on what surrounds it: a conversation's earlier turns, delimited by
 * the template's special tokens, are pieces seen before. One mutex; lookups and inserts are O(1), against a hostile
 * client too: the hash is seeded at random per cache (no one can aim pieces at a bucket), and pieces alike where
 * the key looks (same length, same ends: a prompt can hold thousands that differ only in the middle, each compared
 * with all the others before) are kept at most alike_max at once. */
#include "tok_internal.h"
#include "tok_lru.h"
#include "xpyd_tokenizer.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <xxhash.h>


/* one allocation per entry: the header, the ids, then the piece's text (a put is one malloc, an eviction one free,
 * and a hit reads the ids and the text beside the header) */
struct centry {
    uint64_t key; /* tok_cache_key() */
    size_t len;
    size_t n;
    struct centry *hnext;       /* hash chain */
    struct tok_lnode lru;       /* the cache's use order */
    uint32_t ids[];             /* n ids, then len bytes of text: a hit is a piece with these bytes */
};

static char *entry_text(const struct centry *e)
{
    return (char *)(e->ids + e->n);
}

struct xtok_cache {
    pthread_mutex_t mu;
    struct centry **buckets;
    size_t nbuckets, entries, bytes, max_bytes, min_piece;
    size_t alike_max; /* pieces kept under one key and length (a lookup compares at most this many texts) */
    uint64_t seed;    /* random, per cache */
    struct tok_lru lru;
    uint64_t hits, misses, hit_bytes, miss_bytes, alike_refused;
};

static size_t entry_bytes(const struct centry *e)
{
    return sizeof *e + e->n * sizeof(uint32_t) + e->len;
}

/* where a piece is looked for: its length, first and last 32 bytes (a conversation's pieces differ there; two that
 * do not share a chain and are told apart by their text) */
uint64_t tok_cache_key(const struct xtok_cache *c, const char *text, size_t len)
{
    if (!c || len < c->min_piece)
        return 0;
    size_t k = len < 32 ? len : 32;
    uint64_t s = c->seed ^ len;
    return XXH3_64bits_withSeed(text, k, s) ^ XXH3_64bits_withSeed(text + len - k, k, ~s);
}

struct xtok_cache *xtok_cache_new(size_t max_bytes, size_t min_piece)
{
    struct xtok_cache *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->nbuckets = 1024;
    while (c->nbuckets < max_bytes / 512 && c->nbuckets < (1u << 24))
        c->nbuckets *= 2;
    /* the bucket array in the entries' memory (a lookup reads a slot anywhere in it: on huge pages, no TLB miss)
     * and written now, once: otherwise each new piece's slot is a read fault then a write fault inside a request
     * (4 of them in a 183 KB conversation's turn: perf record -e page-faults, bench/journal/2026-12.md) */
    c->buckets = tok_mem_alloc(c->nbuckets * sizeof *c->buckets);
    if (!c->buckets) {
        free(c);
        return NULL;
    }
    memset(c->buckets, 0, c->nbuckets * sizeof *c->buckets);
    if (getrandom(&c->seed, sizeof c->seed, GRND_NONBLOCK) != (ssize_t)sizeof c->seed) /* no entropy yet: */
        c->seed = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15u ^ (uint64_t)(uintptr_t)c ^ (uint64_t)clock();
    pthread_mutex_init(&c->mu, NULL);
    c->max_bytes = max_bytes;
    c->min_piece = min_piece;
    c->alike_max = 4;
    return c;
}

void xtok_cache_set_alike_max(struct xtok_cache *c, size_t n)
{
    pthread_mutex_lock(&c->mu);
    c->alike_max = n ? n : 1;
    pthread_mutex_unlock(&c->mu);
}

void xtok_cache_free(struct xtok_cache *c)
{
    if (!c)
        return;
    for (struct tok_lnode *x = c->lru.head, *n; x; x = n) {
        n = x->next;
        tok_mem_free(TOK_LRU_OF(x, struct centry, lru));
    }
    tok_mem_free(c->buckets);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

void xtok_cache_stats(struct xtok_cache *c, struct xtok_cache_stats *st)
{
    pthread_mutex_lock(&c->mu);
    st->bytes = c->bytes;
    st->entries = c->entries;
    st->hits = c->hits;
    st->misses = c->misses;
    st->hit_bytes = c->hit_bytes;
    st->miss_bytes = c->miss_bytes;
    st->alike_refused = c->alike_refused;
    pthread_mutex_unlock(&c->mu);
}

static struct centry **slot(struct xtok_cache *c, uint64_t k)
{
    return &c->buckets[k & (c->nbuckets - 1)];
}

/* A conversation's pieces each cost a chain of cache misses when their entries have left the core's caches (the
 * bucket, then the entry, then its ids and text), one piece after the other. Asked for together before the pieces
 * are looked up one by one, the misses overlap: the buckets first, then the entries they lead to, then the start
 * of each entry's ids and text (the hardware prefetcher follows on). A 174 KB conversation's hits, entries out of
 * L2: 39-44 µs one by one, 33-35 asked for together (bench/journal/2026-12.md). Prefetches only: nothing read here
 * decides anything. */
void tok_cache_prefetch(struct xtok_cache *c, const uint64_t *keys, size_t n)
{
    if (!c || !n)
        return;
    n = n < TOK_PREFETCH_MAX ? n : TOK_PREFETCH_MAX;
    for (size_t i = 0; i < n; i++)
        __builtin_prefetch(slot(c, keys[i]));
    struct centry *e[TOK_PREFETCH_MAX];
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < n; i++) {
        e[i] = *slot(c, keys[i]);
        if (e[i])
            __builtin_prefetch(e[i]);
    }
    for (size_t i = 0; i < n; i++)
        if (e[i] && e[i]->key == keys[i]) {
            __builtin_prefetch(e[i]->ids);
            __builtin_prefetch(entry_text(e[i]));
        }
    pthread_mutex_unlock(&c->mu);
}

static int same_piece(const struct centry *e, uint64_t k, const char *text, size_t len)
{
    return e->key == k && e->len == len && !memcmp(entry_text(e), text, len);
}

static void evict_one(struct xtok_cache *c)
{
    struct centry *e = TOK_LRU_OF(c->lru.tail, struct centry, lru);
    tok_lru_unlink(&c->lru, &e->lru);
    for (struct centry **pp = slot(c, e->key); *pp; pp = &(*pp)->hnext)
        if (*pp == e) {
            *pp = e->hnext;
            break;
        }
    c->bytes -= entry_bytes(e);
    c->entries--;
    tok_mem_free(e);
}

int tok_cache_get(struct xtok_cache *c, uint64_t k, const char *text, size_t len, uint32_t **v, size_t *n,
                  size_t *cap)
{
    if (!c || len < c->min_piece)
        return 0;
    int rc = 0;
    pthread_mutex_lock(&c->mu);
    for (struct centry *e = *slot(c, k); e; e = e->hnext)
        if (same_piece(e, k, text, len)) {
            if (*n + e->n > *cap) { /* appended to the caller's growing array */
                size_t nc = *cap ? *cap : 64;
                while (nc < *n + e->n)
                    nc *= 2;
                uint32_t *nv = realloc(*v, nc * sizeof *nv);
                if (!nv) {
                    pthread_mutex_unlock(&c->mu);
                    return -1;
                }
                *v = nv;
                *cap = nc;
            }
            memcpy(*v + *n, e->ids, e->n * sizeof **v);
            *n += e->n;
            tok_lru_touch(&c->lru, &e->lru);
            c->hits++;
            c->hit_bytes += len;
            rc = 1;
            break;
        }
    if (!rc) {
        c->misses++;
        c->miss_bytes += len;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

void tok_cache_put(struct xtok_cache *c, uint64_t key, const char *text, size_t len, const uint32_t *ids, size_t n)
{
    if (!c || len < c->min_piece)
        return;
    struct centry h = {.n = n, .len = len};
    if (len > SIZE_MAX - sizeof h || n > (SIZE_MAX - sizeof h - len) / sizeof *ids || entry_bytes(&h) > c->max_bytes)
        return;
    struct centry *e = tok_mem_alloc(entry_bytes(&h));
    if (!e)
        return;
    *e = h;
    memcpy(e->ids, ids, n * sizeof *ids);
    memcpy(entry_text(e), text, len);
    e->key = key;
    pthread_mutex_lock(&c->mu);
    size_t alike = 0; /* kept pieces of this key and length, other texts */
    for (struct centry *x = *slot(c, e->key); x; x = x->hnext) {
        if (x->key != e->key || x->len != len)
            continue;
        int same = !memcmp(entry_text(x), text, len); /* another thread put it first */
        if (same || ++alike >= c->alike_max) {
            c->alike_refused += !same;
            pthread_mutex_unlock(&c->mu);
            tok_mem_free(e);
            return;
        }
    }
    while (c->lru.tail && c->bytes + entry_bytes(e) > c->max_bytes)
        evict_one(c);
    struct centry **s = slot(c, e->key);
    e->hnext = *s;
    *s = e;
    tok_lru_front(&c->lru, &e->lru);
    c->bytes += entry_bytes(e);
    c->entries++;
    pthread_mutex_unlock(&c->mu);
}
