/* SPDX-License-Identifier: Apache-2.0 */
/* tok_pretok.c - pre-tokenization, Hugging Face's order: a normalized piece cut by each pre-tokenizer in turn
 * (every piece a step made cut again by the next): Metaspace first, Splits (each behaviour, inverted or not) and
 * Digits by their patterns, ByteLevel's add_prefix_space and its GPT-2 regex; the pieces then go to the model
 * (tok_encode.c). */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

struct spans {
    struct tok_span *v;
    size_t n, cap;
};

static int span_push(struct spans *s, size_t off, size_t len)
{
    if (!len)
        return 0;
    if (s->n == s->cap) {
        size_t c = s->cap ? s->cap * 2 : 32;
        struct tok_span *nv = realloc(s->v, c * sizeof *nv);
        if (!nv)
            return XTOK_ENOMEM;
        s->v = nv;
        s->cap = c;
    }
    s->v[s->n++] = (struct tok_span){off, len};
    return 0;
}

/* Hugging Face's NormalizedString::split, one stretch at a time: the stretches the pattern cuts the piece into
 * (matches and what lies between, `m` whether a match; flipped by invert) folded as the behaviour says - a piece
 * each (Isolated), matches dropped (Removed), a match joined to the stretch before it or after it
 * (MergedWithPrevious / MergedWithNext), alike neighbours joined (Contiguous). `cur` is the piece being built
 * (it may be empty: an empty match still separates its neighbours), pushed when the next one starts; empty pieces
 * are dropped, as PreTokenizedString::split drops them. */
struct split_fold {
    enum tok_split behavior;
    int have, prev_m;      /* cur holds a stretch; whether the last stretch was a match */
    size_t cs, ce;         /* cur */
    int carry;             /* MergedWithNext: a match waiting for the stretch after it */
    size_t carry_s, carry_e;
};

static int fold_add(struct split_fold *f, size_t s, size_t e, int m, struct spans *out)
{
    int join = 0;
    switch (f->behavior) {
    case TOK_SPLIT_REMOVED:
        return m ? 0 : span_push(out, s, e - s);
    case TOK_SPLIT_ISOLATED:
        return span_push(out, s, e - s);
    case TOK_SPLIT_MERGED_NEXT:
        if (m) { /* alone if the next stretch is a match too (or none follows) */
            int rc = f->carry ? span_push(out, f->carry_s, f->carry_e - f->carry_s) : 0;
            f->carry = 1;
            f->carry_s = s;
            f->carry_e = e;
            return rc;
        }
        if (f->carry) {
            f->carry = 0;
            return span_push(out, f->carry_s, e - f->carry_s);
        }
        return span_push(out, s, e - s);
    case TOK_SPLIT_MERGED_PREVIOUS:
        join = m && !f->prev_m && f->have;
        break;
    case TOK_SPLIT_CONTIGUOUS:
        join = f->have && m == f->prev_m;
        break;
    }
    f->prev_m = m;
    if (join) {
        f->ce = e;
        return 0;
    }
    int rc = f->have ? span_push(out, f->cs, f->ce - f->cs) : 0;
    f->have = 1;
    f->cs = s;
    f->ce = e;
    return rc;
}

static int fold_end(struct split_fold *f, struct spans *out)
{
    if (f->carry)
        return span_push(out, f->carry_s, f->carry_e - f->carry_s);
    return f->have ? span_push(out, f->cs, f->ce - f->cs) : 0;
}

/* A Split (or ByteLevel's regex, Isolated): the matches found as Hugging Face's onig find_iter finds them - an
 * empty match is one too (it cuts the text there), except one where the last match ended, after which the search
 * goes on a character later. */
static int split_by(const struct tok_pre_step *step, pcre2_match_data *md, const char *text, struct tok_span in,
                    struct spans *out)
{
    PCRE2_SPTR subj = (PCRE2_SPTR)(text + in.off);
    struct split_fold f = {.behavior = step->behavior};
    size_t pos = 0, prev = 0, last_end = (size_t)-1;
    int inv = step->invert, rc = 0;
    while (pos <= in.len && !rc) {
        /* the text was checked as UTF-8 once (xtok_encode): checking it again at every match is O(n) each */
        int n = pcre2_match(step->re, subj, in.len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (n == PCRE2_ERROR_NOMATCH)
            break;
        if (n < 0)
            return XTOK_ENOMEM; /* a resource limit of the regex engine */
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t s = ov[0], e = ov[1];
        if (e == s && e == last_end) { /* go on from the next character */
            pos++;
            while (pos < in.len && (subj[pos] & 0xC0) == 0x80)
                pos++;
            continue;
        }
        if (prev != s)
            rc = fold_add(&f, in.off + prev, in.off + s, inv, out);
        if (!rc)
            rc = fold_add(&f, in.off + s, in.off + e, !inv, out);
        prev = pos = last_end = e;
    }
    if (!rc && prev != in.len)
        rc = fold_add(&f, in.off + prev, in.off + in.len, inv, out);
    return rc ? rc : fold_end(&f, out);
}

/* Metaspace (the first pre-tokenizer when there is one): spaces become the replacement, which is prepended (always,
 * or only to the input's first piece: `first`) unless the piece starts with it; split (MergedWithNext) before each
 * replacement. *buf: the new text (malloc'd). */
static int metaspace(const struct tok_pre_step *m, const char *text, size_t len, int first, char **buf,
                     size_t *blen, struct spans *a)
{
    size_t spaces = 0;
    for (size_t i = 0; i < len; i++)
        spaces += text[i] == ' ';
    char *o = malloc(m->replen + len + spaces * m->replen + 1);
    if (!o)
        return XTOK_ENOMEM;
    size_t w = 0;
    int starts = len && (text[0] == ' ' || (len >= m->replen && !memcmp(text, m->rep, m->replen)));
    if (len && !starts && (m->prepend == TOK_PREPEND_ALWAYS || (m->prepend == TOK_PREPEND_FIRST && first))) {
        memcpy(o, m->rep, m->replen);
        w = m->replen;
    }
    for (size_t i = 0; i < len; i++)
        if (text[i] == ' ') {
            memcpy(o + w, m->rep, m->replen);
            w += m->replen;
        } else {
            o[w++] = text[i];
        }
    *buf = o;
    *blen = w;
    if (!m->split)
        return span_push(a, 0, w);
    size_t from = 0;
    for (size_t i = 0; i + m->replen <= w; i++)
        if (i > from && !memcmp(o + i, m->rep, m->replen)) {
            if (span_push(a, from, i - from))
                return XTOK_ENOMEM;
            from = i;
        }
    return span_push(a, from, w - from);
}

/* ByteLevel's add_prefix_space: a space before each piece that does not start with one, the pieces rewritten into
 * a new text (*buf, malloc'd) */
static int prefix_spaces(const char *text, struct spans *a, char **buf)
{
    size_t need = 1;
    for (size_t i = 0; i < a->n; i++)
        need += a->v[i].len + 1;
    char *o = malloc(need);
    if (!o)
        return XTOK_ENOMEM;
    size_t w = 0;
    for (size_t i = 0; i < a->n; i++) {
        size_t off = w;
        if (text[a->v[i].off] != ' ')
            o[w++] = ' ';
        memcpy(o + w, text + a->v[i].off, a->v[i].len);
        w += a->v[i].len;
        a->v[i] = (struct tok_span){off, w - off};
    }
    *buf = o;
    return 0;
}

int tok_pretokenize(const struct xtok *t, const char *text, size_t len, pcre2_match_data *md, int first,
                    struct tok_pieces *out)
{
    struct spans a = {0}, b = {0};
    char *own = NULL;
    int rc;
    if (t->npre && t->pre[0].type == TOK_PRE_METASPACE) {
        rc = metaspace(&t->pre[0], text, len, first, &own, &len, &a);
        text = own;
    } else {
        rc = span_push(&a, 0, len);
    }
    for (int k = 0; k < t->npre && !rc; k++) {
        if (t->pre[k].add_prefix_space) {
            char *o = NULL;
            rc = prefix_spaces(text, &a, &o);
            free(own);
            text = own = o;
        }
        if (!t->pre[k].re || rc)
            continue;
        b.n = 0;
        for (size_t i = 0; i < a.n && !rc; i++)
            rc = split_by(&t->pre[k], md, text, a.v[i], &b);
        struct spans tmp = a;
        a = b;
        b = tmp;
    }
    free(b.v);
    *out = (struct tok_pieces){.text = text, .own = own, .v = a.v, .n = rc ? 0 : a.n};
    return rc;
}

void tok_pieces_free(struct tok_pieces *p)
{
    free(p->v);
    free(p->own);
}
