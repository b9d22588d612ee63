/* SPDX-License-Identifier: Apache-2.0 */
/* tok_map.c - the tokenizer's tables: bytes -> id (the vocabulary) and (id, id) -> merge, open addressing on
 * xxHash's XXH3, sized at load for a load factor of at most one half; and GPT-2's byte-level alphabet. */
#include "tok_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#define XXH_INLINE_ALL /* xxHash's own header, inlined: a vocabulary lookup per BPE step and three per merge at load */
#include <xxhash.h>

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

int tok_map_init(struct tok_map *m, size_t expect)
{
    memset(m, 0, sizeof *m);
    m->cap = pow2_at_least(expect * 2 + 1);
    m->slots = malloc(m->cap * sizeof *m->slots);
    if (!m->slots)
        return -1;
    for (size_t i = 0; i < m->cap; i++)
        m->slots[i].id = -1;
    return 0;
}

static int grow(struct tok_map *m)
{
    struct tok_map bigger = *m;
    bigger.cap = m->cap * 2;
    bigger.slots = malloc(bigger.cap * sizeof *bigger.slots);
    if (!bigger.slots)
        return -1;
    for (size_t i = 0; i < bigger.cap; i++)
        bigger.slots[i].id = -1;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->slots[i].id < 0)
            continue;
        size_t j = m->slots[i].h & (bigger.cap - 1);
        while (bigger.slots[j].id >= 0)
            j = (j + 1) & (bigger.cap - 1);
        bigger.slots[j] = m->slots[i];
    }
    free(m->slots);
    *m = bigger;
    return 0;
}

uint64_t tok_map_hash(const void *key, size_t len)
{
    return XXH3_64bits(key, len);
}

void tok_map_prefetch(const struct tok_map *m, uint64_t h)
{
    __builtin_prefetch(&m->slots[h & (m->cap - 1)]);
}

/* the key's text where the slot its hash leads to points (a get's compare reads it next) */
void tok_map_prefetch_key(const struct tok_map *m, uint64_t h)
{
    const struct tok_slot *s = &m->slots[h & (m->cap - 1)];
    if (s->id >= 0)
        __builtin_prefetch(m->arena + s->off);
}

int tok_map_put(struct tok_map *m, const void *key, size_t len, int32_t id)
{
    return tok_map_put_h(m, key, len, XXH3_64bits(key, len), id);
}

int tok_map_put_h(struct tok_map *m, const void *key, size_t len, uint64_t h, int32_t id)
{
    if ((m->n + 1) * 2 > m->cap && grow(m))
        return -1;
    size_t j = h & (m->cap - 1);
    for (; m->slots[j].id >= 0; j = (j + 1) & (m->cap - 1))
        if (m->slots[j].h == h && m->slots[j].len == len && !memcmp(m->arena + m->slots[j].off, key, len))
            return 1;
    if (m->alen + len > m->acap || !m->arena) { /* (an empty first key still gets an arena to point into) */
        size_t c = m->acap ? m->acap * 2 : 1 << 16;
        while (c < m->alen + len)
            c *= 2;
        char *a = realloc(m->arena, c);
        if (!a)
            return -1;
        m->arena = a;
        m->acap = c;
    }
    memcpy(m->arena + m->alen, key, len);
    m->slots[j] = (struct tok_slot){.h = h, .off = (uint32_t)m->alen, .len = (uint32_t)len, .id = id};
    m->alen += len;
    m->n++;
    return 0;
}

int32_t tok_map_get(const struct tok_map *m, const void *key, size_t len)
{
    return tok_map_get_h(m, key, len, XXH3_64bits(key, len));
}

int32_t tok_map_get_h(const struct tok_map *m, const void *key, size_t len, uint64_t h)
{
    for (size_t j = h & (m->cap - 1); m->slots[j].id >= 0; j = (j + 1) & (m->cap - 1))
        if (m->slots[j].h == h && m->slots[j].len == len && !memcmp(m->arena + m->slots[j].off, key, len))
            return m->slots[j].id;
    return -1;
}

void tok_map_free(struct tok_map *m)
{
    free(m->slots);
    free(m->arena);
    memset(m, 0, sizeof *m);
}

int tok_merges_init(struct tok_merges *m, size_t expect)
{
    m->n = 0;
    m->cap = pow2_at_least(expect * 2 + 1);
    m->slots = calloc(m->cap, sizeof *m->slots);
    return m->slots ? 0 : -1;
}

int tok_merges_put(struct tok_merges *m, uint32_t a, uint32_t b, uint32_t rank, uint32_t id)
{
    if ((m->n + 1) * 2 > m->cap)
        return -1; /* sized at load from the merges' count */
    uint64_t key = ((uint64_t)a << 32 | b) + 1;
    size_t j = tok_merge_slot(key, m->cap);
    for (; m->slots[j].key; j = (j + 1) & (m->cap - 1))
        if (m->slots[j].key == key)
            return 1; /* a repeated merge keeps its first (lowest) rank, as Hugging Face's map does */
    m->slots[j] = (struct tok_merge){.key = key, .rank = rank, .id = id};
    m->n++;
    return 0;
}

void tok_merges_prefetch(const struct tok_merges *m, uint32_t a, uint32_t b)
{
    __builtin_prefetch(&m->slots[tok_merge_slot(((uint64_t)a << 32 | b) + 1, m->cap)]);
}

void tok_merges_free(struct tok_merges *m)
{
    free(m->slots);
    m->slots = NULL;
}

/* GPT-2: the printable bytes stand for themselves, the others for 256, 257, ... in byte order. */
void tok_bytes_to_unicode(uint32_t cp_of[256])
{
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        cp_of[b] = printable ? (uint32_t)b : next++;
    }
}

static int16_t byte_of[324];

static void byte_of_init(void)
{
    uint32_t cp_of[256];
    tok_bytes_to_unicode(cp_of);
    for (int i = 0; i < 324; i++)
        byte_of[i] = -1;
    for (int b = 0; b < 256; b++)
        byte_of[cp_of[b]] = (int16_t)b;
}

long tok_bytelevel_decode(const char *s, size_t len, char *out)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, byte_of_init);
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    long n = 0;
    while (i < len) {
        uint32_t cp;
        if (p[i] < 0x80) {
            cp = p[i++];
        } else if ((p[i] & 0xE0) == 0xC0 && i + 1 < len) {
            cp = (uint32_t)(p[i] & 0x1F) << 6 | (p[i + 1] & 0x3F);
            i += 2;
        } else {
            return -1; /* the alphabet ends at U+0143: two bytes at most */
        }
        if (cp >= 324 || byte_of[cp] < 0)
            return -1;
        out[n++] = (char)byte_of[cp];
    }
    return n;
}
