/* SPDX-License-Identifier: Apache-2.0 */
/* tok_model.c - tokenizer.json's "model" read into a struct xtok (tok_load.c reads the rest): a BPE model's
 * vocabulary and merges into the tables of tok_map.c, every part checked (what the encoder does not implement
 * fails here, naming it). */
#include "tok_internal.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tok_note_id(struct xtok *t, long id)
{
    if ((size_t)id + 1 > t->vocab_size)
        t->vocab_size = (size_t)id + 1;
}

/* *buf (of *cap bytes) made room for need bytes, doubling; -1 out of memory */
static int room(char **buf, size_t *cap, size_t need)
{
    if (need <= *cap && *buf)
        return 0;
    size_t c = *cap ? *cap : 4096;
    while (c < need)
        c *= 2;
    char *nb = realloc(*buf, c);
    if (!nb)
        return -1;
    *buf = nb;
    *cap = c;
    return 0;
}

/* The vocabulary, a batch at a time, as the merges below: its tokens' slots asked for before any is written. */
#define VOCAB_BATCH 32
struct vocab_batch {
    struct xtok *t;
    size_t k;
    struct {
        const char *s;
        size_t len, off; /* off: the token's bytes (byte-level) in bytes; len of them in n */
        long n;
        int32_t id;
        uint64_t h[2];
    } v[VOCAB_BATCH];
    char *bytes;
    size_t bn, bcap;
};

static int vocab_flush(struct vocab_batch *vb)
{
    struct xtok *t = vb->t;
    for (size_t i = 0; i < vb->k; i++) {
        vb->v[i].h[0] = tok_map_hash(vb->v[i].s, vb->v[i].len);
        tok_map_prefetch(&t->vocab_str, vb->v[i].h[0]);
        if (vb->v[i].n > 0) {
            vb->v[i].h[1] = tok_map_hash(vb->bytes + vb->v[i].off, (size_t)vb->v[i].n);
            tok_map_prefetch(&t->vocab, vb->v[i].h[1]);
        }
    }
    for (size_t i = 0; i < vb->k; i++) {
        long n = vb->v[i].n;
        if (tok_map_put_h(&t->vocab_str, vb->v[i].s, vb->v[i].len, vb->v[i].h[0], vb->v[i].id) < 0)
            return -1;
        if (n <= 0)
            continue; /* not of the byte-level alphabet (or not byte-level): reachable as an added token only */
        const char *buf = vb->bytes + vb->v[i].off;
        if (tok_map_put_h(&t->vocab, buf, (size_t)n, vb->v[i].h[1], vb->v[i].id) < 0)
            return -1;
        if (n == 1)
            t->byte_id[(unsigned char)buf[0]] = vb->v[i].id;
    }
    vb->k = 0;
    vb->bn = 0;
    return 0;
}

static int vocab_add(struct vocab_batch *vb, const char *s, int32_t id)
{
    struct xtok *t = vb->t;
    size_t len = strlen(s);
    tok_note_id(t, id);
    if (t->bytelevel && room(&vb->bytes, &vb->bcap, vb->bn + len))
        return -1;
    long n = t->bytelevel ? tok_bytelevel_decode(s, len, vb->bytes + vb->bn) : 0;
    vb->v[vb->k].s = s;
    vb->v[vb->k].len = len;
    vb->v[vb->k].off = vb->bn;
    vb->v[vb->k].n = n;
    vb->v[vb->k].id = id;
    vb->bn += n > 0 ? (size_t)n : 0;
    return ++vb->k == VOCAB_BATCH ? vocab_flush(vb) : 0;
}

/* The merges, a batch at a time: each looks up its two parts and what they join into in the vocabulary, and
 * is put in the merge table, in rank order (a repeated merge keeps its first rank). The tables are far larger than
 * the core's caches; one merge after the other, every lookup waits on its own cache misses. So a batch's slots
 * are asked for first, then the keys they lead to, then all are read (Llama 3's 280,000 merges: see
 * bench/journal/2026-12.md). The first failing merge in rank order is the one reported, as before. */
#define MERGE_BATCH 32
struct merge_batch {
    struct xtok *t;
    char *err;
    size_t errlen;
    uint32_t rank; /* of the next merge taken */
    size_t k;      /* merges pending */
    struct {
        const char *a, *b;
        size_t la, lb, off; /* off: its joined text's place in joined */
        uint64_t h[3];
        int32_t id[3];
    } m[MERGE_BATCH];
    char *joined;
    size_t jn, jcap;
};

static int merges_flush(struct merge_batch *mb)
{
    struct xtok *t = mb->t;
    const struct tok_map *v = &t->vocab_str;
    for (size_t i = 0; i < mb->k; i++) {
        mb->m[i].h[0] = tok_map_hash(mb->m[i].a, mb->m[i].la);
        mb->m[i].h[1] = tok_map_hash(mb->m[i].b, mb->m[i].lb);
        mb->m[i].h[2] = tok_map_hash(mb->joined + mb->m[i].off, mb->m[i].la + mb->m[i].lb);
        for (int j = 0; j < 3; j++)
            tok_map_prefetch(v, mb->m[i].h[j]);
    }
    for (size_t i = 0; i < mb->k; i++)
        for (int j = 0; j < 3; j++)
            tok_map_prefetch_key(v, mb->m[i].h[j]);
    uint32_t rank0 = mb->rank - (uint32_t)mb->k;
    for (size_t i = 0; i < mb->k; i++) {
        const char *a = mb->m[i].a, *b = mb->m[i].b;
        size_t la = mb->m[i].la, lb = mb->m[i].lb;
        int32_t ia = tok_map_get_h(v, a, la, mb->m[i].h[0]), ib = tok_map_get_h(v, b, lb, mb->m[i].h[1]);
        int32_t ij = tok_map_get_h(v, mb->joined + mb->m[i].off, la + lb, mb->m[i].h[2]);
        if (ia < 0 || ib < 0 || ij < 0) {
            const char *which = ia < 0 ? "its left part" : ib < 0 ? "its right part" : "what it joins into";
            return tok_fail(mb->err, mb->errlen, "model merges: item %u: %s is not in the vocab (%.*s%s + %.*s%s)",
                        rank0 + (uint32_t)i, which, tok_clip(a, la), a, (size_t)tok_clip(a, la) < la ? "..." : "",
                        tok_clip(b, lb), b, (size_t)tok_clip(b, lb) < lb ? "..." : "");
        }
        mb->m[i].id[0] = ia;
        mb->m[i].id[1] = ib;
        mb->m[i].id[2] = ij;
        tok_merges_prefetch(&t->merges, (uint32_t)ia, (uint32_t)ib);
    }
    for (size_t i = 0; i < mb->k; i++)
        if (tok_merges_put(&t->merges, (uint32_t)mb->m[i].id[0], (uint32_t)mb->m[i].id[1], rank0 + (uint32_t)i,
                           (uint32_t)mb->m[i].id[2]) < 0)
            return tok_fail(mb->err, mb->errlen, "out of memory");
    mb->k = 0;
    mb->jn = 0;
    return 0;
}

static int merges_add(struct merge_batch *mb, const char *a, size_t la, const char *b, size_t lb)
{
    if (room(&mb->joined, &mb->jcap, mb->jn + la + lb)) /* (no length limit: see tok_load_model) */
        return tok_fail(mb->err, mb->errlen, "out of memory");
    memcpy(mb->joined + mb->jn, a, la);
    memcpy(mb->joined + mb->jn + la, b, lb);
    mb->m[mb->k].a = a;
    mb->m[mb->k].b = b;
    mb->m[mb->k].la = la;
    mb->m[mb->k].lb = lb;
    mb->m[mb->k].off = mb->jn;
    mb->jn += la + lb;
    mb->rank++;
    return ++mb->k == MERGE_BATCH ? merges_flush(mb) : 0;
}

int tok_load_model(struct xtok *t, const cJSON *m, char *err, size_t errlen)
{
    const char *type = tok_str_of(m, "type");
    if (!type || strcmp(type, "BPE"))
        return tok_fail(err, errlen, "model %s is not supported", type ? type : "(without a type)");
    if (tok_is_set(m, "dropout"))
        return tok_fail(err, errlen, "model BPE with dropout is not supported");
    if (tok_is_set(m, "continuing_subword_prefix") || tok_is_set(m, "end_of_word_suffix"))
        return tok_fail(err, errlen, "model BPE with continuing_subword_prefix or end_of_word_suffix is not supported");
    t->byte_fallback = tok_bool_of(m, "byte_fallback");
    t->fuse_unk = tok_bool_of(m, "fuse_unk");
    if (t->bytelevel && t->byte_fallback)
        return tok_fail(err, errlen, "model BPE with byte_fallback and a ByteLevel pre_tokenizer is not supported");
    t->ignore_merges = tok_bool_of(m, "ignore_merges");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(m, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(m, "merges");
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges))
        return tok_fail(err, errlen, "model BPE without a vocab object and a merges array");
    size_t nv = (size_t)cJSON_GetArraySize(vocab), nm = (size_t)cJSON_GetArraySize(merges);
    t->model_entries = nv;
    if (tok_map_init(&t->vocab, nv) || tok_map_init(&t->vocab_str, nv) || tok_merges_init(&t->merges, nm))
        return tok_fail(err, errlen, "out of memory");
    for (int b = 0; b < 256; b++)
        t->byte_id[b] = -1;
    struct vocab_batch vb = {.t = t};
    const cJSON *it;
    int rc = 0;
    cJSON_ArrayForEach(it, vocab) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > 2147483647.0) {
            rc = tok_fail(err, errlen, "model vocab: %.*s has no valid id", tok_clip(it->string, strlen(it->string)),
                      it->string);
            break;
        }
        if (vocab_add(&vb, it->string, (int32_t)it->valuedouble)) {
            rc = tok_fail(err, errlen, "out of memory");
            break;
        }
    }
    if (!rc && vocab_flush(&vb))
        rc = tok_fail(err, errlen, "out of memory");
    free(vb.bytes);
    if (rc)
        return rc;
    for (int b = 0; b < 256 && t->bytelevel; b++)
        if (t->byte_id[b] < 0)
            return tok_fail(err, errlen, "model BPE: byte 0x%02x has no token (not a byte-level vocabulary)", b);
    for (int b = 0; b < 256 && !t->bytelevel && t->byte_fallback; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_id[b] = tok_map_get(&t->vocab_str, name, strlen(name));
    }
    const char *unk = tok_str_of(m, "unk_token");
    t->unk_id = unk ? tok_map_get(&t->vocab_str, unk, strlen(unk)) : -1;
    if (unk && t->unk_id < 0)
        return tok_fail(err, errlen, "model BPE: unk_token %s is not in the vocab", unk);
    /* Hugging Face's model/bpe: merges as "left right" (exactly one space; lines starting "#version", from an
     * old merges.txt, skipped and not ranked) or [left, right]; both parts and what they join into in the vocab.
     * No length limit: a part may be as long as a token (Claude's file joins 1,024 spaces with 1,024). */
    struct merge_batch mb = {.t = t, .err = err, .errlen = errlen};
    cJSON_ArrayForEach(it, merges) {
        const char *a, *b;
        size_t la, lb;
        if (cJSON_IsString(it)) { /* "a b" */
            if (!strncmp(it->valuestring, "#version", 8))
                continue;
            const char *sp = strchr(it->valuestring, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                if (!(rc = merges_flush(&mb)))
                    rc = tok_fail(err, errlen, "model merges: item %u is not \"left right\" (one space): %.*s", mb.rank,
                              tok_clip(it->valuestring, strlen(it->valuestring)), it->valuestring);
                break;
            }
            la = (size_t)(sp - it->valuestring);
            lb = strlen(sp + 1);
            a = it->valuestring;
            b = sp + 1;
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
            a = cJSON_GetArrayItem(it, 0)->valuestring;
            b = cJSON_GetArrayItem(it, 1)->valuestring;
            la = strlen(a);
            lb = strlen(b);
        } else {
            if (!(rc = merges_flush(&mb)))
                rc = tok_fail(err, errlen, "model merges: item %u is neither \"left right\" nor [left, right]", mb.rank);
            break;
        }
        if ((rc = merges_add(&mb, a, la, b, lb)))
            break;
    }
    if (!rc)
        rc = merges_flush(&mb);
    free(mb.joined);
    return rc;
}
