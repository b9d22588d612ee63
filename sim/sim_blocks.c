/* SPDX-License-Identifier: Apache-2.0 */
/* sim_blocks.c - the simulated engine's block pool (sim_blocks.h). */
#include "sim_blocks.h"

#include "sim_kvpub.h"

#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

#define NIL UINT32_MAX

struct sblk {
    unsigned char hash[32];
    int cached;          /* hash is valid and in the map */
    int in_use;          /* taken by the request being stored */
    uint32_t prev, next; /* the free queue (in_use blocks are out of it) */
};

struct sim_pool {
    struct sblk *b;
    size_t n, bs, ncached;
    uint32_t head, tail;  /* free queue: head evicted first */
    uint32_t *map;        /* open addressing over hash prefixes: block index or NIL */
    size_t mapcap;
    EVP_MD_CTX *md;       /* SHA-256, reused block after block */
    unsigned char *le;    /* a block's token ids as little-endian bytes */
};

static uint64_t key_of(const unsigned char *h)
{
    uint64_t k;
    memcpy(&k, h, sizeof k);
    return k;
}

static void q_unlink(struct sim_pool *p, uint32_t i)
{
    struct sblk *b = &p->b[i];
    if (b->prev != NIL)
        p->b[b->prev].next = b->next;
    else
        p->head = b->next;
    if (b->next != NIL)
        p->b[b->next].prev = b->prev;
    else
        p->tail = b->prev;
    b->prev = b->next = NIL;
}

static void q_append(struct sim_pool *p, uint32_t i)
{
    struct sblk *b = &p->b[i];
    b->prev = p->tail;
    b->next = NIL;
    if (p->tail != NIL)
        p->b[p->tail].next = i;
    else
        p->head = i;
    p->tail = i;
}

static long map_find(const struct sim_pool *p, const unsigned char *h)
{
    for (size_t s = key_of(h) & (p->mapcap - 1);; s = (s + 1) & (p->mapcap - 1)) {
        if (p->map[s] == NIL)
            return -1;
        if (!memcmp(p->b[p->map[s]].hash, h, 32))
            return (long)s;
    }
}

static void map_put(struct sim_pool *p, uint32_t i)
{
    size_t s = key_of(p->b[i].hash) & (p->mapcap - 1);
    while (p->map[s] != NIL)
        s = (s + 1) & (p->mapcap - 1);
    p->map[s] = i;
}

static void map_del(struct sim_pool *p, size_t s) /* backward shift: no tombstones */
{
    size_t mask = p->mapcap - 1;
    for (;;) {
        p->map[s] = NIL;
        size_t j = s;
        for (;;) {
            j = (j + 1) & mask;
            if (p->map[j] == NIL)
                return;
            size_t home = key_of(p->b[p->map[j]].hash) & mask;
            if (s <= j ? (home <= s || home > j) : (home <= s && home > j))
                break;
        }
        p->map[s] = p->map[j];
        s = j;
    }
}

struct sim_pool *sim_pool_new(size_t nblocks, size_t block_size)
{
    struct sim_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->n = nblocks;
    p->bs = block_size;
    p->mapcap = 16;
    while (p->mapcap < 2 * nblocks)
        p->mapcap *= 2;
    p->b = calloc(nblocks, sizeof *p->b);
    p->map = malloc(p->mapcap * sizeof *p->map);
    p->md = EVP_MD_CTX_new();
    p->le = malloc(4 * block_size);
    if (!p->b || !p->map || !p->md || !p->le) {
        sim_pool_free(p);
        return NULL;
    }
    memset(p->map, 0xff, p->mapcap * sizeof *p->map);
    p->head = p->tail = NIL;
    for (uint32_t i = 0; i < nblocks; i++) {
        p->b[i].prev = p->b[i].next = NIL;
        q_append(p, i);
    }
    return p;
}

void sim_pool_free(struct sim_pool *p)
{
    if (!p)
        return;
    free(p->b);
    free(p->map);
    EVP_MD_CTX_free(p->md);
    free(p->le);
    free(p);
}

/* the hash of a block of ids, chained on parent's (NULL: the first block), and a salt (NULL: none) */
static void block_hash(struct sim_pool *p, const unsigned char *parent, const uint32_t *ids, const char *salt,
                       unsigned char out[32])
{
    static const unsigned char none[32];
    unsigned len = 32;
    for (size_t i = 0; i < p->bs; i++)
        for (int s = 0; s < 4; s++)
            p->le[4 * i + (size_t)s] = (unsigned char)(ids[i] >> (8 * s));
    EVP_DigestInit_ex(p->md, EVP_sha256(), NULL);
    EVP_DigestUpdate(p->md, parent ? parent : none, 32);
    EVP_DigestUpdate(p->md, p->le, 4 * p->bs);
    if (salt) { /* after the ids, with its length first: no ids and salt can make another's bytes */
        uint64_t n = strlen(salt);
        EVP_DigestUpdate(p->md, &n, sizeof n);
        EVP_DigestUpdate(p->md, salt, n);
    }
    EVP_DigestFinal_ex(p->md, out, &len);
}

size_t sim_pool_store(struct sim_pool *p, struct sim_rank *rk, const uint32_t *ids, size_t n, const char *salt,
                      size_t *held)
{
    size_t nb = n / p->bs, k = 0, run = 0, lead = 0;
    uint32_t *mine = malloc((nb ? nb : 1) * sizeof *mine);
    unsigned char (*stored)[32] = malloc((nb ? nb : 1) * 32), parent[32], h[32];
    if (held)
        *held = 0;
    if (!mine || !stored) {
        free(mine);
        free(stored);
        return 0;
    }
    for (; k < nb; k++) {
        block_hash(p, k ? parent : NULL, ids + k * p->bs, k ? NULL : salt, h);
        long s = map_find(p, h);
        lead += s >= 0 && lead == k; /* the run it held from the start, before this prompt's blocks went in */
        uint32_t i;
        if (s >= 0) { /* held: taken out of the free queue while in use (a hit touches it) */
            i = p->map[s];
        } else {
            i = p->head; /* the least recently used free block */
            if (i == NIL)
                break; /* every block is in use by this prompt: the rest is not cached */
            if (p->b[i].cached) {
                sim_kvpub_removed(rk, (const unsigned char (*)[32])p->b[i].hash, 1);
                map_del(p, (size_t)map_find(p, p->b[i].hash));
                p->b[i].cached = 0;
                p->ncached--;
            }
            memcpy(p->b[i].hash, h, 32);
            p->b[i].cached = 1;
            p->ncached++;
            map_put(p, i);
        }
        q_unlink(p, i);
        p->b[i].in_use = 1;
        mine[k] = i;
        if (s < 0) { /* consecutive new blocks go out as one BlockStored */
            memcpy(stored[run++], h, 32);
        } else if (run) {
            sim_kvpub_stored(rk, (const unsigned char (*)[32])stored, run,
                             k - run ? p->b[mine[k - run - 1]].hash : NULL, ids + (k - run) * p->bs, run * p->bs,
                             p->bs, k - run ? NULL : salt);
            run = 0;
        }
        memcpy(parent, h, 32);
    }
    if (run)
        sim_kvpub_stored(rk, (const unsigned char (*)[32])stored, run, k - run ? p->b[mine[k - run - 1]].hash : NULL,
                         ids + (k - run) * p->bs, run * p->bs, p->bs, k - run ? NULL : salt);
    for (size_t j = k; j-- > 0;) { /* freed in reverse: the prompt's last block is evicted first */
        p->b[mine[j]].in_use = 0;
        q_append(p, mine[j]);
    }
    sim_kvpub_flush(rk);
    free(mine);
    free(stored);
    if (held)
        *held = lead;
    return k;
}

void sim_pool_clear(struct sim_pool *p, struct sim_rank *rk)
{
    for (size_t i = 0; i < p->n; i++)
        p->b[i].cached = 0;
    memset(p->map, 0xff, p->mapcap * sizeof *p->map);
    p->ncached = 0;
    sim_kvpub_cleared(rk);
    sim_kvpub_flush(rk);
}

size_t sim_pool_cached(const struct sim_pool *p)
{
    return p->ncached;
}
