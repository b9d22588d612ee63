/* SPDX-License-Identifier: Apache-2.0 */
/* tpl_str.c - Python's string operations for chat templates (tpl_internal.h): case mapping (Unicode, utf8proc),
 * str.title and jinja's title filter, strip with or without characters (Unicode whitespace as str.isspace),
 * split/rsplit with maxsplit, replace, startswith/endswith with tuples, find/rfind in code points, splitlines,
 * HTML escaping (jinja's escape filter) and json.dumps' ensure_ascii escaping. */
#include "tpl_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* memmem for a template's `in`, split, replace, count: the needle's first byte by memchr, then a compare (a long
 * message without '<' is passed over at memchr's speed, several times glibc's memmem for `'</think>' in content`);
 * after 16 false candidates the rest goes to memmem, so a hostile haystack of first bytes stays linear */
const char *ts_memmem(const char *h, size_t hn, const char *nd, size_t nn)
{
    if (!nn)
        return h;
    if (nn > hn)
        return NULL;
    const char *p = h, *last = h + hn - nn;
    for (int misses = 0; p <= last; p++) {
        p = memchr(p, nd[0], (size_t)(last - p) + 1);
        if (!p)
            return NULL;
        if (!memcmp(p + 1, nd + 1, nn - 1))
            return p;
        if (++misses > 16)
            return memmem(p + 1, (size_t)(h + hn - p - 1), nd, nn);
    }
    return NULL;
}

struct tv ts_map_case(struct tctx *c, struct tv s, case_fn f)
{
    struct tbuf b = {0};
    for (size_t i = 0; i < s.u.s.n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)s.u.s.p + i, (utf8proc_ssize_t)(s.u.s.n - i), &cp);
        if (l <= 0) {
            tb_put(c, &b, s.u.s.p + i, 1);
            i++;
            continue;
        }
        utf8proc_uint8_t o[4];
        utf8proc_ssize_t ol = utf8proc_encode_char(f(cp), o);
        tb_put(c, &b, (const char *)o, (size_t)ol);
        i += (size_t)l;
    }
    return tv_buf_str(&b);
}

int ts_is_cased(int32_t cp)
{
    utf8proc_category_t k = utf8proc_category(cp);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

/* Python's str.title(): a cased character after an uncased one is upper-cased, the others lower-cased */
struct tv ts_py_title(struct tctx *c, struct tv s)
{
    struct tbuf b = {0};
    int prev = 0;
    for (size_t i = 0; i < s.u.s.n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)s.u.s.p + i, (utf8proc_ssize_t)(s.u.s.n - i), &cp);
        if (l <= 0) {
            tb_put(c, &b, s.u.s.p + i++, 1);
            prev = 0;
            continue;
        }
        utf8proc_uint8_t o[4];
        utf8proc_int32_t m = prev ? utf8proc_tolower(cp) : utf8proc_totitle(cp);
        tb_put(c, &b, (const char *)o, (size_t)utf8proc_encode_char(m, o));
        prev = ts_is_cased(cp);
        i += (size_t)l;
    }
    return tv_buf_str(&b);
}

struct tv ts_capitalize(struct tctx *c, struct tv s)
{
    size_t first = u8_offset(s.u.s.p, s.u.s.n, 1);
    struct tv a = ts_map_case(c, tv_strref(s.u.s.p, first), utf8proc_toupper);
    struct tv b = ts_map_case(c, tv_strref(s.u.s.p + first, s.u.s.n - first), utf8proc_tolower);
    struct tbuf o = {0};
    tb_put(c, &o, a.u.s.p, a.u.s.n);
    tb_put(c, &o, b.u.s.p, b.u.s.n);
    return tv_buf_str(&o);
}

/* jinja's title filter: each word (split at runs of -, whitespace, brackets) upper-cased first, lower-cased rest */
struct tv ts_jinja_title(struct tctx *c, struct tv s)
{
    struct tbuf b = {0};
    int start = 1;
    for (size_t i = 0; i < s.u.s.n;) {
        size_t l;
        int sep = u8_is_space(s.u.s.p + i, s.u.s.n - i, &l) || (s.u.s.p[i] && strchr("-({[<", s.u.s.p[i]));
        struct tv ch = tv_strref(s.u.s.p + i, l);
        struct tv m = sep ? ch : ts_map_case(c, ch, start ? utf8proc_toupper : utf8proc_tolower);
        tb_put(c, &b, m.u.s.p, m.u.s.n);
        start = sep;
        i += l;
    }
    return tv_buf_str(&b);
}

/* Python's strip family; chars: NULL = whitespace */
struct tv ts_strip(struct tv s, const struct tv *chars, int left, int right)
{
    const char *p = s.u.s.p;
    size_t a = 0, b = s.u.s.n;
    for (;;) {
        if (!left || a >= b)
            break;
        size_t l;
        int hit = chars ? (l = u8_offset(p + a, b - a, 1), chars->u.s.n && memmem(chars->u.s.p, chars->u.s.n, p + a, l) != NULL)
                        : u8_is_space(p + a, b - a, &l);
        if (!hit)
            break;
        a += l;
    }
    while (right && b > a) {
        size_t st = b - 1;
        while (st > a && ((unsigned char)p[st] & 0xC0) == 0x80)
            st--;
        size_t l = b - st;
        int hit = chars ? chars->u.s.n && memmem(chars->u.s.p, chars->u.s.n, p + st, l) != NULL
                        : (u8_is_space(p + st, l, &l) && l == b - st);
        if (!hit)
            break;
        b = st;
    }
    return tv_strref(p + a, b - a);
}

/* Python's str.split / rsplit */
struct tv ts_split(struct tctx *c, struct tv s, struct tv sep, int64_t maxsplit, int from_right)
{
    struct tlist *out = tl_new(c, 8);
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    if (sep.t == TV_NONE || sep.t == TV_UNDEF) { /* runs of whitespace, none at either end */
        struct tlist *words = tl_new(c, 8);
        size_t i = 0, l;
        while (i < n) {
            while (i < n && u8_is_space(p + i, n - i, &l))
                i += l;
            if (i >= n)
                break;
            size_t st = i;
            while (i < n && !u8_is_space(p + i, n - i, &l))
                i += u8_offset(p + i, n - i, 1);
            tl_push(c, words, tv_strref(p + st, i - st));
        }
        if (maxsplit < 0 || (size_t)maxsplit + 1 >= words->n)
            return tv_list_of(c, words);
        /* a limited split keeps the rest of the text as its last piece */
        if (!from_right) {
            for (int64_t k = 0; k < maxsplit; k++)
                tl_push(c, out, words->v[k]);
            const char *rest = words->v[maxsplit].u.s.p;
            struct tv r = ts_strip(tv_strref(rest, (size_t)(p + n - rest)), NULL, 0, 1);
            tl_push(c, out, r);
        } else {
            size_t keep = words->n - (size_t)maxsplit;
            const char *end = words->v[keep - 1].u.s.p + words->v[keep - 1].u.s.n;
            tl_push(c, out, ts_strip(tv_strref(p, (size_t)(end - p)), NULL, 1, 0));
            for (size_t k = keep; k < words->n; k++)
                tl_push(c, out, words->v[k]);
        }
        return tv_list_of(c, out);
    }
    tv_need_str(c, sep, "split");
    if (!sep.u.s.n)
        tpl_fail(c, "empty separator");
    size_t cuts[4096], nc = 0;
    for (size_t i = 0; i + sep.u.s.n <= n;) {
        const char *m = ts_memmem(p + i, n - i, sep.u.s.p, sep.u.s.n);
        if (!m)
            break;
        if (nc == 4096)
            tpl_fail(c, "split: more than 4096 pieces");
        cuts[nc++] = (size_t)(m - p);
        i = (size_t)(m - p) + sep.u.s.n;
    }
    size_t from = 0, to = nc; /* the cuts used: rsplit keeps the last maxsplit, split the first */
    if (maxsplit >= 0 && (size_t)maxsplit < nc) {
        if (from_right)
            from = nc - (size_t)maxsplit;
        else
            to = (size_t)maxsplit;
    }
    size_t st = 0;
    for (size_t k = from; k < to; k++) {
        tl_push(c, out, tv_strref(p + st, cuts[k] - st));
        st = cuts[k] + sep.u.s.n;
    }
    tl_push(c, out, tv_strref(p + st, n - st));
    return tv_list_of(c, out);
}

struct tv ts_replace(struct tctx *c, struct tv s, struct tv old, struct tv new, int64_t count)
{
    tv_need_str(c, old, "replace");
    tv_need_str(c, new, "replace");
    struct tbuf b = {0};
    size_t i = 0;
    int64_t done = 0;
    if (!old.u.s.n) { /* Python inserts between characters */
        while (count < 0 || done < count) {
            tb_put(c, &b, new.u.s.p, new.u.s.n);
            done++;
            if (i >= s.u.s.n)
                break;
            size_t l = u8_offset(s.u.s.p + i, s.u.s.n - i, 1);
            tb_put(c, &b, s.u.s.p + i, l);
            i += l;
        }
        tb_put(c, &b, s.u.s.p + i, s.u.s.n - i);
        return tv_buf_str(&b);
    }
    while (count < 0 || done < count) {
        const char *m = i <= s.u.s.n ? ts_memmem(s.u.s.p + i, s.u.s.n - i, old.u.s.p, old.u.s.n) : NULL;
        if (!m)
            break;
        tb_put(c, &b, s.u.s.p + i, (size_t)(m - s.u.s.p) - i);
        tb_put(c, &b, new.u.s.p, new.u.s.n);
        i = (size_t)(m - s.u.s.p) + old.u.s.n;
        done++;
    }
    tb_put(c, &b, s.u.s.p + i, s.u.s.n - i);
    return tv_buf_str(&b);
}

int ts_prefix_match(struct tctx *c, struct tv s, struct tv x, int end)
{
    if (x.t == TV_LIST) {
        for (size_t i = 0; i < x.u.l->n; i++)
            if (ts_prefix_match(c, s, x.u.l->v[i], end))
                return 1;
        return 0;
    }
    tv_need_str(c, x, end ? "endswith" : "startswith");
    if (x.u.s.n > s.u.s.n)
        return 0;
    return !memcmp(s.u.s.p + (end ? s.u.s.n - x.u.s.n : 0), x.u.s.p, x.u.s.n);
}

struct tv ts_find(struct tv s, struct tv x, int last)
{
    if (x.u.s.n > s.u.s.n)
        return tv_int(-1);
    const char *hit = NULL;
    for (size_t i = 0; i + x.u.s.n <= s.u.s.n; i++)
        if (!memcmp(s.u.s.p + i, x.u.s.p, x.u.s.n)) {
            hit = s.u.s.p + i;
            if (!last)
                break;
        }
    return tv_int(hit ? (int64_t)u8_count(s.u.s.p, (size_t)(hit - s.u.s.p)) : -1);
}

/* str.ts_splitlines() */
struct tlist *ts_splitlines(struct tctx *c, struct tv s)
{
    struct tlist *out = tl_new(c, 8);
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, st = 0;
    for (size_t i = 0; i < n;) {
        size_t l = u8_offset(p + i, n - i, 1);
        int32_t cp = (unsigned char)p[i];
        if (l == 2 && (unsigned char)p[i] == 0xC2 && (unsigned char)p[i + 1] == 0x85)
            cp = 0x85;
        else if (l == 3 && !memcmp(p + i, "\xE2\x80\xA8", 3))
            cp = 0x2028;
        else if (l == 3 && !memcmp(p + i, "\xE2\x80\xA9", 3))
            cp = 0x2029;
        if (cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || (cp >= 0x1C && cp <= 0x1E) || cp == 0x85 ||
            cp == 0x2028 || cp == 0x2029) {
            tl_push(c, out, tv_strref(p + st, i - st));
            i += (cp == '\r' && i + 1 < n && p[i + 1] == '\n') ? 2 : l;
            st = i;
        } else {
            i += l;
        }
    }
    if (st < n)
        tl_push(c, out, tv_strref(p + st, n - st));
    return out;
}

struct tv ts_json_ascii(struct tctx *c, struct tbuf *b)
{
    struct tbuf o = {0};
    for (size_t i = 0; i < b->n;) {
        unsigned char ch = (unsigned char)b->p[i];
        if (ch < 0x80) {
            tb_put(c, &o, b->p + i++, 1);
            continue;
        }
        utf8proc_int32_t cp;
        utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)b->p + i, (utf8proc_ssize_t)(b->n - i), &cp);
        char e[16];
        if (cp >= 0x10000)
            snprintf(e, sizeof e, "\\u%04x\\u%04x", 0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF));
        else
            snprintf(e, sizeof e, "\\u%04x", (unsigned)cp);
        tb_put(c, &o, e, strlen(e));
        i += l > 0 ? (size_t)l : 1;
    }
    return tv_buf_str(&o);
}

struct tv ts_escape(struct tctx *c, struct tv s)
{
    struct tbuf b = {0};
    for (size_t i = 0; i < s.u.s.n; i++) {
        const char *e = NULL;
        switch (s.u.s.p[i]) {
        case '&': e = "&amp;"; break;
        case '<': e = "&lt;"; break;
        case '>': e = "&gt;"; break;
        case '"': e = "&#34;"; break;
        case '\'': e = "&#39;"; break;
        }
        if (e)
            tb_put(c, &b, e, strlen(e));
        else
            tb_put(c, &b, s.u.s.p + i, 1);
    }
    return tv_buf_str(&b);
}


/* ---- more str methods ---- */

static size_t need_width(struct tctx *c, const char *name, const struct tv *w)
{
    if (w->t != TV_INT && w->t != TV_BOOL)
        tpl_fail(c, "%s: '%s' object cannot be interpreted as an integer", name, tv_type_name(w));
    int64_t x = w->t == TV_INT ? w->u.i : w->u.b;
    if (x > 1000000)
        tpl_fail(c, "%s: a width beyond 1,000,000", name);
    return x < 0 ? 0 : (size_t)x;
}

static struct tv padded(struct tctx *c, struct tv self, size_t left, size_t right, const char *fill, size_t fl)
{
    struct tbuf b = {0};
    for (size_t k = 0; k < left; k++)
        tb_put(c, &b, fill, fl);
    tb_put(c, &b, self.u.s.p, self.u.s.n);
    for (size_t k = 0; k < right; k++)
        tb_put(c, &b, fill, fl);
    return tv_buf_str(&b);
}

struct tv ts_method(struct tctx *c, const char *n, struct tv self, struct tv *args, size_t nargs)
{
    size_t len = u8_count(self.u.s.p, self.u.s.n);
    if (!strcmp(n, "zfill") || !strcmp(n, "ljust") || !strcmp(n, "rjust") || !strcmp(n, "center")) {
        if (nargs < 1 || nargs > (n[0] == 'z' ? 1u : 2u))
            tpl_fail(c, "%s() takes %s argument(s) (%zu given)", n, n[0] == 'z' ? "exactly one" : "1 or 2", nargs);
        size_t w = need_width(c, n, &args[0]), marg = w > len ? w - len : 0;
        const char *fill = " ";
        size_t fl = 1;
        if (nargs > 1) {
            if (args[1].t != TV_STR || u8_count(args[1].u.s.p, args[1].u.s.n) != 1)
                tpl_fail(c, "The fill character must be exactly one character long");
            fill = args[1].u.s.p;
            fl = args[1].u.s.n;
        }
        if (n[0] == 'l')
            return padded(c, self, 0, marg, fill, fl);
        if (n[0] == 'r')
            return padded(c, self, marg, 0, fill, fl);
        if (n[0] == 'c') { /* Python's: the odd space goes left when the width is odd */
            size_t left = marg / 2 + (marg & w & 1);
            return padded(c, self, left, marg - left, fill, fl);
        }
        struct tbuf b = {0}; /* zfill: zeros after a leading sign */
        size_t s = self.u.s.n && (self.u.s.p[0] == '+' || self.u.s.p[0] == '-');
        tb_put(c, &b, self.u.s.p, s);
        for (size_t k = 0; k < marg; k++)
            tb_put(c, &b, "0", 1);
        tb_put(c, &b, self.u.s.p + s, self.u.s.n - s);
        return tv_buf_str(&b);
    }
    if (!strcmp(n, "partition") || !strcmp(n, "rpartition")) {
        if (nargs != 1)
            tpl_fail(c, "%s() takes exactly one argument (%zu given)", n, nargs);
        struct tv sep = tv_need_str(c, args[0], n);
        if (!sep.u.s.n)
            tpl_fail(c, "empty separator");
        struct tv at = ts_find(self, sep, n[0] == 'r');
        struct tlist *l = tl_new(c, 3);
        l->tuple = 1;
        if (at.u.i < 0) {
            struct tv e = tv_strref("", 0);
            tl_push(c, l, n[0] == 'r' ? e : self);
            tl_push(c, l, e);
            tl_push(c, l, n[0] == 'r' ? self : e);
        } else {
            size_t o = u8_offset(self.u.s.p, self.u.s.n, (size_t)at.u.i);
            tl_push(c, l, tv_strref(self.u.s.p, o));
            tl_push(c, l, sep);
            tl_push(c, l, tv_strref(self.u.s.p + o + sep.u.s.n, self.u.s.n - o - sep.u.s.n));
        }
        return tv_list_of(c, l);
    }
    if (!strcmp(n, "removeprefix") || !strcmp(n, "removesuffix")) {
        if (nargs != 1)
            tpl_fail(c, "%s() takes exactly one argument (%zu given)", n, nargs);
        struct tv x = tv_need_str(c, args[0], n);
        int suf = n[6] == 's';
        if (x.u.s.n > self.u.s.n ||
            memcmp(self.u.s.p + (suf ? self.u.s.n - x.u.s.n : 0), x.u.s.p, x.u.s.n))
            return self;
        return tv_strref(self.u.s.p + (suf ? 0 : x.u.s.n), self.u.s.n - x.u.s.n);
    }
    if (!strcmp(n, "index") || !strcmp(n, "rindex")) {
        if (nargs != 1) /* (start and end are not taken) */
            tpl_fail(c, "%s() with start or end is not supported", n);
        struct tv at = ts_find(self, tv_need_str(c, args[0], n), n[0] == 'r');
        if (at.u.i < 0)
            tpl_fail(c, "substring not found");
        return at;
    }
    if (!strcmp(n, "isdecimal") || !strcmp(n, "istitle")) {
        if (nargs)
            tpl_fail(c, "%s() takes no arguments (%zu given)", n, nargs);
        int cased = 0, prev_cased = 0;
        for (size_t i = 0; i < self.u.s.n;) {
            utf8proc_int32_t cp;
            utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)self.u.s.p + i,
                                                  (utf8proc_ssize_t)(self.u.s.n - i), &cp);
            utf8proc_category_t k = utf8proc_category(cp);
            i += l > 0 ? (size_t)l : 1;
            if (n[2] == 'd') {
                if (k != UTF8PROC_CATEGORY_ND)
                    return tv_bool(0);
                continue;
            }
            if (k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LT) { /* Python's istitle */
                if (prev_cased)
                    return tv_bool(0);
                prev_cased = cased = 1;
            } else if (k == UTF8PROC_CATEGORY_LL) {
                if (!prev_cased)
                    return tv_bool(0);
                prev_cased = cased = 1;
            } else {
                prev_cased = 0;
            }
        }
        return tv_bool(n[2] == 'd' ? self.u.s.n > 0 : cased);
    }
    if (!strcmp(n, "expandtabs")) {
        size_t tab = nargs ? need_width(c, n, &args[0]) : 8, col = 0;
        struct tbuf b = {0};
        for (size_t i = 0; i < self.u.s.n;) {
            size_t l = 1;
            while (i + l < self.u.s.n && ((unsigned char)self.u.s.p[i + l] & 0xC0) == 0x80)
                l++;
            char ch = self.u.s.p[i];
            if (ch == '\t') {
                size_t sp = tab ? tab - col % tab : 0;
                for (size_t k = 0; k < sp; k++)
                    tb_put(c, &b, " ", 1);
                col += sp;
            } else {
                tb_put(c, &b, self.u.s.p + i, l);
                col = ch == '\n' || ch == '\r' ? 0 : col + 1;
            }
            i += l;
        }
        return tv_buf_str(&b);
    }
    tpl_fail(c, "'str' object has no attribute '%s'", n);
}
