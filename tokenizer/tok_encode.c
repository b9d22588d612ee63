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
            uint64_t w; /* then 8 ASCII bytes at a time */
            while (i + 8 <= len && (memcpy(&w, s + i, 8), !(w & 0x8080808080808080ULL)))
                i += 8;
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

/* A binary min-heap of candidate merges by (rank, position): the lowest rank first, the leftmost among equals,
 * as Hugging Face's BPE does. A candidate is stale once either symbol has changed: checked when popped by looking
 * the pair at pos up again (a rank is one merge's, so the same rank is the same pair). 8 bytes a candidate: a
 * long piece (megabytes without a space, a SentencePiece text) holds up to two per byte. */
struct cand {
    uint32_t rank;
    int32_t pos;
};

static int cand_less(const struct cand *a, const struct cand *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(struct cand *h, size_t *n, struct cand c)
{
    size_t i = (*n)++;
    while (i && cand_less(&c, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = c;
}

static struct cand heap_pop(struct cand *h, size_t *n)
{
    struct cand top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && cand_less(&h[c + 1], &h[c]))
            c++;
        if (!cand_less(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n)
        h[i] = last;
    return top;
}

static void candidate(const struct xtok *t, struct cand *h, size_t *nh, const uint32_t *sym, int32_t i, int32_t j)
{
    const struct tok_merge *m = tok_merges_get(&t->merges, sym[i], sym[j]);
    if (m)
        heap_push(h, nh, (struct cand){m->rank, i});
}

/* BPE over n initial symbols (ids): merges applied lowest rank first, the leftmost among equals, until no
 * adjacent pair has one. Short pieces scan for the best pair; long ones (a whole SentencePiece text, a long
 * whitespace run) use the heap: O(n log n). */
static int bpe_merge(const struct xtok *t, uint32_t *sym, size_t n, struct ids *out)
{
    int32_t stack_next[64], stack_prev[64];
    uint32_t stack_rank[64], merged[64]; /* the pair at i: its rank, what it merges into */
    int small = n <= 64;
    int32_t *next = small ? stack_next : malloc(n * sizeof *next);
    int32_t *prev = small ? stack_prev : malloc(n * sizeof *prev);
    uint32_t *rank = small ? stack_rank : NULL;
    struct cand *h = small ? NULL : malloc(n * 2 * sizeof *h);
    int rc = 0;
    if (!next || !prev || (!small && !h)) {
        rc = XTOK_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        next[i] = i + 1 < n ? (int32_t)(i + 1) : -1;
        prev[i] = (int32_t)i - 1;
    }
    if (small) {
        for (size_t i = 0; i < n; i++) {
            const struct tok_merge *m = i + 1 < n ? tok_merges_get(&t->merges, sym[i], sym[i + 1]) : NULL;
            rank[i] = m ? m->rank : UINT32_MAX;
            merged[i] = m ? m->id : 0;
        }
        for (;;) {
            uint32_t best = UINT32_MAX;
            int32_t bi = -1;
            for (int32_t i = 0; i >= 0; i = next[i])
                if (rank[i] < best) {
                    best = rank[i];
                    bi = i;
                }
            if (bi < 0)
                break;
            int32_t j = next[bi];
            sym[bi] = merged[bi];
            next[bi] = next[j];
            if (next[bi] >= 0)
                prev[next[bi]] = bi;
            const struct tok_merge *m = next[bi] >= 0 ? tok_merges_get(&t->merges, sym[bi], sym[next[bi]]) : NULL;
            rank[bi] = m ? m->rank : UINT32_MAX;
            merged[bi] = m ? m->id : 0;
            if (prev[bi] >= 0) {
                m = tok_merges_get(&t->merges, sym[prev[bi]], sym[bi]);
                rank[prev[bi]] = m ? m->rank : UINT32_MAX;
                merged[prev[bi]] = m ? m->id : 0;
            }
        }
    } else {
        size_t nh = 0;
        for (size_t i = 0; i + 1 < n; i++)
            candidate(t, h, &nh, sym, (int32_t)i, (int32_t)i + 1);
        while (nh) {
            struct cand c = heap_pop(h, &nh);
            int32_t i = c.pos, j = next[i];
            if (j < 0 || prev[i] == -2)
                continue; /* stale: gone, or nothing after it any more */
            const struct tok_merge *m = tok_merges_get(&t->merges, sym[i], sym[j]);
            if (!m || m->rank != c.rank)
                continue; /* stale: a symbol of the pair has merged since */
            sym[i] = m->id;
            next[i] = next[j];
            if (next[i] >= 0)
                prev[next[i]] = i;
            prev[j] = -2; /* gone */
            if (prev[i] >= 0)
                candidate(t, h, &nh, sym, prev[i], i);
            if (next[i] >= 0)
                candidate(t, h, &nh, sym, i, next[i]);
        }
    }
    for (int32_t i = 0; i >= 0 && !rc; i = next[i])
        rc = push(out, sym[i]);
out:
    if (!small) {
        free(next);
        free(prev);
        free(h);
    }
    return rc;
}

/* One piece through the model: its initial symbols (bytes, or characters with byte fallback and unknowns),
 * then the merges. */
static int bpe(const struct xtok *t, const unsigned char *p, size_t n, struct ids *out)
{
    if (n == 0)
        return 0;
    if (t->bytelevel && n == 1)
        return push(out, (uint32_t)t->byte_id[p[0]]);
    if (t->ignore_merges) {
        int32_t id = tok_map_get(t->bytelevel ? &t->vocab : &t->vocab_str, p, n);
        if (id >= 0)
            return push(out, (uint32_t)id);
    }
    uint32_t stack_sym[64];
    uint32_t *sym = n <= 64 ? stack_sym : malloc(n * sizeof *sym);
    if (!sym)
        return XTOK_ENOMEM;
    size_t ns = 0;
    int rc = 0;
    if (t->bytelevel) {
        for (size_t i = 0; i < n; i++)
            sym[ns++] = (uint32_t)t->byte_id[p[i]];
    } else {
        int last_unk = 0;
        for (size_t i = 0; i < n;) { /* one character at a time (the input is valid UTF-8) */
            size_t l = p[i] < 0x80 ? 1 : (p[i] & 0xE0) == 0xC0 ? 2 : (p[i] & 0xF0) == 0xE0 ? 3 : 4;
            int32_t id = tok_map_get(&t->vocab_str, p + i, l);
            int fallback = id < 0 && t->byte_fallback;
            for (size_t k = 0; fallback && k < l; k++)
                fallback = t->byte_id[p[i + k]] >= 0;
            if (id >= 0) {
                sym[ns++] = (uint32_t)id;
                last_unk = 0;
            } else if (fallback) {
                for (size_t k = 0; k < l; k++)
                    sym[ns++] = (uint32_t)t->byte_id[p[i + k]];
                last_unk = 0;
            } else if (t->unk_id >= 0) {
                if (!(t->fuse_unk && last_unk))
                    sym[ns++] = (uint32_t)t->unk_id;
                last_unk = 1;
            } /* no unk token: the character is dropped, as Hugging Face does */
            i += l;
        }
    }
    if (ns)
        rc = bpe_merge(t, sym, ns, out);
    if (n > 64)
        free(sym);
    return rc;
}

/* A normalized piece: pre-tokenized (tok_pretok.c), each piece through the model. first: it starts the input (no
 * added token before it), which Metaspace's prepend_scheme "first" asks. */
static int encode_normalized(const struct xtok *t, const char *text, size_t len, pcre2_match_data *md,
                             struct ids *out, int first)
{
    struct tok_pieces pc;
    int rc = tok_pretokenize(t, text, len, md, first, &pc);
    for (size_t i = 0; i < pc.n && !rc; i++)
        rc = bpe(t, (const unsigned char *)pc.text + pc.v[i].off, pc.v[i].len, out);
    tok_pieces_free(&pc);
    return rc;
}

/* The length of the white space character (Unicode White_Space, what Rust's regex \s takes: Hugging Face's
 * lstrip/rstrip) starting at p, or ending at p (before: p is its end), 0 for none */
static size_t space_at(const unsigned char *p, size_t left)
{
    if (left >= 1 && ((*p >= 0x09 && *p <= 0x0d) || *p == ' '))
        return 1;
    if (left >= 2 && p[0] == 0xc2 && (p[1] == 0x85 || p[1] == 0xa0))
        return 2;
    if (left < 3)
        return 0;
    if ((p[0] == 0xe1 && p[1] == 0x9a && p[2] == 0x80) || (p[0] == 0xe3 && p[1] == 0x80 && p[2] == 0x80) ||
        (p[0] == 0xe2 && p[1] == 0x80 &&
         ((p[2] >= 0x80 && p[2] <= 0x8a) || p[2] == 0xa8 || p[2] == 0xa9 || p[2] == 0xaf)) ||
        (p[0] == 0xe2 && p[1] == 0x81 && p[2] == 0x9f))
        return 3;
    return 0;
}

static size_t space_before(const unsigned char *text, size_t at)
{
    for (size_t l = 1; l <= 3 && l <= at; l++)
        if (space_at(text + at - l, l) == l)
            return l;
    return 0;
}

/* The leftmost, then longest, added token of the given kind (normalized or not) in text; its extent with
 * lstrip/rstrip's whitespace in *ms..*me. */
#define ADDED_MRU 4

/* The tokens an encode matched last: a template repeats a few (`<|eot_id|>`, `<|start_header_id|>`), and one that no
 * other token extends is the longest match wherever it matches - a memcmp instead of a walk down the trie. */
static const struct tok_added *recent_match(const struct tok_added *const *mru, const char *p, size_t left)
{
    for (int k = 0; k < ADDED_MRU && mru[k]; k++)
        if (mru[k]->maximal && mru[k]->plen <= left && !memcmp(mru[k]->pattern, p, mru[k]->plen))
            return mru[k];
    return NULL;
}

static void remember_match(const struct tok_added **mru, const struct tok_added *a)
{
    int k = 0;
    while (k < ADDED_MRU - 1 && mru[k] && mru[k] != a)
        k++;
    memmove(mru + 1, mru, (size_t)k * sizeof *mru);
    mru[0] = a;
}

static const struct tok_added *find_added(const struct xtok *t, int normalized, const char *text, size_t len,
                                          const struct tok_added **mru, size_t *ms, size_t *me)
{
    int only = t->added_only[normalized];
    if (only == -2)
        return NULL;
    for (size_t i = 0; i < len; i++) {
        if (only >= 0) { /* every added token starts with the same byte: memchr finds the candidates */
            const char *p = memchr(text + i, only, len - i);
            if (!p)
                return NULL;
            i = (size_t)(p - text);
        } else if (!t->added_first[normalized][(unsigned char)text[i]]) {
            continue;
        }
        /* the longest token starting at i: one seen lately, else one walk down the trie */
        const struct tok_added *best = recent_match(mru, text + i, len - i);
        const struct tok_tnode *nd = t->trie[normalized];
        for (size_t j = i, cur = 0, walk = !best; walk && j < len; j++) {
            uint32_t ch = nd[cur].child;
            while (ch && nd[ch].byte != (unsigned char)text[j])
                ch = nd[ch].sibling;
            if (!ch)
                break;
            cur = ch;
            if (nd[cur].added >= 0)
                best = &t->added[nd[cur].added];
        }
        if (best) {
            remember_match(mru, best);
            const unsigned char *u = (const unsigned char *)text;
            size_t s = i, e = i + best->plen, l;
            if (best->lstrip)
                while ((l = space_before(u, s)))
                    s -= l;
            if (best->rstrip)
                while ((l = space_at(u + e, len - e)))
                    e += l;
            *ms = s;
            *me = e;
            return best;
        }
    }
    return NULL;
}

/* NFC/NFKC/NFD/NFKD of text (*o malloc'd; 0 and nothing made when text is ASCII throughout). ASCII characters
 * are starters nothing composes onto, in every form, so the text splits before each one: only what lies between
 * long ASCII stretches goes through utf8proc (with the ASCII character before it, which a following combining
 * mark may compose with), the stretches are copied - English and code with a few non-ASCII characters are not
 * normalized whole (a third of Qwen's encoding time on such text). */
#define NF_ASCII_RUN 64 /* shorter ASCII stretches go through utf8proc with their neighbours (one call) */
static int unicode_normal_form(enum tok_norm type, const char *s, size_t len, char **o, size_t *olen)
{
    static const int opts[] = {0, UTF8PROC_COMPOSE, UTF8PROC_COMPOSE | UTF8PROC_COMPAT, UTF8PROC_DECOMPOSE,
                               UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT};
    const unsigned char *p = (const unsigned char *)s;
    size_t first = 0;
    while (first < len && p[first] < 0x80)
        first++;
    if (first == len)
        return 0;
    char *out = NULL;
    size_t n = 0, cap = 0;
    for (size_t i = 0; i < len;) {
        size_t j = i ? i : first; /* (the leading ASCII was just read) */
        while (j < len && p[j] < 0x80)
            j++;
        size_t from = j > i ? j - 1 : j, k = j; /* the ASCII character before the run goes with it */
        if (j == len)
            from = len;
        for (;;) { /* the run, and what follows it up to an ASCII stretch of NF_ASCII_RUN bytes (or the end) */
            while (k < len && p[k] >= 0x80)
                k++;
            size_t a = k;
            while (a < len && p[a] < 0x80 && a - k < NF_ASCII_RUN)
                a++;
            if (a == len || a - k >= NF_ASCII_RUN)
                break;
            k = a;
        }
        unsigned char *u = NULL;
        utf8proc_ssize_t r = 0;
        if (k > from) {
            r = utf8proc_map(p + from, (utf8proc_ssize_t)(k - from), &u,
                             (utf8proc_option_t)(UTF8PROC_STABLE | opts[type]));
            if (r < 0) {
                free(out);
                return r == UTF8PROC_ERROR_NOMEM ? XTOK_ENOMEM : XTOK_EINVAL;
            }
        }
        size_t need = n + (from - i) + (size_t)r + 1;
        if (need > cap) {
            size_t nc = cap ? cap : len + len / 4 + 16;
            while (nc < need)
                nc *= 2;
            char *no = realloc(out, nc);
            if (!no) {
                free(out);
                free(u);
                return XTOK_ENOMEM;
            }
            out = no;
            cap = nc;
        }
        memcpy(out + n, p + i, from - i);
        n += from - i;
        if (r > 0)
            memcpy(out + n, u, (size_t)r);
        n += (size_t)r;
        free(u);
        i = k > from ? k : len;
    }
    *o = out;
    *olen = n;
    return 1;
}

/* The model's normalizer over text: *out the result (malloc'd; NULL when no step changed anything: text as it is) */
int tok_normalize(const struct xtok *t, const char *text, size_t len, char **out, size_t *outlen)
{
    char *norm = NULL;
    const char *s = text;
    *out = NULL;
    *outlen = len;
    for (int k = 0; k < t->nnorm; k++) {
        const struct tok_norm_step *st = &t->norm[k];
        char *o = NULL;
        size_t olen = 0;
        if (st->type == TOK_PREPEND) {
            if (!len)
                continue;
            o = malloc(st->alen + len + 1);
            if (o) {
                memcpy(o, st->a, st->alen);
                memcpy(o + st->alen, s, len);
                olen = st->alen + len;
            }
        } else if (st->type == TOK_REPLACE) {
            size_t count = 0;
            for (const char *q = s; (q = memmem(q, len - (size_t)(q - s), st->a, st->alen)); q += st->alen)
                count++;
            olen = len + count * st->blen - count * st->alen;
            o = malloc(olen + 1);
            for (size_t i = 0, w = 0; o && i < len;) {
                if (len - i >= st->alen && !memcmp(s + i, st->a, st->alen)) {
                    memcpy(o + w, st->b, st->blen);
                    w += st->blen;
                    i += st->alen;
                } else {
                    o[w++] = s[i++];
                }
            }
        } else {
            int r = unicode_normal_form(st->type, s, len, &o, &olen);
            if (r < 0) {
                free(norm);
                return r;
            }
            if (r == 0) /* already in that form: ASCII throughout */
                continue;
        }
        free(norm);
        if (!o)
            return XTOK_ENOMEM;
        norm = o;
        s = o;
        len = olen;
    }
    *out = norm;
    *outlen = len;
    return 0;
}

static int encode_raw_piece(const struct xtok *t, const char *text, size_t len, pcre2_match_data *md,
                            struct ids *out, int first)
{
    char *norm;
    int rc = tok_normalize(t, text, len, &norm, &len);
    if (rc)
        return rc;
    const char *s = norm ? norm : text;
    const struct tok_added *mru[ADDED_MRU] = {0};
    while (len && !rc) { /* the tokens matched in the normalized text */
        size_t ms, me;
        const struct tok_added *a = find_added(t, 1, s, len, mru, &ms, &me);
        if (!a) {
            rc = encode_normalized(t, s, len, md, out, first);
            break;
        }
        rc = encode_normalized(t, s, ms, md, out, first);
        rc = rc ? rc : push(out, a->id);
        first = 0;
        s += me;
        len -= me;
    }
    free(norm);
    return rc;
}

/* A piece between added tokens: from the cache when it holds it, else encoded (and kept there; key: its cache key).
 * first: the input's first piece, encoded apart from the cache where Metaspace prepends to that piece alone (its
 * ids depend on it). */
static int encode_piece(const struct xtok *t, struct xtok_cache *c, uint64_t key, const char *text, size_t len,
                        pcre2_match_data *md, struct ids *out, int first)
{
    if (first && t->npre && t->pre[0].type == TOK_PRE_METASPACE && t->pre[0].prepend == TOK_PREPEND_FIRST)
        c = NULL;
    size_t start = out->n;
    int rc = tok_cache_get(c, key, text, len, &out->v, &out->n, &out->cap);
    if (rc) /* a piece with these bytes was valid UTF-8 when it was kept */
        return rc < 0 ? XTOK_ENOMEM : 0;
    if (!valid_utf8((const unsigned char *)text, len))
        return XTOK_EINVAL;
    rc = encode_raw_piece(t, text, len, md, out, first);
    if (!rc && c && out->v) /* (an empty piece leaves out->v NULL: no pointer arithmetic on it) */
        tok_cache_put(c, key, text, len, out->v + start, out->n - start);
    return rc;
}

int xtok_encode(const struct xtok *t, const char *text, size_t len, int add_special, uint32_t **ids, size_t *n)
{
    return xtok_encode_cached(t, NULL, text, len, add_special, ids, n);
}

int xtok_encode_cached(const struct xtok *t, struct xtok_cache *cache, const char *text, size_t len, int add_special,
                       uint32_t **ids, size_t *n)
{
    *ids = NULL;
    *n = 0;
    /* UTF-8 is checked piece by piece (encode_piece): the added tokens matched between them are valid UTF-8, and a
     * piece the cache holds was checked when it was kept, so a cached conversation is not read twice */
    struct ids out = {0};
    /* room for a token per 4 bytes (English runs 4-5 bytes a token): a long prompt's ids grow without copies */
    out.cap = len / 4 + 16;
    out.v = malloc(out.cap * sizeof *out.v);
    pcre2_match_data *md = out.v ? pcre2_match_data_create(1, NULL) : NULL;
    if (!md) {
        free(out.v);
        return XTOK_ENOMEM;
    }
    int rc = 0;
    if (add_special)
        for (size_t i = 0; i < t->nprefix && !rc; i++)
            rc = push(&out, t->prefix[i]);
    const struct tok_added *mru[ADDED_MRU] = {0};
    int first = 1; /* the piece at the input's start */
    while (len && !rc) { /* the tokens matched in the raw text, TOK_PREFETCH_MAX at a time: */
        /* where the next pieces are (piece k: from cut k-1's end, or 0, to cut k's start; a cut without a token
         * ends the text), and their entries asked of the cache together (tok_cache_prefetch) */
        struct {
            size_t ms, me;
            const struct tok_added *a;
        } cut[TOK_PREFETCH_MAX];
        uint64_t key[TOK_PREFETCH_MAX], far[TOK_PREFETCH_MAX]; /* far: the keys of pieces worth asking for */
        size_t nc = 0, nfar = 0, off = 0;
        while (nc < TOK_PREFETCH_MAX && off < len) {
            size_t ms, me;
            const struct tok_added *a = find_added(t, 0, text + off, len - off, mru, &ms, &me);
            cut[nc].a = a;
            cut[nc].ms = a ? off + ms : len;
            cut[nc].me = a ? off + me : len;
            key[nc] = tok_cache_key(cache, text + off, cut[nc].ms - off);
            if (cut[nc].ms - off >= TOK_PREFETCH_MIN)
                far[nfar++] = key[nc];
            off = cut[nc++].me;
        }
        tok_cache_prefetch(cache, far, nfar);
        off = 0;
        for (size_t k = 0; k < nc && !rc; k++) {
            if (cut[k].ms > off) /* (tokens side by side: no piece between them) */
                rc = encode_piece(t, cache, key[k], text + off, cut[k].ms - off, md, &out, first);
            first = 0;
            if (!rc && cut[k].a)
                rc = push(&out, cut[k].a->id);
            off = cut[k].me;
        }
        text += off;
        len -= off;
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

size_t xtok_truncate_left(const struct xtok *t, uint32_t *ids, size_t n, size_t max_len, int add_special)
{
    size_t pre = add_special ? t->nprefix : 0, suf = add_special ? t->nsuffix : 0;
    if (n <= max_len || n < pre + suf)
        return n;
    size_t content = n - pre - suf, keep = max_len > pre + suf ? max_len - pre - suf : 0;
    memmove(ids + pre, ids + pre + (content - keep), (keep + suf) * sizeof *ids);
    return pre + keep + suf;
}
