/* SPDX-License-Identifier: Apache-2.0 */
/* tpl_lib.c - what chat templates call (tpl_internal.h): jinja2's filters and tests that Hugging Face templates
 * use, transformers' tojson (json.dumps, ensure_ascii=False, not HTML-escaped), Python's str and dict methods
 * (read-only: the sandbox is immutable), and the globals range, namespace, raise_exception, strftime_now, dict.
 * A filter or test outside these is refused when the template is loaded (tpl_parse.c asks tpl_*_known). */
#include "tpl_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

static const char *const FILTERS[] = {"trim", "tojson", "length", "count", "string", "lower", "upper", "title",
                                      "capitalize", "default", "d", "join", "first", "last", "list", "items",
                                      "selectattr", "rejectattr", "map", "select", "reject", "reverse", "replace",
                                      "int", "float", "abs", "safe", "indent", "sum", "escape", "e", "sort",
                                      "dictsort", "min", "max", "unique", "format", "round", NULL};
static const char *const TESTS[] = {"defined", "undefined", "none", "string", "number", "integer", "float",
                                    "boolean", "true", "false", "mapping", "iterable", "sequence", "callable", "odd",
                                    "even", "divisibleby", "eq", "equalto", "ne", "lt", "gt", "le", "ge", "in",
                                    "sameas", "lower", "upper", NULL};
static const char *const STR_METHODS[] = {"startswith", "endswith", "split", "rsplit", "strip", "lstrip", "rstrip",
                                          "upper", "lower", "title", "capitalize", "replace", "find", "rfind",
                                          "count", "join", "splitlines", "isdigit", "isalpha", "isspace", "isalnum",
                                          "islower", "isupper", "zfill", "ljust", "rjust", "center", "partition",
                                          "rpartition", "removeprefix", "removesuffix", "index", "rindex",
                                          "isdecimal", "istitle", "expandtabs", NULL};
static const char *const DICT_METHODS[] = {"items", "keys", "values", "get", NULL};
static const char *const LIST_METHODS[] = {"index", "count", NULL};

static int listed(const char *const *l, const char *name)
{
    for (; *l; l++)
        if (tpl_name_is(name, *l))
            return 1;
    return 0;
}

int tpl_filter_known(const char *name)
{
    return listed(FILTERS, name);
}

int tpl_test_known(const char *name)
{
    return listed(TESTS, name);
}

int tpl_has_method(const struct tv *v, const char *name)
{
    return (v->t == TV_STR && listed(STR_METHODS, name)) || (v->t == TV_DICT && listed(DICT_METHODS, name)) ||
           (v->t == TV_LIST && listed(LIST_METHODS, name));
}

/* ---- helpers ---- */

static struct tv kwarg(const char **kwn, struct tv *kwv, size_t nkw, const char *name, struct tv *args,
                       size_t nargs, size_t pos, struct tv def)
{
    for (size_t i = 0; i < nkw; i++)
        if (!strcmp(kwn[i], name))
            return kwv[i];
    return pos < nargs ? args[pos] : def;
}


static struct tv attr_path(struct tctx *c, struct tv v, struct tv attr)
{
    if (attr.t == TV_INT)
        return v.t == TV_LIST && attr.u.i >= 0 && (size_t)attr.u.i < v.u.l->n ? v.u.l->v[attr.u.i] : tv_undef("item");
    tv_need_str(c, attr, "attribute");
    const char *p = attr.u.s.p, *end = p + attr.u.s.n;
    while (p <= end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        size_t l = dot ? (size_t)(dot - p) : (size_t)(end - p);
        if (v.t == TV_DICT || v.t == TV_NS) {
            struct tv *x = td_gets(v.u.d, p, l);
            v = x ? *x : tv_undef("attribute");
        } else {
            return tv_undef("attribute");
        }
        if (!dot)
            break;
        p = dot + 1;
    }
    return v;
}

/* the (key, value) tuple of a dict's entry i: what items() and the `items` filter give */
static struct tv item_pair(struct tctx *c, const struct tdict *d, size_t i)
{
    struct tlist *pair = tl_new(c, 2);
    pair->tuple = 1;
    tl_push(c, pair, d->k[i]);
    tl_push(c, pair, d->v[i]);
    return tv_list_of(c, pair);
}

/* jinja's sort keys: an item's attribute (dotted; for sort a list of them, comma-separated, compared as Python
 * compares lists: equal items first, so two missing attributes are equal), or the item; a string lower-cased unless
 * case_sensitive (jinja's ignore_case) */
static struct tv sort_key(struct tctx *c, struct tv item, struct tv attr, int multi, int case_sensitive)
{
    struct tv k = item;
    if (multi && attr.t != TV_NONE && attr.t != TV_UNDEF) {
        struct tlist *parts = tl_new(c, 4);
        if (attr.t != TV_STR) {
            tl_push(c, parts, sort_key(c, item, attr, 0, case_sensitive));
            return tv_list_of(c, parts);
        }
        const char *p = attr.u.s.p, *end = p + attr.u.s.n;
        for (;;) {
            const char *comma = memchr(p, ',', (size_t)(end - p));
            struct tv one = tv_strref(p, comma ? (size_t)(comma - p) : (size_t)(end - p));
            tl_push(c, parts, sort_key(c, item, one, 0, case_sensitive));
            if (!comma)
                break;
            p = comma + 1;
        }
        return tv_list_of(c, parts);
    }
    if (attr.t != TV_NONE && attr.t != TV_UNDEF)
        k = attr_path(c, item, attr);
    return !case_sensitive && k.t == TV_STR ? ts_map_case(c, k, utf8proc_tolower) : k;
}

/* one comparison more: a render's comparisons count against its step limit (a hostile list is bounded in time) */
static void compare_step(struct tctx *c)
{
    if (++c->steps > c->maxsteps)
        tpl_fail(c, "the render takes more than its step limit");
}

/* a stable merge sort of items by keys (Python's sorted: equal keys keep their order; reverse too); ti, tk: room
 * for n items and keys */
static void sort_by(struct tctx *c, struct tv *items, struct tv *keys, size_t n, int reverse, struct tv *ti,
                    struct tv *tk)
{
    if (n < 2)
        return;
    size_t h = n / 2;
    sort_by(c, items, keys, h, reverse, ti, tk);
    sort_by(c, items + h, keys + h, n - h, reverse, ti, tk);
    size_t i = 0, j = h, o = 0;
    while (i < h || j < n) {
        compare_step(c);
        int right = i >= h ? 1 : j >= n ? 0 : reverse ? tv_compare(c, &keys[i], &keys[j]) < 0
                                                      : tv_compare(c, &keys[j], &keys[i]) < 0;
        size_t k = right ? j++ : i++;
        ti[o] = items[k];
        tk[o++] = keys[k];
    }
    memcpy(items, ti, n * sizeof *ti);
    memcpy(keys, tk, n * sizeof *tk);
}

/* sort, dictsort, min, max, unique */
static struct tv ordering_filter(struct tctx *c, const char *name, struct tv v, struct tv *args, size_t nargs,
                                 const char **kwn, struct tv *kwv, size_t nkw)
{
    struct tv none = tv_none();
    int dict = name[0] == 'd', sort = name[0] == 's', uniq = name[0] == 'u';
    struct tv cs = kwarg(kwn, kwv, nkw, "case_sensitive", args, nargs, dict || !sort ? 0 : 1, tv_bool(0));
    struct tv rev = kwarg(kwn, kwv, nkw, "reverse", args, nargs, dict ? 2 : 0, tv_bool(0));
    struct tv attr = dict ? none : kwarg(kwn, kwv, nkw, "attribute", args, nargs, sort ? 2 : 1, none);
    struct tv by = dict ? kwarg(kwn, kwv, nkw, "by", args, nargs, 1, tv_strref("key", 3)) : none;
    int by_value = 0;
    if (dict) {
        if (v.t != TV_DICT)
            tpl_fail(c, "dictsort: expected a mapping, got %s", tv_type_name(&v));
        by = tv_need_str(c, by, "dictsort");
        if (by.u.s.n == 5 && !memcmp(by.u.s.p, "value", 5))
            by_value = 1;
        else if (!(by.u.s.n == 3 && !memcmp(by.u.s.p, "key", 3)))
            tpl_fail(c, "You can only sort by either \"key\" or \"value\"");
    }
    if (!sort && !dict)
        rev = tv_bool(0);
    struct tlist *in = dict ? tl_new(c, v.u.d->n + 1) : tv_iter(c, &v);
    for (size_t i = 0; dict && i < v.u.d->n; i++)
        tl_push(c, in, item_pair(c, v.u.d, i));
    size_t n = in->n;
    struct tv *items = tpl_alloc_raw(c, (n + 1) * sizeof *items), *keys = tpl_alloc_raw(c, (n + 1) * sizeof *keys);
    for (size_t i = 0; i < n; i++) {
        compare_step(c);
        items[i] = in->v[i];
        keys[i] = sort_key(c, dict ? in->v[i].u.l->v[by_value] : in->v[i], attr, sort, tv_truth(&cs));
    }
    struct tlist *out = tl_new(c, n + 1);
    if (sort || dict) {
        sort_by(c, items, keys, n, tv_truth(&rev), tpl_alloc_raw(c, (n + 1) * sizeof *items),
                tpl_alloc_raw(c, (n + 1) * sizeof *keys));
        for (size_t i = 0; i < n; i++)
            tl_push(c, out, items[i]);
        return tv_list_of(c, out);
    }
    if (uniq) { /* the first item of each key, in order */
        for (size_t i = 0; i < n; i++) {
            if (keys[i].t == TV_LIST || keys[i].t == TV_DICT)
                tpl_fail(c, "unhashable type: '%s'", tv_type_name(&keys[i]));
            size_t j = 0; /* (quadratic, as no hash of a value is kept: each comparison is a step) */
            while (j < i && (compare_step(c), !tv_equal(&keys[j], &keys[i])))
                j++;
            if (j == i)
                tl_push(c, out, items[i]);
        }
        out->lazy = 1;
        return tv_list_of(c, out);
    }
    if (!n) /* min, max of nothing: undefined (printed as nothing) */
        return tv_undef("No aggregated item, sequence was empty.");
    size_t best = 0; /* Python's min/max: the first of the least / greatest */
    for (size_t i = 1; i < n; i++) {
        compare_step(c);
        int r = tv_compare(c, &keys[i], &keys[best]);
        if (name[1] == 'i' ? r < 0 : r > 0)
            best = i;
    }
    return items[best];
}

/* ---- filters ---- */

static struct tv filter_now(struct tctx *c, struct tscope *s, const char *name, struct tv v, struct tv *args,
                            size_t nargs, const char **kwn, struct tv *kwv, size_t nkw)
{
    struct tv none = tv_none();
    if (!strcmp(name, "trim")) {
        struct tv ch = kwarg(kwn, kwv, nkw, "chars", args, nargs, 0, none);
        return ts_strip(tv_to_str(c, &v), ch.t == TV_STR ? &ch : NULL, 1, 1);
    }
    if (!strcmp(name, "tojson")) {
        struct tv ea = kwarg(kwn, kwv, nkw, "ensure_ascii", args, nargs, 0, tv_bool(0));
        struct tv ind = kwarg(kwn, kwv, nkw, "indent", args, nargs, 1, none);
        struct tv sep = kwarg(kwn, kwv, nkw, "separators", args, nargs, 2, none);
        struct tv sk = kwarg(kwn, kwv, nkw, "sort_keys", args, nargs, 3, tv_bool(0));
        int indent = ind.t == TV_INT ? (int)(ind.u.i < 0 ? 0 : ind.u.i > 64 ? 64 : ind.u.i) : -1;
        const char *isep = indent >= 0 ? "," : ", ", *ksep = ": ";
        if (sep.t == TV_LIST && sep.u.l->n == 2 && sep.u.l->v[0].t == TV_STR && sep.u.l->v[1].t == TV_STR) {
            struct tv a = tv_str(c, sep.u.l->v[0].u.s.p, sep.u.l->v[0].u.s.n);
            struct tv b = tv_str(c, sep.u.l->v[1].u.s.p, sep.u.l->v[1].u.s.n);
            isep = a.u.s.p;
            ksep = b.u.s.p;
        }
        struct tbuf b = {0};
        tv_json_into(c, &b, &v, indent, isep, ksep, tv_truth(&sk), 0);
        return tv_truth(&ea) ? ts_json_ascii(c, &b) : tv_buf_str(&b);
    }
    if (!strcmp(name, "length") || !strcmp(name, "count"))
        return tv_int((int64_t)tv_len(c, &v));
    if (!strcmp(name, "string") || !strcmp(name, "safe"))
        return !strcmp(name, "safe") ? v : tv_to_str(c, &v);
    if (!strcmp(name, "lower") || !strcmp(name, "upper"))
        return ts_map_case(c, tv_to_str(c, &v), name[0] == 'l' ? utf8proc_tolower : utf8proc_toupper);
    if (!strcmp(name, "title"))
        return ts_jinja_title(c, tv_to_str(c, &v));
    if (!strcmp(name, "capitalize"))
        return ts_capitalize(c, tv_to_str(c, &v));
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        struct tv def = kwarg(kwn, kwv, nkw, "default_value", args, nargs, 0, tv_strref("", 0));
        struct tv boolean = kwarg(kwn, kwv, nkw, "boolean", args, nargs, 1, tv_bool(0));
        return v.t == TV_UNDEF || (tv_truth(&boolean) && !tv_truth(&v)) ? def : v;
    }
    if (!strcmp(name, "escape") || !strcmp(name, "e"))
        return ts_escape(c, tv_to_str(c, &v));
    if (!strcmp(name, "round"))
        return tv_round(c, v, kwarg(kwn, kwv, nkw, "precision", args, nargs, 0, tv_int(0)),
                        kwarg(kwn, kwv, nkw, "method", args, nargs, 1, tv_strref("common", 6)));
    if (!strcmp(name, "format")) { /* jinja: str(value) % (kwargs or args), never both */
        if (nargs && nkw)
            tpl_fail(c, "can't handle positional and keyword arguments at the same time");
        struct tv rhs = {.t = nkw ? TV_DICT : TV_LIST};
        if (nkw) {
            rhs.u.d = td_new(c);
            for (size_t i = 0; i < nkw; i++)
                td_set(c, rhs.u.d, tv_strref(kwn[i], strlen(kwn[i])), kwv[i]);
        } else {
            rhs.u.l = tl_new(c, nargs + 1);
            rhs.u.l->tuple = 1;
            for (size_t i = 0; i < nargs; i++)
                tl_push(c, rhs.u.l, args[i]);
        }
        return ts_percent(c, tv_to_str(c, &v), rhs);
    }
    struct tlist *items = NULL;
    if (!strcmp(name, "join")) {
        struct tv sep = kwarg(kwn, kwv, nkw, "d", args, nargs, 0, tv_strref("", 0));
        struct tv attr = kwarg(kwn, kwv, nkw, "attribute", args, nargs, 1, none);
        items = tv_iter(c, &v);
        struct tbuf b = {0};
        struct tv sepstr = tv_to_str(c, &sep);
        for (size_t i = 0; i < items->n; i++) {
            if (i)
                tb_put(c, &b, sepstr.u.s.p, sepstr.u.s.n);
            struct tv x = attr.t != TV_NONE ? attr_path(c, items->v[i], attr) : items->v[i];
            tv_str_into(c, &b, &x);
        }
        return tv_buf_str(&b);
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        items = tv_iter(c, &v);
        if (items->lazy && name[0] == 'l')
            tpl_fail(c, "'generator' object is not reversible");
        if (!items->n)
            return tv_undef(name);
        return items->v[name[0] == 'f' ? 0 : items->n - 1];
    }
    if (!strcmp(name, "list")) { /* a list: the items of a tuple, a generator or a view become one */
        items = tv_iter(c, &v);
        if (v.t != TV_LIST || (!items->tuple && !items->lazy && !items->view))
            return tv_list_of(c, items);
        struct tlist *out = tl_new(c, items->n + 1);
        for (size_t i = 0; i < items->n; i++)
            tl_push(c, out, items->v[i]);
        return tv_list_of(c, out);
    }
    if (!strcmp(name, "items")) {
        struct tlist *out = tl_new(c, 8);
        out->lazy = 1; /* a generator, even for undefined (it yields nothing) */
        if (v.t == TV_UNDEF)
            return tv_list_of(c, out);
        if (v.t != TV_DICT)
            tpl_fail(c, "Can only get item pairs from a mapping.");
        for (size_t i = 0; i < v.u.d->n; i++)
            tl_push(c, out, item_pair(c, v.u.d, i));
        return tv_list_of(c, out);
    }
    if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr") || !strcmp(name, "select") ||
        !strcmp(name, "reject")) {
        int by_attr = name[6] == 'a', keep_if = name[0] == 's';
        size_t base = by_attr ? 1 : 0;
        if (by_attr && nargs < 1)
            tpl_fail(c, "%s: an attribute is required", name);
        items = tv_truth(&v) ? tv_iter(c, &v) : tl_new(c, 1); /* jinja: `if value:` before iterating */
        struct tlist *out = tl_new(c, items->n + 1);
        for (size_t i = 0; i < items->n; i++) {
            struct tv x = by_attr ? attr_path(c, items->v[i], args[0]) : items->v[i];
            int ok;
            if (nargs > base) {
                struct tv t = tv_need_str(c, args[base], name);
                char *tn = tpl_alloc(c, t.u.s.n + 1);
                memcpy(tn, t.u.s.p, t.u.s.n);
                if (!tpl_test_known(tn))
                    tpl_fail(c, "test '%s' is not supported", tn);
                ok = tpl_test(c, tn, &x, args + base + 1, nargs - base - 1);
            } else {
                ok = tv_truth(&x);
            }
            if (ok == keep_if)
                tl_push(c, out, items->v[i]);
        }
        out->lazy = 1;
        return tv_list_of(c, out);
    }
    if (!strcmp(name, "map")) {
        items = tv_truth(&v) ? tv_iter(c, &v) : tl_new(c, 1); /* jinja: `if value:` before iterating */
        struct tlist *out = tl_new(c, items->n + 1);
        struct tv attr = kwarg(kwn, kwv, nkw, "attribute", NULL, 0, 0, none);
        struct tv def = kwarg(kwn, kwv, nkw, "default", NULL, 0, 0, tv_undef("default"));
        for (size_t i = 0; i < items->n; i++) {
            if (attr.t != TV_NONE) {
                struct tv x = attr_path(c, items->v[i], attr);
                tl_push(c, out, x.t == TV_UNDEF && def.t != TV_UNDEF ? def : x);
            } else {
                if (!nargs)
                    tpl_fail(c, "map: a filter name or attribute= is required");
                struct tv f = tv_need_str(c, args[0], "map");
                char *fn = tpl_alloc(c, f.u.s.n + 1);
                memcpy(fn, f.u.s.p, f.u.s.n);
                if (!tpl_filter_known(fn))
                    tpl_fail(c, "filter '%s' is not supported", fn);
                tl_push(c, out, tpl_filter(c, s, fn, items->v[i], args + 1, nargs - 1, kwn, kwv, nkw));
            }
        }
        out->lazy = 1;
        return tv_list_of(c, out);
    }
    if (!strcmp(name, "reverse")) {
        items = tv_iter(c, &v);
        struct tlist *out = tl_new(c, items->n + 1);
        for (size_t i = items->n; i-- > 0;)
            tl_push(c, out, items->v[i]);
        out->lazy = !(v.t == TV_LIST && v.u.l->lazy); /* reversed(): an iterator; of a generator, jinja's list */
        if (v.t != TV_STR)
            return tv_list_of(c, out);
        struct tbuf b = {0};
        for (size_t i = 0; i < out->n; i++)
            tb_put(c, &b, out->v[i].u.s.p, out->v[i].u.s.n);
        return tv_buf_str(&b);
    }
    if (!strcmp(name, "replace")) {
        if (nargs < 2)
            tpl_fail(c, "replace: old and new are required");
        struct tv cnt = kwarg(kwn, kwv, nkw, "count", args, nargs, 2, none);
        return ts_replace(c, tv_to_str(c, &v), args[0], args[1], cnt.t == TV_INT ? cnt.u.i : -1);
    }
    if (!strcmp(name, "int") || !strcmp(name, "float")) {
        struct tv def = kwarg(kwn, kwv, nkw, "default", args, nargs, 0, name[0] == 'i' ? tv_int(0) : tv_float(0));
        double d;
        if (v.t == TV_UNDEF) /* int(undefined) raises in jinja */
            tpl_fail(c, "'%s' is undefined", v.undef_name ? v.undef_name : "value");
        if (v.t == TV_INT || v.t == TV_BOOL)
            d = (double)(v.t == TV_INT ? v.u.i : v.u.b);
        else if (v.t == TV_FLOAT)
            d = v.u.f;
        else if (v.t == TV_STR) {
            struct tv tr = ts_strip(v, NULL, 1, 1);
            char *t = tpl_alloc(c, tr.u.s.n + 1), *end;
            memcpy(t, tr.u.s.p, tr.u.s.n);
            d = strtod(t, &end);
            if (end == t || *end)
                return def;
        } else
            return def;
        if (name[0] == 'f')
            return tv_float(d);
        if (!(d > -9.2e18 && d < 9.2e18))
            return def;
        return tv_int((int64_t)d);
    }
    if (!strcmp(name, "abs")) {
        if (v.t == TV_FLOAT)
            return tv_float(fabs(v.u.f));
        if (v.t == TV_INT && v.u.i != INT64_MIN)
            return tv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        if (v.t == TV_BOOL)
            return tv_int(v.u.b);
        tpl_fail(c, "bad operand type for abs(): '%s'", tv_type_name(&v));
    }
    if (!strcmp(name, "sum")) {
        struct tv attr = kwarg(kwn, kwv, nkw, "attribute", args, nargs, 0, none);
        struct tv acc = kwarg(kwn, kwv, nkw, "start", args, nargs, 1, tv_int(0));
        items = tv_iter(c, &v);
        for (size_t i = 0; i < items->n; i++) {
            struct tv x = attr.t != TV_NONE ? attr_path(c, items->v[i], attr) : items->v[i];
            if (!((acc.t == TV_INT || acc.t == TV_FLOAT) && (x.t == TV_INT || x.t == TV_FLOAT || x.t == TV_BOOL)))
                tpl_fail(c, "sum: unsupported operand types");
            int64_t r;
            if (acc.t == TV_INT && x.t != TV_FLOAT && !__builtin_add_overflow(acc.u.i, x.t == TV_INT ? x.u.i : x.u.b, &r))
                acc = tv_int(r);
            else
                acc = tv_float((acc.t == TV_INT ? (double)acc.u.i : acc.u.f) +
                               (x.t == TV_FLOAT ? x.u.f : (double)(x.t == TV_INT ? x.u.i : x.u.b)));
        }
        return acc;
    }
    if (!strcmp(name, "indent")) {
        struct tv w = kwarg(kwn, kwv, nkw, "width", args, nargs, 0, tv_int(4));
        struct tv first = kwarg(kwn, kwv, nkw, "first", args, nargs, 1, tv_bool(0));
        struct tv blank = kwarg(kwn, kwv, nkw, "blank", args, nargs, 2, tv_bool(0));
        struct tbuf ind = {0};
        if (w.t == TV_STR)
            tb_put(c, &ind, w.u.s.p, w.u.s.n);
        else
            for (int64_t i = 0; w.t == TV_INT && i < w.u.i && i < 1024; i++)
                tb_put(c, &ind, " ", 1);
        struct tv str = tv_need_str(c, v, "indent"); /* jinja appends "\n" to it: a str's operation */
        struct tbuf sx = {0};
        tb_put(c, &sx, str.u.s.p, str.u.s.n);
        tb_put(c, &sx, "\n", 1);
        struct tlist *lines = ts_splitlines(c, tv_buf_str(&sx));
        struct tbuf b = {0};
        if (tv_truth(&first))
            tb_put(c, &b, ind.p, ind.n);
        for (size_t i = 0; i < lines->n; i++) {
            if (i) {
                tb_put(c, &b, "\n", 1);
                if (tv_truth(&blank) || lines->v[i].u.s.n)
                    tb_put(c, &b, ind.p, ind.n);
            }
            tb_put(c, &b, lines->v[i].u.s.p, lines->v[i].u.s.n);
        }
        return tv_buf_str(&b);
    }
    if (!strcmp(name, "sort") || !strcmp(name, "dictsort") || !strcmp(name, "min") || !strcmp(name, "max") ||
        !strcmp(name, "unique"))
        return ordering_filter(c, name, v, args, nargs, kwn, kwv, nkw);
    tpl_fail(c, "filter '%s' is not supported", name);
}

/* A filter that is a generator in jinja (map, select, reject, selectattr, rejectattr, unique, items) runs here at
 * once, but an error in it is kept in what it gives, raised only when that is iterated, as jinja raises it (a
 * render limit passed meanwhile is passed again at the next step or allocation). */
struct tv tpl_filter(struct tctx *c, struct tscope *s, const char *name, struct tv v, struct tv *args, size_t nargs,
                     const char **kwn, struct tv *kwv, size_t nkw)
{
    static const char *const GENERATORS[] = {"map", "select", "reject", "selectattr", "rejectattr", "unique", "items",
                                             NULL};
    if (!listed(GENERATORS, name))
        return filter_now(c, s, name, v, args, nargs, kwn, kwv, nkw);
    jmp_buf outer;
    memcpy(outer, c->jb, sizeof outer);
    struct tcapture *volatile captures = c->captures;
    if (setjmp(c->jb)) {
        memcpy(c->jb, outer, sizeof outer);
        tpl_uncapture(c, captures);
        const char *msg = c->err, *after = strstr(msg, ": "); /* the message without "chat template line N: " */
        if (!strncmp(msg, "chat template line ", 19) && after)
            msg = after + 2;
        size_t n = strlen(msg);
        char *why = tpl_alloc_raw(c, n + 1);
        memcpy(why, msg, n + 1);
        struct tlist *l = tl_new(c, 1);
        l->lazy = 1;
        l->poison = why;
        return tv_list_of(c, l);
    }
    struct tv r = filter_now(c, s, name, v, args, nargs, kwn, kwv, nkw);
    memcpy(c->jb, outer, sizeof outer);
    return r;
}

/* ---- tests ---- */

/* jinja's odd, even, divisibleby: Python's `value % d == want`, floats included (2.5 is neither odd nor even) */
static int mod_is(struct tctx *c, const char *name, const struct tv *v, struct tv d, int want)
{
    int vi = v->t == TV_INT || v->t == TV_BOOL, di = d.t == TV_INT || d.t == TV_BOOL;
    if (!(vi || v->t == TV_FLOAT) || !(di || d.t == TV_FLOAT))
        tpl_fail(c, "%s: unsupported operand type(s) for %%: '%s' and '%s'", name, tv_type_name(v), tv_type_name(&d));
    if (vi && di) {
        int64_t x = v->t == TV_INT ? v->u.i : v->u.b, y = d.t == TV_INT ? d.u.i : d.u.b;
        if (!y)
            tpl_fail(c, "%s: integer division or modulo by zero", name);
        int64_t m = y == -1 ? 0 : x % y;
        if (m && ((m < 0) != (y < 0)))
            m += y;
        return m == want;
    }
    double x = v->t == TV_FLOAT ? v->u.f : (double)(v->t == TV_INT ? v->u.i : v->u.b);
    double y = d.t == TV_FLOAT ? d.u.f : (double)(d.t == TV_INT ? d.u.i : d.u.b);
    if (y == 0)
        tpl_fail(c, "%s: float modulo", name);
    double m = fmod(x, y);
    if (m && ((m < 0) != (y < 0)))
        m += y;
    return m == (double)want;
}

int tpl_test(struct tctx *c, const char *name, const struct tv *v, struct tv *args, size_t nargs)
{
    struct tv a = nargs ? args[0] : tv_undef("argument");
    if (!strcmp(name, "defined"))
        return v->t != TV_UNDEF;
    if (!strcmp(name, "undefined"))
        return v->t == TV_UNDEF;
    if (!strcmp(name, "none"))
        return v->t == TV_NONE;
    if (!strcmp(name, "string"))
        return v->t == TV_STR;
    if (!strcmp(name, "number"))
        return v->t == TV_INT || v->t == TV_FLOAT || v->t == TV_BOOL;
    if (!strcmp(name, "integer"))
        return v->t == TV_INT;
    if (!strcmp(name, "float"))
        return v->t == TV_FLOAT;
    if (!strcmp(name, "boolean"))
        return v->t == TV_BOOL;
    if (!strcmp(name, "true") || !strcmp(name, "false"))
        return v->t == TV_BOOL && v->u.b == (name[0] == 't');
    if (!strcmp(name, "mapping"))
        return v->t == TV_DICT;
    if (!strcmp(name, "iterable"))
        return v->t == TV_STR || v->t == TV_LIST || v->t == TV_DICT || v->t == TV_UNDEF;
    if (!strcmp(name, "sequence"))
        return v->t == TV_STR || (v->t == TV_LIST && !v->u.l->lazy) || v->t == TV_DICT || v->t == TV_UNDEF;
    if (!strcmp(name, "callable"))
        return v->t == TV_FUNC || v->t == TV_METHOD || v->t == TV_MACRO || v->t == TV_UNDEF; /* jinja's Undefined too */
    if (!strcmp(name, "odd") || !strcmp(name, "even"))
        return mod_is(c, name, v, tv_int(2), name[0] == 'o');
    if (!strcmp(name, "divisibleby"))
        return mod_is(c, name, v, a, 0);
    if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "sameas"))
        return tv_equal(v, &a) && (name[0] != 's' || v->t == a.t);
    if (!strcmp(name, "ne"))
        return !tv_equal(v, &a);
    if (!strcmp(name, "lt") || !strcmp(name, "gt") || !strcmp(name, "le") || !strcmp(name, "ge")) {
        int r = tv_compare(c, v, &a);
        return name[0] == 'l' ? (name[1] == 't' ? r < 0 : r <= 0) : (name[1] == 't' ? r > 0 : r >= 0);
    }
    if (!strcmp(name, "in")) {
        if (a.t == TV_STR && v->t == TV_STR)
            return v->u.s.n <= a.u.s.n && (!v->u.s.n || ts_memmem(a.u.s.p, a.u.s.n, v->u.s.p, v->u.s.n));
        if (a.t == TV_LIST) {
            for (size_t i = 0; i < a.u.l->n; i++)
                if (tv_equal(&a.u.l->v[i], v))
                    return 1;
            return 0;
        }
        if (a.t == TV_DICT)
            return td_get(a.u.d, *v) != NULL;
        tpl_fail(c, "in: the container is not iterable");
    }
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) { /* jinja: str(value).islower() */
        struct tv sv = tv_to_str(c, v);
        v = &sv;
        struct tv m = ts_map_case(c, *v, name[0] == 'l' ? utf8proc_tolower : utf8proc_toupper);
        int cased = 0;
        for (size_t i = 0; i < v->u.s.n;) {
            utf8proc_int32_t cp;
            utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)v->u.s.p + i, (utf8proc_ssize_t)(v->u.s.n - i), &cp);
            cased |= l > 0 && ts_is_cased(cp);
            i += l > 0 ? (size_t)l : 1;
        }
        return cased && m.u.s.n == v->u.s.n && !memcmp(m.u.s.p, v->u.s.p, m.u.s.n);
    }
    tpl_fail(c, "test '%s' is not supported", name);
}

/* ---- methods ---- */

struct tv tpl_method(struct tctx *c, const struct tbound *m, struct tv *args, size_t nargs, const char **kwn,
                     struct tv *kwv, size_t nkw)
{
    struct tv self = m->self, none = tv_none();
    const char *n = m->name;
    if (self.t == TV_LOOP && n[1] == 'h') { /* loop.changed(a, ...): true when the values differ from the last call's */
        struct tlist *now = tl_new(c, nargs + 1), *was = self.u.loop->changed;
        now->tuple = 1;
        for (size_t i = 0; i < nargs; i++)
            tl_push(c, now, args[i]);
        struct tv a = tv_list_of(c, now), b = was ? tv_list_of(c, was) : tv_none();
        if (was && tv_equal(&a, &b))
            return tv_bool(0);
        self.u.loop->changed = now;
        return tv_bool(1);
    }
    if (self.t == TV_LOOP) { /* loop.cycle(a, b, ...) */
        if (!nargs)
            tpl_fail(c, "no items for cycling given");
        return args[self.u.loop->i % nargs];
    }
    if (self.t == TV_DICT) {
        if (!strcmp(n, "get")) {
            if (!nargs)
                tpl_fail(c, "get expected at least 1 argument");
            struct tv *x = td_get(self.u.d, args[0]);
            return x ? *x : nargs > 1 ? args[1] : none;
        }
        struct tlist *out = tl_new(c, self.u.d->n + 1);
        out->view = n[0] == 'i' ? "dict_items" : n[0] == 'k' ? "dict_keys" : "dict_values";
        for (size_t i = 0; i < self.u.d->n; i++)
            tl_push(c, out, n[0] == 'i' ? item_pair(c, self.u.d, i) : n[0] == 'k' ? self.u.d->k[i] : self.u.d->v[i]);
        return tv_list_of(c, out);
    }
    if (self.t == TV_LIST) {
        if (!nargs)
            tpl_fail(c, "%s expected an argument", n);
        int64_t k = 0;
        for (size_t i = 0; i < self.u.l->n; i++)
            if (tv_equal(&self.u.l->v[i], &args[0])) {
                if (n[0] == 'i')
                    return tv_int((int64_t)i);
                k++;
            }
        if (n[0] == 'i')
            tpl_fail(c, "the value is not in the list");
        return tv_int(k);
    }
    /* str */
    struct tv a0 = nargs ? args[0] : none;
    if (!strcmp(n, "startswith") || !strcmp(n, "endswith")) {
        if (!nargs)
            tpl_fail(c, "%s expected an argument", n);
        return tv_bool(ts_prefix_match(c, self, a0, n[0] == 'e'));
    }
    if (!strcmp(n, "split") || !strcmp(n, "rsplit")) {
        struct tv sep = kwarg(kwn, kwv, nkw, "sep", args, nargs, 0, none);
        struct tv mx = kwarg(kwn, kwv, nkw, "maxsplit", args, nargs, 1, tv_int(-1));
        return ts_split(c, self, sep, mx.t == TV_INT ? mx.u.i : -1, n[0] == 'r');
    }
    if (!strcmp(n, "strip") || !strcmp(n, "lstrip") || !strcmp(n, "rstrip")) {
        if (a0.t != TV_NONE && a0.t != TV_STR)
            tpl_fail(c, "%s arg must be None or str", n);
        return ts_strip(self, a0.t == TV_STR ? &a0 : NULL, n[0] != 'r', n[0] != 'l');
    }
    if (!strcmp(n, "upper") || !strcmp(n, "lower"))
        return ts_map_case(c, self, n[0] == 'u' ? utf8proc_toupper : utf8proc_tolower);
    if (!strcmp(n, "title"))
        return ts_py_title(c, self);
    if (!strcmp(n, "capitalize"))
        return ts_capitalize(c, self);
    if (!strcmp(n, "replace")) {
        if (nargs < 2)
            tpl_fail(c, "replace expected at least 2 arguments");
        return ts_replace(c, self, args[0], args[1], nargs > 2 && args[2].t == TV_INT ? args[2].u.i : -1);
    }
    if (!strcmp(n, "find") || !strcmp(n, "rfind"))
        return ts_find(self, tv_need_str(c, a0, n), n[0] == 'r');
    if (!strcmp(n, "count")) {
        tv_need_str(c, a0, n);
        int64_t k = 0;
        if (!a0.u.s.n)
            return tv_int((int64_t)u8_count(self.u.s.p, self.u.s.n) + 1);
        for (const char *p = self.u.s.p, *e = p + self.u.s.n; (p = ts_memmem(p, (size_t)(e - p), a0.u.s.p, a0.u.s.n));
             p += a0.u.s.n)
            k++;
        return tv_int(k);
    }
    if (!strcmp(n, "join")) {
        struct tlist *items = tv_iter(c, &a0);
        struct tbuf b = {0};
        for (size_t i = 0; i < items->n; i++) {
            if (i)
                tb_put(c, &b, self.u.s.p, self.u.s.n);
            tb_put(c, &b, tv_need_str(c, items->v[i], "join").u.s.p, items->v[i].u.s.n);
        }
        return tv_buf_str(&b);
    }
    if (!strcmp(n, "splitlines"))
        return tv_list_of(c, ts_splitlines(c, self));
    if (!strcmp(n, "islower") || !strcmp(n, "isupper")) /* jinja's tests `lower` and `upper` are these */
        return tv_bool(tpl_test(c, n + 2, &self, NULL, 0));
    if (!strcmp(n, "isdigit") || !strcmp(n, "isalpha") || !strcmp(n, "isspace") || !strcmp(n, "isalnum")) {
        if (!self.u.s.n)
            return tv_bool(0);
        for (size_t i = 0; i < self.u.s.n;) {
            utf8proc_int32_t cp;
            utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)self.u.s.p + i, (utf8proc_ssize_t)(self.u.s.n - i), &cp);
            size_t sl;
            utf8proc_category_t k = utf8proc_category(cp);
            int letter = k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
            int ok = n[2] == 'd' ? k == UTF8PROC_CATEGORY_ND
                   : n[4] == 'n' ? letter || (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO) /* isalnum */
                   : n[2] == 'a' ? letter
                                 : u8_is_space(self.u.s.p + i, self.u.s.n - i, &sl);
            if (!ok)
                return tv_bool(0);
            i += l > 0 ? (size_t)l : 1;
        }
        return tv_bool(1);
    }
    if (nkw)
        tpl_fail(c, "%s() takes no keyword arguments", n);
    return ts_method(c, n, self, args, nargs);
}

/* ---- globals ---- */

struct tv tpl_global_call(struct tctx *c, int fn, struct tv *args, size_t nargs, const char **kwn, struct tv *kwv,
                          size_t nkw)
{
    if (fn == G_RANGE) {
        int64_t a[3] = {0, 0, 1};
        if (!nargs || nargs > 3)
            tpl_fail(c, "range expected 1 to 3 arguments");
        for (size_t i = 0; i < nargs; i++) {
            if (args[i].t != TV_INT && args[i].t != TV_BOOL)
                tpl_fail(c, "range: '%s' object cannot be interpreted as an integer", tv_type_name(&args[i]));
            a[nargs == 1 ? 1 : i] = args[i].t == TV_INT ? args[i].u.i : args[i].u.b;
        }
        if (!a[2])
            tpl_fail(c, "range() arg 3 must not be zero");
        double count = ceil(((double)a[1] - (double)a[0]) / (double)a[2]);
        if (count > 100000) /* jinja's sandbox: MAX_RANGE */
            tpl_fail(c, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        struct tlist *l = tl_new(c, count > 0 ? (size_t)count + 1 : 1);
        for (int64_t i = a[0]; a[2] > 0 ? i < a[1] : i > a[1]; i += a[2])
            tl_push(c, l, tv_int(i));
        return tv_list_of(c, l);
    }
    if (fn == G_NAMESPACE || fn == G_DICT) {
        struct tv v = {.t = fn == G_DICT ? TV_DICT : TV_NS};
        v.u.d = td_new(c);
        for (size_t i = 0; i < nargs; i++) {
            if (args[i].t != TV_DICT)
                tpl_fail(c, "%s: positional arguments must be mappings", fn == G_DICT ? "dict" : "namespace");
            for (size_t k = 0; k < args[i].u.d->n; k++)
                td_set(c, v.u.d, args[i].u.d->k[k], args[i].u.d->v[k]);
        }
        for (size_t i = 0; i < nkw; i++)
            td_set(c, v.u.d, tv_strref(kwn[i], strlen(kwn[i])), kwv[i]);
        return v;
    }
    if (fn == G_RAISE) {
        struct tv m = nargs ? tv_to_str(c, &args[0]) : tv_strref("", 0);
        tpl_fail(c, "raise_exception: %.*s", (int)(m.u.s.n > 2000 ? 2000 : m.u.s.n), m.u.s.p);
    }
    if (fn == G_STRFTIME) {
        if (!nargs || args[0].t != TV_STR)
            tpl_fail(c, "strftime_now expected a format string");
        char *f = tpl_alloc(c, args[0].u.s.n + 1), out[512];
        memcpy(f, args[0].u.s.p, args[0].u.s.n);
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t n = strftime(out, sizeof out, f, &tm);
        return tv_str(c, out, n);
    }
    tpl_fail(c, "not callable");
}
