/* SPDX-License-Identifier: Apache-2.0 */
/* kv_index.c - the per-pool index of the blocks ranks report holding (kv_index.h). Open addressing with linear
 * probing and backward-shift deletion, over entry arrays that grow by doubling up to the bound. */
#include "kv_index.h"

#include "xb_prefix.h"

#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define NONE UINT32_MAX
#define MAX_RANKS 4096
#define MAX_WORDS (MAX_RANKS / 64)
#define DEFAULT_MAX_SPACES 1024 /* LoRA adapter names remembered for kvi_space_for (kvi_set_max_adapters) */

const char *const kvi_skip_names[KVI_COUNT] = {"ok", "not_full_attention", "block_size", "shape", "orphan", "full",
                                                "nomem", "adapters"};

struct slot {
    uint64_t key;
    uint32_t idx; /* NONE: empty */
};

struct map {
    struct slot *s;
    size_t cap, n; /* cap: 0 or a power of two, at most half full */
    uint64_t seed; /* random: where a key lands cannot be aimed (content keys come from clients' prompts) */
};

struct blk { /* a content key: which ranks hold it, and the pairs that say so */
    uint64_t key;
    uint32_t head; /* first pair; free list link when unused */
};

struct pair { /* a block one rank reported */
    uint64_t ehash, chain, space;
    uint32_t blk, next; /* next pair of the same blk; free list link when unused */
    uint16_t rank;
    uint8_t media; /* 1 GPU (or not said), 2 CPU, 4 any other medium */
};

struct piece { /* an engine block smaller than the router's that does not end one of them (SGLang's pages of one
                * token): kept until the engine block that ends it arrives, which then reads the tokens back */
    uint64_t ehash, parent, base, extra; /* parent: the engine block before it (has_parent); base: the chain of the
                                          * router's block before the one it is in; extra: its keys so far */
    union {
        uint32_t *tok;                   /* its b tokens */
        uint32_t in[2];                  /* or in place, b <= 2 (SGLang's default pages of one token) */
    } t;
    uint32_t next;                       /* free list link when unused */
    uint16_t rank, b, filled;            /* filled: tokens of the router's block up to and including it */
    uint8_t has_parent, media;
};

struct kvi {
    pthread_rwlock_t mu;
    int nranks, words;
    size_t max_pairs;
    uint64_t seed; /* of the (rank, engine hash) keys: an engine cannot aim its hashes at one probe chain */
    struct map by_key, by_pair;
    struct blk *blks;
    uint64_t *bits; /* words per blk */
    size_t nblks, blks_cap;
    uint32_t blk_free;
    struct pair *pairs;
    size_t npairs, pairs_cap;
    uint32_t pair_free;
    size_t *rank_pairs;
    uint16_t *mult; /* per rank: its engine's block in the router's (0: none seen yet, as 1) */
    struct map by_piece; /* (rank, engine hash) -> pieces[] */
    struct piece *pieces;
    size_t npieces, pieces_cap, piece_tokens;
    uint32_t piece_free;
    struct map spaces; /* the key spaces of the LoRA adapters blocks were stored under (idx unused) */
    size_t max_spaces;
    int spaces_full; /* an adapter's name came when max_spaces were remembered: a model name not among them may
                      * be an adapter, so it is not taken for the base model (kvi_space_for) */
};

/* a key's first slot, seeded (xb_slot_mix): a content key is the router's own hash of a block's tokens, which a
 * client chooses */
static size_t home(const struct map *m, uint64_t key)
{
    return (size_t)xb_slot_mix(key ^ m->seed) & (m->cap - 1);
}

static size_t map_longest_run(const struct map *m)
{
    size_t best = 0, run = 0;
    for (size_t i = 0; i < 2 * m->cap && run < m->cap; i++) { /* twice round: a run can wrap */
        run = m->s[i & (m->cap - 1)].idx != NONE ? run + 1 : 0;
        best = run > best ? run : best;
    }
    return best;
}

static long map_find(const struct map *m, uint64_t key)
{
    if (!m->cap)
        return -1;
    for (size_t i = home(m, key);; i = (i + 1) & (m->cap - 1)) {
        if (m->s[i].idx == NONE)
            return -1;
        if (m->s[i].key == key)
            return (long)i;
    }
}

static void map_place(struct map *m, uint64_t key, uint32_t idx)
{
    size_t i = home(m, key);
    while (m->s[i].idx != NONE)
        i = (i + 1) & (m->cap - 1);
    m->s[i].key = key;
    m->s[i].idx = idx;
    m->n++;
}

static int map_put(struct map *m, uint64_t key, uint32_t idx)
{
    if (2 * (m->n + 1) > m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 1024;
        struct slot *s = malloc(cap * sizeof *s), *old = m->s;
        if (!s)
            return -1;
        for (size_t i = 0; i < cap; i++)
            s[i].idx = NONE;
        size_t oldcap = m->cap;
        m->s = s;
        m->cap = cap;
        m->n = 0;
        for (size_t i = 0; i < oldcap; i++)
            if (old[i].idx != NONE)
                map_place(m, old[i].key, old[i].idx);
        free(old);
    }
    map_place(m, key, idx);
    return 0;
}

static void map_del(struct map *m, size_t i)
{
    size_t mask = m->cap - 1;
    m->n--;
    for (;;) {
        m->s[i].idx = NONE;
        size_t j = i;
        for (;;) {
            j = (j + 1) & mask;
            if (m->s[j].idx == NONE)
                return;
            size_t h = home(m, m->s[j].key);
            /* the entry at j may fill the hole at i unless its home lies cyclically in (i, j] */
            int between = i <= j ? (h > i && h <= j) : (h > i || h <= j);
            if (!between)
                break;
        }
        m->s[i] = m->s[j];
        i = j;
    }
}

struct kvi *kvi_new(int nranks, size_t max_blocks)
{
    if (nranks < 1 || nranks > MAX_RANKS || !max_blocks || max_blocks > NONE / 2)
        return NULL;
    struct kvi *x = calloc(1, sizeof *x);
    if (!x)
        return NULL;
    x->nranks = nranks;
    x->words = 1; /* grows with the highest rank that stores a block */
    x->max_pairs = max_blocks;
    x->rank_pairs = calloc((size_t)nranks, sizeof *x->rank_pairs);
    x->mult = calloc((size_t)nranks, sizeof *x->mult);
    x->blk_free = x->pair_free = x->piece_free = NONE;
    x->seed = (uint64_t)arc4random() << 32 | arc4random();
    x->by_key.seed = (uint64_t)arc4random() << 32 | arc4random();
    x->spaces.seed = (uint64_t)arc4random() << 32 | arc4random(); /* adapter names: an engine's to choose */
    x->max_spaces = DEFAULT_MAX_SPACES;
    if (!x->rank_pairs || !x->mult || pthread_rwlock_init(&x->mu, NULL)) {
        free(x->mult);
        free(x->rank_pairs);
        free(x);
        return NULL;
    }
    return x;
}

void kvi_set_max_adapters(struct kvi *x, size_t n)
{
    pthread_rwlock_wrlock(&x->mu);
    x->max_spaces = n;
    pthread_rwlock_unlock(&x->mu);
}

void kvi_free(struct kvi *x)
{
    if (!x)
        return;
    pthread_rwlock_destroy(&x->mu);
    free(x->by_key.s);
    free(x->spaces.s);
    for (size_t i = 0; i < x->by_piece.cap; i++)
        if (x->by_piece.s[i].idx != NONE && x->pieces[x->by_piece.s[i].idx].b > 2)
            free(x->pieces[x->by_piece.s[i].idx].t.tok);
    free(x->by_piece.s);
    free(x->pieces);
    free(x->by_pair.s);
    free(x->blks);
    free(x->bits);
    free(x->pairs);
    free(x->rank_pairs);
    free(x->mult);
    free(x);
}

static uint64_t pair_key(const struct kvi *x, int rank, uint64_t ehash)
{
    uint64_t v[2] = {(uint64_t)rank, ehash};
    return XXH3_64bits_withSeed(v, sizeof v, x->seed);
}

static long find_pair(const struct kvi *x, int rank, uint64_t ehash)
{
    long s = map_find(&x->by_pair, pair_key(x, rank, ehash));
    if (s < 0)
        return -1;
    uint32_t i = x->by_pair.s[s].idx;
    return x->pairs[i].rank == rank && x->pairs[i].ehash == ehash ? (long)i : -1;
}

/* The hash part j (< m - 1) of an engine block of m of the router's is kept under: derived from the engine's
 * (the last part keeps the engine's own, the next block's parent) */
static uint64_t part_hash(uint64_t ehash, size_t j)
{
    uint64_t v[2] = {ehash, (uint64_t)j};
    return XXH3_64bits_withSeed(v, sizeof v, 0x7061727473ull /* "parts" */);
}

static uint64_t *bits_of(const struct kvi *x, uint32_t b)
{
    return x->bits + (size_t)b * (size_t)x->words;
}

/* Room in every bitmap for rank: the bitmaps re-laid out with more words. 0 or -1. */
static int ensure_words(struct kvi *x, int rank)
{
    int w = rank / 64 + 1;
    if (w <= x->words)
        return 0;
    uint64_t *bits = x->blks_cap ? calloc(x->blks_cap * (size_t)w, sizeof *bits) : NULL;
    if (x->blks_cap && !bits)
        return -1;
    for (size_t b = 0; b < x->nblks; b++)
        memcpy(bits + b * (size_t)w, x->bits + b * (size_t)x->words, (size_t)x->words * sizeof *bits);
    free(x->bits);
    x->bits = bits;
    x->words = w;
    return 0;
}

static long new_blk(struct kvi *x, uint64_t key)
{
    uint32_t b = x->blk_free;
    if (b != NONE) {
        x->blk_free = x->blks[b].head;
    } else {
        if (x->nblks == x->blks_cap) {
            size_t cap = x->blks_cap ? 2 * x->blks_cap : 1024;
            struct blk *nb = realloc(x->blks, cap * sizeof *nb);
            if (nb)
                x->blks = nb;
            uint64_t *bits = nb ? realloc(x->bits, cap * (size_t)x->words * sizeof *bits) : NULL;
            if (!bits)
                return -1;
            x->bits = bits;
            x->blks_cap = cap;
        }
        b = (uint32_t)x->nblks++;
    }
    if (map_put(&x->by_key, key, b)) {
        x->blks[b].head = x->blk_free;
        x->blk_free = b;
        return -1;
    }
    x->blks[b].key = key;
    x->blks[b].head = NONE;
    memset(bits_of(x, b), 0, (size_t)x->words * sizeof(uint64_t));
    return b;
}

/* A slot for one more element of the array *arrp (T *: cap elements of `size` bytes, `used` of them taken) whose
 * free slots are linked through the uint32_t at offset `link` (*free_head the first): a free one, else the next
 * one, the array doubled (1024 at first) when full. NONE when out of memory (nothing changed). */
static uint32_t take_slot(void *arrp, size_t size, size_t *cap, size_t used, uint32_t *free_head, size_t link)
{
    char *arr;
    memcpy(&arr, arrp, sizeof arr);
    uint32_t i = *free_head;
    if (i != NONE) {
        memcpy(free_head, arr + (size_t)i * size + link, sizeof *free_head);
        return i;
    }
    if (used == *cap) { /* no free slot: every slot below `used` is taken */
        size_t c = *cap ? 2 * *cap : 1024;
        char *grown = realloc(arr, c * size);
        if (!grown)
            return NONE;
        memcpy(arrp, &grown, sizeof grown);
        *cap = c;
    }
    return (uint32_t)used;
}

static void remove_pair(struct kvi *x, uint32_t pi)
{
    struct pair *p = &x->pairs[pi];
    struct blk *b = &x->blks[p->blk];
    int still = 0; /* another pair of the same rank holds this content */
    for (uint32_t *link = &b->head; *link != NONE;) {
        if (*link == pi) {
            *link = p->next;
            continue;
        }
        still |= x->pairs[*link].rank == p->rank;
        link = &x->pairs[*link].next;
    }
    if (!still)
        bits_of(x, p->blk)[p->rank / 64] &= ~(1ull << (p->rank % 64));
    if (b->head == NONE) {
        map_del(&x->by_key, (size_t)map_find(&x->by_key, b->key));
        b->head = x->blk_free;
        x->blk_free = p->blk;
    }
    map_del(&x->by_pair, (size_t)map_find(&x->by_pair, pair_key(x, p->rank, p->ehash)));
    x->rank_pairs[p->rank]--;
    x->npairs--;
    p->next = x->pair_free;
    x->pair_free = pi;
}

static int add_pair(struct kvi *x, int rank, uint64_t ehash, uint64_t chain, uint64_t space, uint8_t media)
{
    long old = find_pair(x, rank, ehash);
    if (old >= 0) {
        struct pair *p = &x->pairs[old];
        if (p->chain == chain && p->space == space) {
            p->media |= media;
            return KVI_OK;
        }
        remove_pair(x, (uint32_t)old); /* the engine's hash now names other content */
    }
    if (x->npairs + x->npieces >= x->max_pairs)
        return KVI_FULL;
    uint64_t pk = pair_key(x, rank, ehash);
    if (map_find(&x->by_pair, pk) >= 0) /* another (rank, hash) with the same 64-bit key: not kept */
        return KVI_FULL;
    long bs = map_find(&x->by_key, chain ^ space);
    long b = bs >= 0 ? (long)x->by_key.s[bs].idx : new_blk(x, chain ^ space);
    if (b < 0)
        return KVI_NOMEM;
    uint32_t pi = take_slot(&x->pairs, sizeof *x->pairs, &x->pairs_cap, x->npairs, &x->pair_free,
                            offsetof(struct pair, next));
    if (pi == NONE)
        goto nomem;
    if (map_put(&x->by_pair, pk, pi)) {
        x->pairs[pi].next = x->pair_free;
        x->pair_free = pi;
        goto nomem;
    }
    x->pairs[pi] = (struct pair){.ehash = ehash, .chain = chain, .space = space, .blk = (uint32_t)b,
                                 .next = x->blks[b].head, .rank = (uint16_t)rank, .media = media};
    x->blks[b].head = pi;
    bits_of(x, (uint32_t)b)[rank / 64] |= 1ull << (rank % 64);
    x->rank_pairs[rank]++;
    x->npairs++;
    return KVI_OK;
nomem:
    if (x->blks[b].head == NONE) { /* made for this pair */
        map_del(&x->by_key, (size_t)map_find(&x->by_key, chain ^ space));
        x->blks[b].head = x->blk_free;
        x->blk_free = (uint32_t)b;
    }
    return KVI_NOMEM;
}

static long find_piece(const struct kvi *x, int rank, uint64_t ehash)
{
    long s = map_find(&x->by_piece, pair_key(x, rank, ehash));
    if (s < 0)
        return -1;
    uint32_t i = x->by_piece.s[s].idx;
    return x->pieces[i].rank == rank && x->pieces[i].ehash == ehash ? (long)i : -1;
}

static void remove_piece(struct kvi *x, uint32_t qi)
{
    struct piece *q = &x->pieces[qi];
    map_del(&x->by_piece, (size_t)map_find(&x->by_piece, pair_key(x, q->rank, q->ehash)));
    if (q->b > 2)
        free(q->t.tok);
    x->piece_tokens -= q->b;
    x->npieces--;
    q->next = x->piece_free;
    x->piece_free = qi;
}

/* Keeps engine block ehash of rank as a piece (its fields in *v, its tokens copied); one kept under the same hash
 * is replaced. Pieces count against the bound with the pairs. */
static int add_piece(struct kvi *x, const struct piece *v, const uint32_t *tok)
{
    uint64_t pk = pair_key(x, v->rank, v->ehash);
    long s = map_find(&x->by_piece, pk);
    if (s >= 0) {
        const struct piece *old = &x->pieces[x->by_piece.s[s].idx];
        if (old->rank != v->rank || old->ehash != v->ehash) /* another (rank, hash) with the same key: not kept */
            return KVI_FULL;
        remove_piece(x, x->by_piece.s[s].idx);
    }
    if (x->npairs + x->npieces >= x->max_pairs)
        return KVI_FULL;
    uint32_t *t = v->b > 2 ? malloc(v->b * sizeof *t) : NULL;
    if (v->b > 2 && !t)
        return KVI_NOMEM;
    uint32_t qi = take_slot(&x->pieces, sizeof *x->pieces, &x->pieces_cap, x->npieces, &x->piece_free,
                            offsetof(struct piece, next));
    if (qi != NONE && map_put(&x->by_piece, pk, qi)) { /* the slot given back */
        x->pieces[qi].next = x->piece_free;
        x->piece_free = qi;
        qi = NONE;
    }
    if (qi == NONE) {
        free(t);
        return KVI_NOMEM;
    }
    x->pieces[qi] = *v;
    if (t)
        x->pieces[qi].t.tok = t;
    memcpy(t ? t : x->pieces[qi].t.in, tok, v->b * sizeof *tok);
    x->piece_tokens += v->b;
    x->npieces++;
    return KVI_OK;
}

/* Engine blocks of b tokens, k of them one of the router's (b x k = block_tokens): each one that ends a router
 * block is keyed from its tokens and its pieces' (read back through their parents), the others kept as pieces */
static int store_pieces(struct kvi *x, int rank, const struct kv_event *ev, size_t b, size_t block_tokens,
                        uint64_t space, uint8_t media)
{
    struct piece at = {.base = xb_chain_seed(), .rank = (uint16_t)rank, .b = (uint16_t)b, .media = media};
    if (ev->has_parent) { /* the router's block the event goes on with, and how far (a piece, most often) */
        long qi = find_piece(x, rank, ev->parent), pi = qi < 0 ? find_pair(x, rank, ev->parent) : -1;
        if (pi >= 0) {
            at.base = x->pairs[pi].chain;
        } else if (qi >= 0) {
            at.base = x->pieces[qi].base;
            at.filled = x->pieces[qi].filled;
            at.extra = x->pieces[qi].extra;
        } else {
            return KVI_ORPHAN;
        }
        at.parent = ev->parent;
        at.has_parent = 1;
    }
    uint32_t scratch[KVI_MAX_PARTS * 16];
    int rc = KVI_OK;
    for (size_t i = 0; !rc && i < ev->nhashes; i++) {
        const uint32_t *tok = ev->tokens + i * b;
        at.ehash = ev->hashes[i];
        at.filled = (uint16_t)(at.filled + b);
        uint64_t e = ev->extra ? ev->extra[i] : 0; /* its keys joined to the block's so far (an image over two
                                                     * pages names both: mixed, never cancelled out) */
        if (e)
            at.extra = at.extra ? xb_chain_extra(at.extra, e) : e;
        if (at.filled < block_tokens) {
            rc = add_piece(x, &at, tok);
        } else { /* ends a router block: its tokens, from the last piece back */
            size_t n = block_tokens - b;
            memcpy(scratch + n, tok, b * sizeof *tok);
            for (uint64_t h = at.parent; !rc && n;) {
                long qi = at.has_parent ? find_piece(x, rank, h) : -1;
                if (qi < 0 || x->pieces[qi].b != b || x->pieces[qi].filled != n) {
                    rc = KVI_ORPHAN; /* evicted or replaced since: the block cannot be keyed */
                } else {
                    n -= b;
                    memcpy(scratch + n, b > 2 ? x->pieces[qi].t.tok : x->pieces[qi].t.in, b * sizeof *tok);
                    h = x->pieces[qi].parent;
                }
            }
            uint64_t chain = xb_hash_block_ids(at.base, scratch, block_tokens);
            if (!rc && at.extra) /* an image, a cache salt: the block (and all after it) is not the text's */
                chain = xb_chain_extra(chain, at.extra);
            if (!rc)
                rc = add_pair(x, rank, at.ehash, chain, space, media);
            at.base = chain;
            at.filled = 0;
            at.extra = 0;
        }
        at.parent = at.ehash;
        at.has_parent = 1;
    }
    return rc;
}

static uint8_t media_of(const char *m)
{
    if (!m[0] || !strcmp(m, "GPU"))
        return 1;
    return !strcmp(m, "CPU") ? 2 : 4;
}

/* an adapter's key space from its whole name's XXH3 (kve_set_lora: the events'; kvi_space_for: a request's) */
static uint64_t space_of_hash(uint64_t h)
{
    uint64_t s = h | (1ull << 63);             /* never 0, the base model's */
    return s == KVI_SPACE_UNKNOWN ? s + 1 : s; /* nor the one no block is in */
}

static uint64_t space_of(const struct kv_event *ev)
{
    if (ev->lora_len)
        return space_of_hash(ev->lora_hash);
    if (ev->lora_id >= 0) /* an adapter known only by its id: its blocks match no request, as they should not */
        return XXH3_64bits_withSeed(&ev->lora_id, sizeof ev->lora_id, 0x6c6f7261u) | (1ull << 63) | 1; /* odd: never
                                                                                                  * the unknown one */
    return 0;
}

/* An adapter's key space among those remembered: 0, KVI_ADAPTERS (no room: from now on a model not remembered is
 * not taken for the base model) or KVI_NOMEM. Under the write lock. */
static int remember_space(struct kvi *x, uint64_t space)
{
    if (map_find(&x->spaces, space) >= 0)
        return 0;
    if (x->spaces.n >= x->max_spaces) {
        x->spaces_full = 1;
        return KVI_ADAPTERS;
    }
    return map_put(&x->spaces, space, 0) ? KVI_NOMEM : 0;
}

int kvi_add_adapter(struct kvi *x, const char *name, size_t len)
{
    if (!len)
        return 0;
    pthread_rwlock_wrlock(&x->mu);
    int rc = remember_space(x, space_of_hash(XXH3_64bits(name, len)));
    pthread_rwlock_unlock(&x->mu);
    return rc;
}

size_t kvi_adapters(struct kvi *x)
{
    pthread_rwlock_rdlock(&x->mu);
    size_t n = x->spaces.n;
    pthread_rwlock_unlock(&x->mu);
    return n;
}

int kvi_apply(struct kvi *x, int rank, const struct kv_event *ev, long block_tokens)
{
    if (rank < 0 || rank >= x->nranks)
        return KVI_SHAPE;
    int rc = KVI_OK;
    pthread_rwlock_wrlock(&x->mu);
    if (ev->type == KVE_CLEARED) {
        pthread_rwlock_unlock(&x->mu);
        kvi_drop_rank(x, rank);
        return KVI_OK;
    }
    if (ev->type == KVE_REMOVED) {
        uint8_t media = media_of(ev->medium);
        for (size_t i = 0; i < ev->nhashes; i++) {
            long qi = x->npieces ? find_piece(x, rank, ev->hashes[i]) : -1; /* a piece of a router block */
            if (qi >= 0) {
                if (!(x->pieces[qi].media &= (uint8_t)~media))
                    remove_piece(x, (uint32_t)qi);
                continue;
            }
            long pi = find_pair(x, rank, ev->hashes[i]);
            if (pi >= 0 && !(x->pairs[pi].media &= (uint8_t)~media))
                remove_pair(x, (uint32_t)pi);
            /* its other parts, kept in order (none after the first missing one), whatever the size now */
            for (size_t j = 0; j < KVI_MAX_PARTS && (pi = find_pair(x, rank, part_hash(ev->hashes[i], j))) >= 0; j++)
                if (!(x->pairs[pi].media &= (uint8_t)~media))
                    remove_pair(x, (uint32_t)pi);
        }
        pthread_rwlock_unlock(&x->mu);
        return KVI_OK;
    }
    long b = ev->block_size > 0 ? ev->block_size : block_tokens;
    size_t m = 1; /* the router's blocks in one of the engine's */
    int small = b > 0 && b < block_tokens; /* pieces: the router's blocks are k of the engine's */
    if (!ev->full_attention)
        rc = KVI_NOT_FULL_ATTENTION;
    else if (block_tokens <= 0 || block_tokens > KVI_MAX_PARTS * 16 || b <= 0 ||
             (small ? block_tokens % b : b % block_tokens || b / block_tokens > KVI_MAX_PARTS))
        rc = KVI_BLOCK_SIZE;
    else if (ev->ntokens != ev->nhashes * (size_t)b)
        rc = KVI_SHAPE;
    else
        m = small ? 1 : (size_t)(b / block_tokens);
    uint64_t prev = xb_chain_seed(), space = space_of(ev);
    if (ev->lora_len) { /* an adapter (whatever else the event is: its name says the model is one) */
        int known = remember_space(x, space);
        if (!rc && known)
            rc = known;
    }
    if (!rc && ensure_words(x, rank))
        rc = KVI_NOMEM;
    if (!rc && small) {
        x->mult[rank] = 1;
        rc = store_pieces(x, rank, ev, (size_t)b, (size_t)block_tokens, space, media_of(ev->medium));
        m = 0; /* done */
    }
    if (!rc && m && ev->has_parent) {
        long pi = find_pair(x, rank, ev->parent);
        if (pi < 0)
            rc = KVI_ORPHAN;
        else
            prev = x->pairs[pi].chain;
    }
    if (!rc && m)
        x->mult[rank] = (uint16_t)m;
    for (size_t i = 0; !rc && m && i < ev->nhashes; i++)
        for (size_t j = 0; !rc && j < m; j++) { /* the engine's block i as m of the router's */
            uint64_t chain = xb_hash_block_ids(prev, ev->tokens + (i * m + j) * (size_t)block_tokens,
                                               (size_t)block_tokens);
            if (ev->extra && !j) /* an image, a cache salt: the block (and all after it) is not the text's */
                chain = xb_chain_extra(chain, ev->extra[i]);
            rc = add_pair(x, rank, j + 1 < m ? part_hash(ev->hashes[i], j) : ev->hashes[i], chain, space,
                          media_of(ev->medium));
            prev = chain;
        }
    pthread_rwlock_unlock(&x->mu);
    return rc;
}

void kvi_drop_rank(struct kvi *x, int rank)
{
    if (rank < 0 || rank >= x->nranks)
        return;
    pthread_rwlock_wrlock(&x->mu);
    /* a pair is in use when it is in by_pair; walk the table, not the arrays (free slots hold links) */
    for (size_t i = 0; x->rank_pairs[rank] && i < x->by_pair.cap;) {
        const struct slot *s = &x->by_pair.s[i];
        if (s->idx != NONE && x->pairs[s->idx].rank == rank)
            remove_pair(x, s->idx); /* backward shift may move another entry into slot i: look at it again */
        else
            i++;
    }
    for (size_t i = 0; x->npieces && i < x->by_piece.cap;) {
        const struct slot *s = &x->by_piece.s[i];
        if (s->idx != NONE && x->pieces[s->idx].rank == rank)
            remove_piece(x, s->idx);
        else
            i++;
    }
    pthread_rwlock_unlock(&x->mu);
}

uint64_t kvi_space_for(struct kvi *x, const char *model)
{
    if (!model || !model[0])
        return 0;
    uint64_t s = space_of_hash(XXH3_64bits(model, strlen(model))), found;
    pthread_rwlock_rdlock(&x->mu);
    found = map_find(&x->spaces, s) >= 0 ? s : x->spaces_full ? KVI_SPACE_UNKNOWN : 0;
    pthread_rwlock_unlock(&x->mu);
    return found;
}

void kvi_match(struct kvi *x, const uint64_t *keys, size_t n, uint64_t space, uint32_t *out)
{
    kvi_match_units(x, keys, n, space, out, NULL);
}

void kvi_match_units(struct kvi *x, const uint64_t *keys, size_t n, uint64_t space, uint32_t *out, uint16_t *units)
{
    uint64_t alive[MAX_WORDS] = {0};
    int any = 0;
    pthread_rwlock_rdlock(&x->mu);
    for (int r = 0; r < x->nranks; r++) {
        out[r] = 0;
        if (x->rank_pairs[r]) {
            alive[r / 64] |= 1ull << (r % 64);
            any = 1;
        }
    }
    size_t i = 0;
    for (; any && i < n; i++) {
        long s = map_find(&x->by_key, keys[i] ^ space);
        const uint64_t *bits = s >= 0 ? bits_of(x, x->by_key.s[s].idx) : NULL;
        any = 0;
        for (int w = 0; w < x->words; w++) {
            uint64_t keep = bits ? alive[w] & bits[w] : 0;
            for (uint64_t gone = alive[w] & ~keep; gone; gone &= gone - 1)
                out[w * 64 + __builtin_ctzll(gone)] = (uint32_t)i;
            alive[w] = keep;
            any |= keep != 0;
        }
    }
    for (int w = 0; any && w < x->words; w++)
        for (uint64_t left = alive[w]; left; left &= left - 1)
            out[w * 64 + __builtin_ctzll(left)] = (uint32_t)n;
    for (int r = 0; r < x->nranks; r++) { /* the engine hits whole blocks of its own */
        if (x->mult[r] > 1)
            out[r] -= out[r] % x->mult[r];
        if (units)
            units[r] = x->mult[r] > 1 ? x->mult[r] : 1;
    }
    pthread_rwlock_unlock(&x->mu);
}

size_t kvi_blocks(struct kvi *x, int rank)
{
    pthread_rwlock_rdlock(&x->mu);
    size_t n = rank >= 0 && rank < x->nranks ? x->rank_pairs[rank] : 0;
    pthread_rwlock_unlock(&x->mu);
    return n;
}

size_t kvi_pieces(struct kvi *x)
{
    pthread_rwlock_rdlock(&x->mu);
    size_t n = x->npieces;
    pthread_rwlock_unlock(&x->mu);
    return n;
}

size_t kvi_bytes(struct kvi *x)
{
    pthread_rwlock_rdlock(&x->mu);
    size_t b = (x->by_key.cap + x->by_pair.cap) * sizeof(struct slot) +
               x->blks_cap * (sizeof(struct blk) + (size_t)x->words * sizeof(uint64_t)) +
               x->pairs_cap * sizeof(struct pair) + (size_t)x->nranks * (sizeof(size_t) + sizeof(uint16_t)) +
               x->by_piece.cap * sizeof(struct slot) + x->pieces_cap * sizeof(struct piece) +
               x->piece_tokens * sizeof(uint32_t) + x->spaces.cap * sizeof(struct slot);
    pthread_rwlock_unlock(&x->mu);
    return b;
}

size_t kvi_longest_run(struct kvi *x)
{
    pthread_rwlock_rdlock(&x->mu);
    size_t n = map_longest_run(&x->by_key);
    pthread_rwlock_unlock(&x->mu);
    return n;
}
