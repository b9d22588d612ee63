/* SPDX-License-Identifier: Apache-2.0 */
/* tok_internal.h - what the tokenizer's files share: the loaded tokenizer, its tables (tok_map.c), the loader
 * (tok_load.c) and the encoder (tok_encode.c). */
#ifndef XPYD_TOK_INTERNAL_H
#define XPYD_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include "xpyd_tokenizer.h"

#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

/* bytes -> id, open addressing on xxh3 (keys kept in one arena) */
struct tok_slot {
    uint64_t h;
    uint32_t off, len;
    int32_t id; /* -1: empty */
};
struct tok_map {
    struct tok_slot *slots;
    size_t cap, n;
    char *arena;
    size_t alen, acap;
};
int tok_map_init(struct tok_map *m, size_t expect);
int tok_map_put(struct tok_map *m, const void *key, size_t len, int32_t id); /* 0, 1 if present (kept), -1 */
int32_t tok_map_get(const struct tok_map *m, const void *key, size_t len);   /* -1 if absent */
/* The same with the key's hash given (tok_map_hash), and prefetches: a table of a vocabulary's size is out of the
 * core's caches, so the loader asks for a batch of slots, then their keys' text, before it reads any (its lookups'
 * cache misses overlap instead of following one another) */
uint64_t tok_map_hash(const void *key, size_t len);
int tok_map_put_h(struct tok_map *m, const void *key, size_t len, uint64_t h, int32_t id);
int32_t tok_map_get_h(const struct tok_map *m, const void *key, size_t len, uint64_t h);
void tok_map_prefetch(const struct tok_map *m, uint64_t h);
void tok_map_prefetch_key(const struct tok_map *m, uint64_t h);
void tok_map_free(struct tok_map *m);

/* (left id, right id) -> (rank, merged id) */
struct tok_merge {
    uint64_t key; /* (left << 32 | right) + 1; 0: empty */
    uint32_t rank, id;
};
struct tok_merges {
    struct tok_merge *slots;
    size_t cap, n;
};
int tok_merges_init(struct tok_merges *m, size_t expect);
int tok_merges_put(struct tok_merges *m, uint32_t a, uint32_t b, uint32_t rank, uint32_t id);
void tok_merges_prefetch(const struct tok_merges *m, uint32_t a, uint32_t b);
/* The slot a pair's key starts at: Fibonacci hashing, the product's high bits (both ids mix into them; the table
 * is the model's, not the input's, so no input can crowd one run); inline, as the merge loop is BPE's hot path */
static inline size_t tok_merge_slot(uint64_t key, size_t cap)
{
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & (cap - 1);
}
static inline const struct tok_merge *tok_merges_get(const struct tok_merges *m, uint32_t a, uint32_t b)
{
    uint64_t key = ((uint64_t)a << 32 | b) + 1;
    for (size_t j = tok_merge_slot(key, m->cap); m->slots[j].key; j = (j + 1) & (m->cap - 1))
        if (m->slots[j].key == key)
            return &m->slots[j];
    return NULL;
}
void tok_merges_free(struct tok_merges *m);

enum tok_norm { TOK_NFC = 1, TOK_NFKC, TOK_NFD, TOK_NFKD, TOK_PREPEND, TOK_REPLACE };
enum tok_pre { TOK_PRE_SPLIT = 1, TOK_PRE_BYTELEVEL, TOK_PRE_METASPACE };
enum tok_prepend { TOK_PREPEND_NEVER, TOK_PREPEND_FIRST, TOK_PREPEND_ALWAYS }; /* Metaspace's prepend_scheme */
/* Split's behaviour: what becomes of the pattern's matches (Hugging Face's SplitDelimiterBehavior) */
enum tok_split { TOK_SPLIT_ISOLATED, TOK_SPLIT_REMOVED, TOK_SPLIT_MERGED_PREVIOUS, TOK_SPLIT_MERGED_NEXT,
                 TOK_SPLIT_CONTIGUOUS };

struct tok_norm_step {
    enum tok_norm type;
    char *a, *b; /* Prepend: a; Replace: every a by b */
    size_t alen, blen;
};

struct tok_pre_step {
    enum tok_pre type;
    pcre2_code *re; /* Split's pattern, or ByteLevel's GPT-2 regex when use_regex; NULL for none */
    int add_prefix_space;
    enum tok_split behavior;  /* Split's (ByteLevel's regex: Isolated) */
    int invert;               /* Split's invert: the stretches between matches are the matches */
    char rep[5];              /* Metaspace: its replacement character (UTF-8), how it prepends, whether it splits */
    size_t replen;
    enum tok_prepend prepend;
    int split;
};

struct xtok;
/* A normalized piece pre-tokenized (tok_pretok.c): its pieces, spans of text (the piece itself, or own: the text a
 * step rewrote, Metaspace's or ByteLevel's add_prefix_space). 0 or XTOK_ENOMEM; free with tok_pieces_free. */
struct tok_span {
    size_t off, len;
};
struct tok_pieces {
    const char *text;
    char *own;
    struct tok_span *v;
    size_t n;
};
int tok_pretokenize(const struct xtok *t, const char *text, size_t len, pcre2_match_data *md, int first,
                    struct tok_pieces *out);
void tok_pieces_free(struct tok_pieces *p);
int tok_normalize(const struct xtok *t, const char *text, size_t len, char **out, size_t *outlen); /* tok_encode.c */

struct tok_added {
    char *content;
    size_t len;
    char *pattern; /* what is matched: the content, or (normalized) the content through the model's normalizer, as
                    * Hugging Face matches a normalized token in the normalized text (Llama 2's "▁</s>") */
    size_t plen;
    uint32_t id;
    int special, normalized, lstrip, rstrip;
    int maximal; /* no other added token of its kind starts with it: where it matches, it is the longest match */
};

/* A byte trie of the added tokens of one kind: the longest one starting at a position is one walk down it */
struct tok_tnode {
    uint32_t child, sibling; /* node indexes; 0: none (the root, node 0, is no one's child) */
    int32_t added;           /* the token ending here (index in xtok.added), or -1 */
    unsigned char byte;
};

struct xtok {
    struct tok_map vocab;     /* byte-level models: the model's tokens as raw bytes (byte-level symbols decoded) */
    struct tok_map vocab_str; /* the model's tokens as written in tokenizer.json */
    struct tok_merges merges;
    int bytelevel;        /* a ByteLevel pre-tokenizer: symbols are bytes; else (SentencePiece-style) characters */
    int32_t byte_id[256]; /* byte-level: the token of each single byte; else byte_fallback's <0xXX> (or -1) */
    int32_t unk_id;       /* -1: none */
    int byte_fallback, fuse_unk;
    int ignore_merges;
    struct tok_norm_step norm[8];
    int nnorm;
    struct tok_pre_step pre[8];
    int npre;
    struct tok_added *added;
    size_t nadded;
    unsigned char added_first[2][256]; /* [normalized][byte]: an added token of that kind starts with it */
    int added_only[2];                 /* [normalized]: the one byte every such token starts with, else -1 */
    struct tok_tnode *trie[2];         /* [normalized] */
    size_t ntrie[2];
    uint32_t *prefix, *suffix; /* TemplateProcessing's single: ids around the sequence */
    size_t nprefix, nsuffix;
    size_t vocab_size;
    size_t model_entries; /* the model vocab's entries: where Hugging Face numbers added tokens from */
};

/* tok_mem.c: the cache entries' memory (an arena of huge pages under jemalloc, else malloc) */
void *tok_mem_alloc(size_t n);
void tok_mem_free(void *p);
/* tok_cache.c: a piece's key (tok_cache_key: what get and put take); the memory of up to TOK_PREFETCH_MAX pieces'
 * entries asked for at once, before their lookups; a piece's ids from the cache, appended to the array (v, n, cap:
 * grown with realloc): 1, or 0 when not there, -1 out of memory; keeping a piece's ids. A NULL cache holds
 * nothing. */
#define TOK_PREFETCH_MAX 16
#define TOK_PREFETCH_MIN 256 /* bytes: a shorter piece's entry is a line or two, not worth a lock to ask for */
struct xtok_cache;
uint64_t tok_cache_key(const struct xtok_cache *c, const char *text, size_t len);
void tok_cache_prefetch(struct xtok_cache *c, const uint64_t *keys, size_t n);
int tok_cache_get(struct xtok_cache *c, uint64_t key, const char *text, size_t len, uint32_t **v, size_t *n,
                  size_t *cap);
void tok_cache_put(struct xtok_cache *c, uint64_t key, const char *text, size_t len, const uint32_t *ids, size_t n);

/* GPT-2's map of bytes to printable code points (the byte-level alphabet) and back. */
void tok_bytes_to_unicode(uint32_t cp_of[256]);
/* A byte-level token's text back into raw bytes; -1 when a code point is not of the alphabet. */
long tok_bytelevel_decode(const char *s, size_t len, char *out);

/* tok_cfg.c: reading tokenizer.json (tok_load.c, tok_model.c) */
struct cJSON;
int tok_fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4))); /* -1, err set */
int tok_clip(const char *s, size_t len); /* how much of a file's string an error quotes (60 bytes, whole characters) */
const char *tok_str_of(const struct cJSON *o, const char *key);
int tok_bool_of(const struct cJSON *o, const char *key);
int tok_is_set(const struct cJSON *o, const char *key); /* present and neither null nor empty */
/* tok_model.c: the "model" (BPE: vocab and merges); t->bytelevel set before */
int tok_load_model(struct xtok *t, const struct cJSON *m, char *err, size_t errlen);
void tok_note_id(struct xtok *t, long id); /* the vocabulary's size grows to hold id */

#endif
