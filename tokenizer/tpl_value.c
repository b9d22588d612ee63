/* SPDX-License-Identifier: Apache-2.0 */
/* tpl_value.c - a template's values with Python's semantics (str(), repr(), json.dumps as transformers' tojson
 * calls it, equality, ordering, truth, len, iteration), the arena a render allocates from, and the request's
 * JSON turned into values (tpl_internal.h). */
#include "tpl_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---------------- UTF-8 ---------------- */

size_t u8_count(const char *p, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ((unsigned char)p[i] & 0xC0) != 0x80;
    return k;
}

size_t u8_offset(const char *p, size_t n, size_t k)
{
    size_t i = 0;
    while (i < n && k) {
        i++;
        while (i < n && ((unsigned char)p[i] & 0xC0) == 0x80)
            i++;
        k--;
    }
    return i;
}

static int32_t u8_decode(const char *p, size_t n, size_t *len)
{
    utf8proc_int32_t cp;
    utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)p, (utf8proc_ssize_t)n, &cp);
    if (l <= 0) {
        *len = 1;
        return (unsigned char)p[0];
    }
    *len = (size_t)l;
    return cp;
}

int u8_is_space(const char *p, size_t n, size_t *len)
{
    int32_t cp = u8_decode(p, n, len);
    return (cp >= 9 && cp <= 13) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

/* ---------------- constructors ---------------- */

struct tv tv_str(struct tctx *c, const char *p, size_t n)
{
    char *o = tpl_alloc_raw(c, n + 1);
    if (n)
        memcpy(o, p, n);
    return tv_strref(o, n);
}

struct tlist *tl_new(struct tctx *c, size_t cap)
{
    struct tlist *l = tpl_alloc(c, sizeof *l);
    l->cap = cap ? cap : 4;
    l->v = tpl_alloc_raw(c, l->cap * sizeof *l->v); /* slots past n are never read */
    return l;
}

void tl_push(struct tctx *c, struct tlist *l, struct tv v)
{
    if (l->n == l->cap) {
        struct tv *nv = tpl_alloc_raw(c, l->cap * 2 * sizeof *nv);
        memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap *= 2;
    }
    l->v[l->n++] = v;
}

struct tdict *td_new(struct tctx *c)
{
    return tpl_alloc(c, sizeof(struct tdict));
}

/* a scope's or a message's key: lengths first, then the first byte (names of one length differ there), then the
 * rest; a name the template set is looked up by the template's own pointer to it (no compare at all) */
struct tv *td_gets(const struct tdict *d, const char *name, size_t n)
{
    for (size_t i = 0; i < d->n; i++) {
        const struct tv *k = &d->k[i];
        if (k->u.s.n == n && k->t == TV_STR &&
            (k->u.s.p == name || !n || (k->u.s.p[0] == name[0] && !memcmp(k->u.s.p, name, n))))
            return &d->v[i];
    }
    return NULL;
}

struct tv *td_get(const struct tdict *d, struct tv k)
{
    if (k.t == TV_STR)
        return td_gets(d, k.u.s.p, k.u.s.n);
    for (size_t i = 0; i < d->n; i++)
        if (tv_equal(&d->k[i], &k))
            return &d->v[i];
    return NULL;
}

void td_set(struct tctx *c, struct tdict *d, struct tv k, struct tv v)
{
    struct tv *old = td_get(d, k);
    if (old) { /* Python: the key keeps its place, the value changes */
        *old = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4; /* a scope or a message: a few names */
        struct tv *nk = tpl_alloc_raw(c, cap * sizeof *nk), *nv = tpl_alloc_raw(c, cap * sizeof *nv);
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
}

/* ---------------- semantics ---------------- */

int tv_truth(const struct tv *v)
{
    switch (v->t) {
    case TV_UNDEF:
    case TV_NONE:
        return 0;
    case TV_BOOL:
        return v->u.b;
    case TV_INT:
        return v->u.i != 0;
    case TV_FLOAT:
        return v->u.f != 0;
    case TV_STR:
        return v->u.s.n > 0;
    case TV_LIST:
        return v->u.l->lazy || v->u.l->n > 0;
    case TV_DICT:
        return v->u.d->n > 0;
    default:
        return 1;
    }
}

int tv_equal(const struct tv *a, const struct tv *b)
{
    if (tv_is_num(a) && tv_is_num(b)) {
        if (a->t != TV_FLOAT && b->t != TV_FLOAT)
            return tv_inum(a) == tv_inum(b);
        return tv_fnum(a) == tv_fnum(b);
    }
    if (a->t != b->t)
        return 0;
    switch (a->t) {
    case TV_UNDEF:
    case TV_NONE:
        return 1;
    case TV_STR:
        return a->u.s.n == b->u.s.n && !memcmp(a->u.s.p, b->u.s.p, a->u.s.n);
    case TV_LIST:
        if (a->u.l->lazy || b->u.l->lazy) /* a generator equals only itself */
            return a->u.l == b->u.l;
        if (a->u.l->tuple != b->u.l->tuple || a->u.l->view != b->u.l->view || a->u.l->n != b->u.l->n)
            return 0;
        for (size_t i = 0; i < a->u.l->n; i++)
            if (!tv_equal(&a->u.l->v[i], &b->u.l->v[i]))
                return 0;
        return 1;
    case TV_DICT:
        if (a->u.d->n != b->u.d->n)
            return 0;
        for (size_t i = 0; i < a->u.d->n; i++) {
            struct tv *o = td_get(b->u.d, a->u.d->k[i]);
            if (!o || !tv_equal(&a->u.d->v[i], o))
                return 0;
        }
        return 1;
    case TV_NS:
        return a->u.d == b->u.d;
    case TV_FUNC:
        return a->u.fn == b->u.fn;
    case TV_MACRO:
        return a->u.mac == b->u.mac;
    default:
        return 0;
    }
}

const char *tv_type_name(const struct tv *v)
{
    static const char *const names[] = {"Undefined", "NoneType", "bool", "int", "float", "str", "list", "dict",
                                        "Namespace", "function", "method", "Macro", "LoopContext"};
    if (v->t == TV_LIST)
        return v->u.l->lazy ? "generator" : v->u.l->view ? v->u.l->view : v->u.l->tuple ? "tuple" : "list";
    return names[v->t];
}

int tv_compare(struct tctx *c, const struct tv *a, const struct tv *b)
{
    if (tv_is_num(a) && tv_is_num(b)) {
        if (a->t != TV_FLOAT && b->t != TV_FLOAT)
            return tv_inum(a) < tv_inum(b) ? -1 : tv_inum(a) > tv_inum(b);
        double x = tv_fnum(a), y = tv_fnum(b);
        return x < y ? -1 : x > y;
    }
    if (a->t == TV_STR && b->t == TV_STR) {
        size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        int r = memcmp(a->u.s.p, b->u.s.p, n); /* UTF-8 byte order is code point order */
        return r ? r : a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n;
    }
    if (a->t == TV_LIST && b->t == TV_LIST && a->u.l->tuple == b->u.l->tuple && !a->u.l->lazy && !b->u.l->lazy &&
        !a->u.l->view && !b->u.l->view) { /* Python orders lists with lists, tuples with tuples */
        for (size_t i = 0; i < a->u.l->n && i < b->u.l->n; i++)
            if (!tv_equal(&a->u.l->v[i], &b->u.l->v[i]))
                return tv_compare(c, &a->u.l->v[i], &b->u.l->v[i]);
        return a->u.l->n < b->u.l->n ? -1 : a->u.l->n > b->u.l->n;
    }
    tpl_fail(c, "'<' not supported between instances of '%s' and '%s'", tv_type_name(a), tv_type_name(b));
}

size_t tv_len(struct tctx *c, const struct tv *v)
{
    switch (v->t) {
    case TV_UNDEF:
        return 0;
    case TV_STR:
        return u8_count(v->u.s.p, v->u.s.n);
    case TV_LIST:
        if (v->u.l->lazy)
            tpl_fail(c, "object of type 'generator' has no len()");
        return v->u.l->n;
    case TV_DICT:
    case TV_NS:
        return v->u.d->n;
    case TV_LOOP:
        return v->u.loop->items->n;
    default:
        tpl_fail(c, "object of type '%s' has no len()", tv_type_name(v));
    }
}

struct tlist *tv_iter(struct tctx *c, const struct tv *v)
{
    struct tlist *l;
    switch (v->t) {
    case TV_UNDEF:
        return tl_new(c, 1);
    case TV_LIST:
        if (v->u.l->poison)
            tpl_fail(c, "%s", v->u.l->poison);
        return v->u.l;
    case TV_DICT:
        l = tl_new(c, v->u.d->n);
        for (size_t i = 0; i < v->u.d->n; i++)
            tl_push(c, l, v->u.d->k[i]);
        return l;
    case TV_STR:
        l = tl_new(c, v->u.s.n);
        for (size_t i = 0; i < v->u.s.n;) {
            size_t e = u8_offset(v->u.s.p + i, v->u.s.n - i, 1);
            tl_push(c, l, tv_strref(v->u.s.p + i, e));
            i += e;
        }
        return l;
    default:
        tpl_fail(c, "'%s' object is not iterable", tv_type_name(v));
    }
}

/* ---------------- text forms ---------------- */

void tb_put(struct tctx *c, struct tbuf *b, const char *p, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *np = tpl_alloc_raw(c, cap);
        if (b->n)
            memcpy(np, b->p, b->n);
        b->p = np;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, p, n);
    b->n += n;
}

static void tb_puts(struct tctx *c, struct tbuf *b, const char *s)
{
    tb_put(c, b, s, strlen(s));
}

void tv_float_repr(double f, char *out, size_t cap)
{
    if (isnan(f)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(out, cap, f < 0 ? "-inf" : "inf");
        return;
    }
    char e[40];
    int p;
    for (p = 1; p <= 17; p++) { /* the shortest digits that read back as f */
        snprintf(e, sizeof e, "%.*e", p - 1, f);
        if (strtod(e, NULL) == f)
            break;
    }
    /* e: [-]d[.ddd]e[+-]XX */
    char digits[24];
    size_t nd = 0;
    const char *s = e;
    int neg = *s == '-';
    if (neg)
        s++;
    for (; *s && *s != 'e'; s++)
        if (*s != '.')
            digits[nd++] = *s;
    int exp = atoi(s + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    size_t k = 0;
    if (neg)
        out[k++] = '-';
    if (exp >= -4 && exp < 16) {
        if (exp >= 0) {
            for (int i = 0; i <= exp; i++)
                out[k++] = (size_t)i < nd ? digits[i] : '0';
            out[k++] = '.';
            if ((size_t)exp + 1 < nd)
                for (size_t i = (size_t)exp + 1; i < nd; i++)
                    out[k++] = digits[i];
            else
                out[k++] = '0';
        } else {
            out[k++] = '0';
            out[k++] = '.';
            for (int i = 0; i < -exp - 1; i++)
                out[k++] = '0';
            for (size_t i = 0; i < nd; i++)
                out[k++] = digits[i];
        }
        out[k] = 0;
    } else {
        out[k++] = digits[0];
        if (nd > 1) {
            out[k++] = '.';
            for (size_t i = 1; i < nd; i++)
                out[k++] = digits[i];
        }
        snprintf(out + k, cap - k, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
}

static void repr_str(struct tctx *c, struct tbuf *b, const char *p, size_t n)
{
    int sq = memchr(p, '\'', n) != NULL, dq = memchr(p, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    tb_put(c, b, &q, 1);
    for (size_t i = 0; i < n;) {
        size_t l;
        int32_t cp = u8_decode(p + i, n - i, &l);
        char esc[16];
        const char *e = NULL;
        if (cp == '\\')
            e = "\\\\";
        else if (cp == q)
            e = q == '\'' ? "\\'" : "\\\"";
        else if (cp == '\n')
            e = "\\n";
        else if (cp == '\r')
            e = "\\r";
        else if (cp == '\t')
            e = "\\t";
        else {
            utf8proc_category_t cat = utf8proc_category(cp);
            int printable = cp == ' ' || !(cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF ||
                                           cat == UTF8PROC_CATEGORY_CS || cat == UTF8PROC_CATEGORY_CO ||
                                           cat == UTF8PROC_CATEGORY_CN || cat == UTF8PROC_CATEGORY_ZL ||
                                           cat == UTF8PROC_CATEGORY_ZP || cat == UTF8PROC_CATEGORY_ZS);
            if (!printable) {
                snprintf(esc, sizeof esc, cp < 0x100 ? "\\x%02x" : cp < 0x10000 ? "\\u%04x" : "\\U%08x", (unsigned)cp);
                e = esc;
            }
        }
        if (e)
            tb_puts(c, b, e);
        else
            tb_put(c, b, p + i, l);
        i += l;
    }
    tb_put(c, b, &q, 1);
}

void tv_repr_into(struct tctx *c, struct tbuf *b, const struct tv *v)
{
    if (++c->steps > c->maxsteps)
        tpl_fail(c, "the render takes more than its step limit");
    switch (v->t) {
    case TV_STR:
        repr_str(c, b, v->u.s.p, v->u.s.n);
        return;
    case TV_LIST:
        if (v->u.l->lazy) { /* jinja prints the generator's repr (an address follows there) */
            tb_puts(c, b, "<generator object>");
            return;
        }
        if (v->u.l->view) {
            tb_puts(c, b, v->u.l->view);
            tb_put(c, b, "(", 1);
        }
        tb_put(c, b, v->u.l->tuple ? "(" : "[", 1);
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i)
                tb_put(c, b, ", ", 2);
            tv_repr_into(c, b, &v->u.l->v[i]);
        }
        if (v->u.l->tuple && v->u.l->n == 1)
            tb_put(c, b, ",", 1);
        tb_put(c, b, v->u.l->tuple ? ")" : "]", 1);
        if (v->u.l->view)
            tb_put(c, b, ")", 1);
        return;
    case TV_DICT:
        tb_put(c, b, "{", 1);
        for (size_t i = 0; i < v->u.d->n; i++) {
            if (i)
                tb_put(c, b, ", ", 2);
            tv_repr_into(c, b, &v->u.d->k[i]);
            tb_put(c, b, ": ", 2);
            tv_repr_into(c, b, &v->u.d->v[i]);
        }
        tb_put(c, b, "}", 1);
        return;
    default:
        tv_str_into(c, b, v);
    }
}

void tv_str_into(struct tctx *c, struct tbuf *b, const struct tv *v)
{
    char num[64];
    switch (v->t) {
    case TV_UNDEF:
        return;
    case TV_NONE:
        tb_puts(c, b, "None");
        return;
    case TV_BOOL:
        tb_puts(c, b, v->u.b ? "True" : "False");
        return;
    case TV_INT:
        snprintf(num, sizeof num, "%lld", (long long)v->u.i);
        tb_puts(c, b, num);
        return;
    case TV_FLOAT:
        tv_float_repr(v->u.f, num, sizeof num);
        tb_puts(c, b, num);
        return;
    case TV_STR:
        tb_put(c, b, v->u.s.p, v->u.s.n);
        return;
    case TV_LIST:
    case TV_DICT:
        tv_repr_into(c, b, v);
        return;
    case TV_NS:
        tb_puts(c, b, "<Namespace>");
        return;
    default:
        tb_puts(c, b, "<function>");
        return;
    }
}

struct tv tv_to_str(struct tctx *c, const struct tv *v)
{
    if (v->t == TV_STR)
        return *v;
    struct tbuf b = {0};
    tv_str_into(c, &b, v);
    return tv_strref(b.p ? b.p : "", b.n);
}

static void json_str(struct tctx *c, struct tbuf *b, const char *p, size_t n)
{
    tb_put(c, b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        const char *e = NULL;
        char u[8];
        if (ch == '"')
            e = "\\\"";
        else if (ch == '\\')
            e = "\\\\";
        else if (ch == '\n')
            e = "\\n";
        else if (ch == '\r')
            e = "\\r";
        else if (ch == '\t')
            e = "\\t";
        else if (ch == '\b')
            e = "\\b";
        else if (ch == '\f')
            e = "\\f";
        else if (ch < 0x20) {
            snprintf(u, sizeof u, "\\u%04x", ch);
            e = u;
        }
        if (e) {
            tb_put(c, b, p + run, i - run);
            tb_puts(c, b, e);
            run = i + 1;
        }
    }
    tb_put(c, b, p + run, n - run);
    tb_put(c, b, "\"", 1);
}

static void json_nl(struct tctx *c, struct tbuf *b, int indent, int level)
{
    tb_put(c, b, "\n", 1);
    for (int i = 0; i < indent * level; i++)
        tb_put(c, b, " ", 1);
}

static int key_cmp(const void *x, const void *y)
{
    const struct tv *a = *(struct tv *const *)x, *b = *(struct tv *const *)y;
    size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
    int r = memcmp(a->u.s.p, b->u.s.p, n);
    return r ? r : (a->u.s.n > b->u.s.n) - (a->u.s.n < b->u.s.n);
}

void tv_json_into(struct tctx *c, struct tbuf *b, const struct tv *v, int indent, const char *item_sep,
                  const char *key_sep, int sort_keys, int level)
{
    char num[64];
    if (++c->steps > c->maxsteps)
        tpl_fail(c, "the render takes more than its step limit");
    if (level > 512)
        tpl_fail(c, "tojson: nested too deeply");
    switch (v->t) {
    case TV_NONE:
        tb_puts(c, b, "null");
        return;
    case TV_BOOL:
        tb_puts(c, b, v->u.b ? "true" : "false");
        return;
    case TV_INT:
        snprintf(num, sizeof num, "%lld", (long long)v->u.i);
        tb_puts(c, b, num);
        return;
    case TV_FLOAT:
        if (isnan(v->u.f))
            tb_puts(c, b, "NaN");
        else if (isinf(v->u.f))
            tb_puts(c, b, v->u.f < 0 ? "-Infinity" : "Infinity");
        else {
            tv_float_repr(v->u.f, num, sizeof num);
            tb_puts(c, b, num);
        }
        return;
    case TV_STR:
        json_str(c, b, v->u.s.p, v->u.s.n);
        return;
    case TV_LIST:
        if (v->u.l->lazy || v->u.l->view)
            tpl_fail(c, "Object of type %s is not JSON serializable", tv_type_name(v));
        if (!v->u.l->n) {
            tb_puts(c, b, "[]");
            return;
        }
        tb_put(c, b, "[", 1);
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i)
                tb_puts(c, b, item_sep);
            if (indent >= 0)
                json_nl(c, b, indent, level + 1);
            tv_json_into(c, b, &v->u.l->v[i], indent, item_sep, key_sep, sort_keys, level + 1);
        }
        if (indent >= 0)
            json_nl(c, b, indent, level);
        tb_put(c, b, "]", 1);
        return;
    case TV_DICT: {
        const struct tdict *d = v->u.d;
        if (!d->n) {
            tb_puts(c, b, "{}");
            return;
        }
        const struct tv **keys = tpl_alloc(c, d->n * sizeof *keys);
        size_t *at = tpl_alloc(c, d->n * sizeof *at);
        for (size_t i = 0; i < d->n; i++) {
            if (d->k[i].t != TV_STR)
                tpl_fail(c, "tojson: keys must be strings");
            keys[i] = &d->k[i];
        }
        if (sort_keys)
            qsort(keys, d->n, sizeof *keys, key_cmp);
        for (size_t i = 0; i < d->n; i++)
            at[i] = (size_t)(keys[i] - d->k);
        tb_put(c, b, "{", 1);
        for (size_t i = 0; i < d->n; i++) {
            if (i)
                tb_puts(c, b, item_sep);
            if (indent >= 0)
                json_nl(c, b, indent, level + 1);
            json_str(c, b, d->k[at[i]].u.s.p, d->k[at[i]].u.s.n);
            tb_puts(c, b, key_sep);
            tv_json_into(c, b, &d->v[at[i]], indent, item_sep, key_sep, sort_keys, level + 1);
        }
        if (indent >= 0)
            json_nl(c, b, indent, level);
        tb_put(c, b, "}", 1);
        return;
    }
    default:
        tpl_fail(c, "Object of type %s is not JSON serializable", tv_type_name(v));
    }
}

/* A JSON value made a template value in place: written where it goes (a list's or a dict's slot), not returned
 * through the stack and copied again, and its type read from the node (a conversation is thousands of values) */
static void json_into(struct tctx *c, const cJSON *j, struct tv *v)
{
    if (++c->steps > c->maxsteps)
        tpl_fail(c, "the render takes more than its step limit");
    switch (j ? j->type & 0xFF : cJSON_NULL) {
    case cJSON_NULL:
        *v = tv_none();
        return;
    case cJSON_False:
    case cJSON_True:
        *v = tv_bool((j->type & 0xFF) == cJSON_True);
        return;
    case cJSON_Number: {
        double d = j->valuedouble;
        const char *l = j->valuestring; /* how it was written, where that matters (xtok_json_literals) */
        if (l && strpbrk(l, ".eE")) { /* a float, as json.loads reads it (cJSON's strtod: the same double) */
            *v = tv_float(d);
            return;
        }
        if (l) { /* an integer too long for a double: exact within 64 bits (past them, the double's value) */
            char *end;
            errno = 0;
            long long x = strtoll(l, &end, 10);
            if (!errno && !*end) {
                *v = tv_int((int64_t)x);
                return;
            }
        }
        /* else integral values within 2^53 are ints (what was written without a '.', e or E) */
        *v = d == floor(d) && fabs(d) <= 9007199254740992.0 ? tv_int((int64_t)d) : tv_float(d);
        return;
    }
    case cJSON_String: { /* referred to: the JSON outlives the render */
        size_t n = strlen(j->valuestring);
        c->json_bytes += n;
        *v = tv_strref(j->valuestring, n);
        return;
    }
    default:
        break;
    }
    size_t items = 0;
    for (const cJSON *it = j->child; it; it = it->next)
        items++;
    if ((j->type & 0xFF) == cJSON_Array) {
        struct tlist *l = tl_new(c, items);
        *v = (struct tv){.t = TV_LIST};
        v->u.l = l;
        for (const cJSON *it = j->child; it; it = it->next)
            json_into(c, it, &l->v[l->n++]);
        return;
    }
    struct tdict *d = td_new(c);
    *v = (struct tv){.t = TV_DICT};
    v->u.d = d;
    if (!items)
        return;
    d->cap = items; /* sized once (a message: role, content, perhaps a few more) */
    d->k = tpl_alloc_raw(c, items * sizeof *d->k);
    d->v = tpl_alloc_raw(c, items * sizeof *d->v);
    for (const cJSON *it = j->child; it; it = it->next) {
        size_t kn = strlen(it->string);
        struct tv *old = td_gets(d, it->string, kn); /* a key given twice: Python keeps the place, the last value */
        if (old) {
            json_into(c, it, old);
            continue;
        }
        d->k[d->n] = tv_strref(it->string, kn);
        json_into(c, it, &d->v[d->n]);
        d->n++;
    }
}

struct tv tv_from_json(struct tctx *c, const cJSON *j)
{
    struct tv v;
    json_into(c, j, &v);
    return v;
}

struct tv tv_list_of(struct tctx *c, struct tlist *l)
{
    struct tv v = {.t = TV_LIST};
    v.u.l = l;
    return v;
}

struct tv tv_buf_str(struct tbuf *b)
{
    return tv_strref(b->p ? b->p : "", b->n);
}

struct tv tv_need_str(struct tctx *c, struct tv v, const char *what)
{
    if (v.t != TV_STR)
        tpl_fail(c, "%s: expected a string, got %s", what, tv_type_name(&v));
    return v;
}

void tpl_emit_value(struct tctx *c, const struct tv *v)
{
    if (v->t == TV_STR) {
        tpl_emit(c, v->u.s.p, v->u.s.n);
        return;
    }
    struct tbuf b = {0};
    tv_str_into(c, &b, v);
    tpl_emit(c, b.p, b.n);
}
