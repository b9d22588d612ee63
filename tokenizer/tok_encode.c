/* SPDX-License-Identifier: Apache-2.0 */
/* tok_encode.c - text to ids, in Hugging Face `tokenizers`' order: added tokens split out of the raw text (those
 * with normalized=false), each remaining piece normalized and split again by the normalized added tokens, then
 * pre-tokenized (each step splitting every piece further), each piece run through byte-level BPE, and the
 * post-processor's special tokens around the whole when asked. */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

struct ids {
    uint32_t *v;
    size_t n, cap;
};

static int push(struct ids *o, uint32_t id)
{
    if (o->n == o->cap) {
        size_t c = o->cap ? o->cap * 2 : 64;
        uint32_t *nv = realloc(o->v, c * sizeof *nv);
        if (!nv)
            return XTOK_ENOMEM;
        o->v = nv;
        o->cap = c;
    }
    o->v[o->n++] = id;
    return 0;
}

static int valid_utf8(const unsigned char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        uint32_t cp, min;
        if ((c & 0xE0) == 0xC0)
            n = 2, cp = c & 0x1F, min = 0x80;
        else if ((c & 0xF0) == 0xE0)
            n = 3, cp = c & 0x0F, min = 0x800;
        else if ((c & 0xF8) == 0xF0)
            n = 4, cp = c & 0x07, min = 0x10000;
        else
            return 0;
        if (i + n > len)
            return 0;
        for (size_t k = 1; k < n; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
            cp = cp << 6 | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += n;
    }
    return 1;
}

/* Byte-level BPE of one piece: the lowest-ranked adjacent pair merged first (the leftmost among equals), until
 * no pair has a merge. rank[i] caches the rank of the pair starting at symbol i. */
static int bpe(const struct xtok *t, const unsigned char *p, size_t n, struct ids *out)
{
    if (n == 0)
        return 0;
    if (n == 1)
        return push(out, (uint32_t)t->byte_id[p[0]]);
    if (t->ignore_merges) {
        int32_t id = tok_map_get(&t->vocab, p, n);
        if (id >= 0)
            return push(out, (uint32_t)id);
    }
    uint32_t stack_sym[64], stack_rank[64];
    int32_t stack_next[64];
    uint32_t *sym = n <= 64 ? stack_sym : malloc(n * sizeof *sym);
    uint32_t *rank = n <= 64 ? stack_rank : malloc(n * sizeof *rank);
    int32_t *next = n <= 64 ? stack_next : malloc(n * sizeof *next);
    int rc = 0;
    if (!sym || !rank || !next) {
        rc = XTOK_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        sym[i] = (uint32_t)t->byte_id[p[i]];
        next[i] = i + 1 < n ? (int32_t)(i + 1) : -1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        const struct tok_merge *m = tok_merges_get(&t->merges, sym[i], sym[i + 1]);
        rank[i] = m ? m->rank : UINT32_MAX;
    }
    rank[n - 1] = UINT32_MAX;
    int32_t prev_of_best;
    for (;;) {
        uint32_t best = UINT32_MAX;
        int32_t bi = -1, prev = -1;
        prev_of_best = -1;
        for (int32_t i = 0; i >= 0; prev = i, i = next[i])
            if (rank[i] < best) {
                best = rank[i];
                bi = i;
                prev_of_best = prev;
            }
        if (bi < 0)
            break;
        int32_t j = next[bi];
        sym[bi] = tok_merges_get(&t->merges, sym[bi], sym[j])->id;
        next[bi] = next[j];
        const struct tok_merge *m = next[bi] >= 0 ? tok_merges_get(&t->merges, sym[bi], sym[next[bi]]) : NULL;
        rank[bi] = m ? m->rank : UINT32_MAX;
        if (prev_of_best >= 0) {
            m = tok_merges_get(&t->merges, sym[prev_of_best], sym[bi]);
            rank[prev_of_best] = m ? m->rank : UINT32_MAX;
        }
    }
    for (int32_t i = 0; i >= 0 && !rc; i = next[i])
        rc = push(out, sym[i]);
out:
    if (n > 64) {
        free(sym);
        free(rank);
        free(next);
    }
    return rc;
}

struct span {
    size_t off, len;
};
struct spans {
    struct span *v;
    size_t n, cap;
};

static int span_push(struct spans *s, size_t off, size_t len)
{
    if (!len)
        return 0;
    if (s->n == s->cap) {
        size_t c = s->cap ? s->cap * 2 : 32;
        struct span *nv = realloc(s->v, c * sizeof *nv);
        if (!nv)
            return XTOK_ENOMEM;
        s->v = nv;
        s->cap = c;
    }
    s->v[s->n++] = (struct span){off, len};
    return 0;
}

/* Split with behaviour Isolated: every match a piece, and every stretch between matches a piece. */
static int split_isolated(pcre2_code *re, pcre2_match_data *md, const char *text, struct span in, struct spans *out)
{
    PCRE2_SPTR subj = (PCRE2_SPTR)(text + in.off);
    size_t pos = 0, last = 0;
    while (pos < in.len) {
        int rc = pcre2_match(re, subj, in.len, pos, 0, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0)
            return XTOK_ENOMEM; /* a resource limit of the regex engine */
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t s = ov[0], e = ov[1];
        if (e == s) { /* an empty match: no piece; go on from the next character */
            pos = s + 1;
            while (pos < in.len && (subj[pos] & 0xC0) == 0x80)
                pos++;
            continue;
        }
        if (span_push(out, in.off + last, s - last) || span_push(out, in.off + s, e - s))
            return XTOK_ENOMEM;
        last = pos = e;
    }
    return span_push(out, in.off + last, in.len - last);
}

/* A normalized piece: pre-tokenized, each piece through the model. */
static int encode_normalized(const struct xtok *t, const char *text, size_t len, pcre2_match_data *md,
                             struct ids *out)
{
    struct spans a = {0}, b = {0};
    int rc = span_push(&a, 0, len);
    for (int k = 0; k < t->npre && !rc; k++) {
        if (!t->pre[k].re)
            continue;
        b.n = 0;
        for (size_t i = 0; i < a.n && !rc; i++)
            rc = split_isolated(t->pre[k].re, md, text, a.v[i], &b);
        struct spans tmp = a;
        a = b;
        b = tmp;
    }
    for (size_t i = 0; i < a.n && !rc; i++)
        rc = bpe(t, (const unsigned char *)text + a.v[i].off, a.v[i].len, out);
    free(a.v);
    free(b.v);
    return rc;
}

static int is_space(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* The leftmost, then longest, added token of the given kind (normalized or not) in text; its extent with
 * lstrip/rstrip's whitespace in *ms..*me. */
static const struct tok_added *find_added(const struct xtok *t, int normalized, const char *text, size_t len,
                                          size_t *ms, size_t *me)
{
    for (size_t i = 0; i < len; i++) {
        if (!t->added_first[normalized][(unsigned char)text[i]])
            continue;
        const struct tok_added *best = NULL;
        for (size_t k = 0; k < t->nadded; k++) {
            const struct tok_added *a = &t->added[k];
            if (a->normalized != normalized || a->len > len - i || (best && a->len <= best->len) ||
                a->content[0] != text[i] || memcmp(a->content, text + i, a->len))
                continue;
            best = a;
        }
        if (best) {
            size_t s = i, e = i + best->len;
            if (best->lstrip)
                while (s > 0 && is_space((unsigned char)text[s - 1]))
                    s--;
            if (best->rstrip)
                while (e < len && is_space((unsigned char)text[e]))
                    e++;
            *ms = s;
            *me = e;
            return best;
        }
    }
    return NULL;
}

static int encode_raw_piece(const struct xtok *t, const char *text, size_t len, pcre2_match_data *md,
                            struct ids *out)
{
    unsigned char *norm = NULL;
    const char *s = text;
    if (t->nnorm) {
        static const int opts[] = {0, UTF8PROC_COMPOSE, UTF8PROC_COMPOSE | UTF8PROC_COMPAT, UTF8PROC_DECOMPOSE,
                                   UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT};
        for (int k = 0; k < t->nnorm; k++) {
            unsigned char *o = NULL;
            utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &o,
                                              (utf8proc_option_t)(UTF8PROC_STABLE | opts[t->norm[k]]));
            free(norm);
            if (n < 0)
                return n == UTF8PROC_ERROR_NOMEM ? XTOK_ENOMEM : XTOK_EINVAL;
            norm = o;
            s = (const char *)o;
            len = (size_t)n;
        }
    }
    int rc = 0;
    while (len && !rc) { /* the tokens matched in the normalized text */
        size_t ms, me;
        const struct tok_added *a = find_added(t, 1, s, len, &ms, &me);
        if (!a) {
            rc = encode_normalized(t, s, len, md, out);
            break;
        }
        rc = encode_normalized(t, s, ms, md, out);
        rc = rc ? rc : push(out, a->id);
        s += me;
        len -= me;
    }
    free(norm);
    return rc;
}

int xtok_encode(const struct xtok *t, const char *text, size_t len, int add_special, uint32_t **ids, size_t *n)
{
    *ids = NULL;
    *n = 0;
    if (!valid_utf8((const unsigned char *)text, len))
        return XTOK_EINVAL;
    struct ids out = {0};
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!md)
        return XTOK_ENOMEM;
    int rc = 0;
    if (add_special)
        for (size_t i = 0; i < t->nprefix && !rc; i++)
            rc = push(&out, t->prefix[i]);
    while (len && !rc) { /* the tokens matched in the raw text */
        size_t ms, me;
        const struct tok_added *a = find_added(t, 0, text, len, &ms, &me);
        if (!a) {
            rc = encode_raw_piece(t, text, len, md, &out);
            break;
        }
        rc = encode_raw_piece(t, text, ms, md, &out);
        rc = rc ? rc : push(&out, a->id);
        text += me;
        len -= me;
    }
    if (add_special)
        for (size_t i = 0; i < t->nsuffix && !rc; i++)
            rc = push(&out, t->suffix[i]);
    pcre2_match_data_free(md);
    if (rc) {
        free(out.v);
        return rc;
    }
    *ids = out.v ? out.v : malloc(sizeof(uint32_t));
    if (!*ids)
        return XTOK_ENOMEM;
    *n = out.n;
    return 0;
}
