/* SPDX-License-Identifier: Apache-2.0 */
/* tpl_eval.c - runs a template's tree (tpl_internal.h) as jinja2 runs it: scopes (a loop iteration and a macro
 * call have their own; `if` has none), attribute and item lookup with jinja's fallbacks (a missing one is
 * undefined; using an undefined value for more than printing, testing or iterating is an error), Python's
 * operators, loops with `loop` and break/continue, macros, namespaces. Every node costs a step: a render is
 * bounded in steps, memory and output. */
#include "tpl_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void step(struct tctx *c, const struct tnode *n)
{
    c->line = n->line;
    if (++c->steps > c->maxsteps)
        tpl_fail(c, "the render takes more than its step limit (%llu)", (unsigned long long)c->maxsteps);
}

/* A scope of its own over parent, with room for SCOPE_ROOM names in the same allocation (a loop iteration's
 * target, `loop` and a few `set`s: one allocation per iteration, not three); more grow as any dict does. */
#define SCOPE_ROOM 4
static struct tscope *scope_new(struct tctx *c, struct tscope *parent)
{
    struct tscope *s = tpl_alloc_raw(c, sizeof *s + 2 * SCOPE_ROOM * sizeof(struct tv));
    struct tv *room = (struct tv *)(s + 1);
    s->parent = parent;
    s->vars = (struct tdict){.cap = SCOPE_ROOM, .k = room, .v = room + SCOPE_ROOM};
    return s;
}

static struct tv *lookup_slot(struct tscope *s, const char *name)
{
    for (size_t n = strlen(name); s; s = s->parent) {
        struct tv *v = td_gets(&s->vars, name, n);
        if (v)
            return v;
    }
    return NULL;
}

/* strings given as parts: written to the output one by one, or joined (one copy each) */
static void emit_parts(struct tctx *c, const struct tseg *seg, size_t k)
{
    for (size_t i = 0; i < k; i++)
        tpl_emit(c, seg[i].p, seg[i].n);
}

static struct tv join_parts(struct tctx *c, const struct tseg *seg, size_t k)
{
    size_t total = 0;
    for (size_t i = 0; i < k; i++)
        total += seg[i].n;
    char *o = tpl_alloc_raw(c, total + 1), *w = o;
    for (size_t i = 0; i < k; i++) {
        memcpy(w, seg[i].p, seg[i].n);
        w += seg[i].n;
    }
    return tv_strref(o, total);
}

/* a variable's value; one kept as parts (TV_ROPE) is joined now, once, in its slot */
static struct tv lookup(struct tctx *c, struct tscope *s, const char *name)
{
    struct tv *v = lookup_slot(s, name);
    if (!v)
        return tv_undef(name);
    if (v->t == TV_ROPE)
        *v = join_parts(c, v->u.rope->seg, v->u.rope->k);
    return *v;
}

void tpl_assign(struct tctx *c, struct tscope *s, const char *name, struct tv v)
{
    td_set(c, &s->vars, tv_strref(name, strlen(name)), v);
}

static struct tv bound(struct tctx *c, struct tv self, const char *name)
{
    struct tbound *m = tpl_alloc(c, sizeof *m);
    m->self = self;
    m->name = name;
    struct tv v = {.t = TV_METHOD};
    v.u.m = m;
    return v;
}

static struct tv loop_attr(struct tctx *c, struct tv lv, const char *name)
{
    const struct tloop *l = lv.u.loop;
    size_t n = l->items->n;
    if (tpl_name_is(name, "index"))
        return tv_int((int64_t)l->i + 1);
    if (tpl_name_is(name, "index0"))
        return tv_int((int64_t)l->i);
    if (tpl_name_is(name, "revindex"))
        return tv_int((int64_t)(n - l->i));
    if (tpl_name_is(name, "revindex0"))
        return tv_int((int64_t)(n - l->i - 1));
    if (tpl_name_is(name, "first"))
        return tv_bool(l->i == 0);
    if (tpl_name_is(name, "last"))
        return tv_bool(l->i + 1 == n);
    if (tpl_name_is(name, "length"))
        return tv_int((int64_t)n);
    if (tpl_name_is(name, "depth"))
        return tv_int(l->depth);
    if (tpl_name_is(name, "depth0"))
        return tv_int(l->depth - 1);
    if (tpl_name_is(name, "previtem"))
        return l->i ? l->items->v[l->i - 1] : tv_undef("previtem");
    if (tpl_name_is(name, "nextitem"))
        return l->i + 1 < n ? l->items->v[l->i + 1] : tv_undef("nextitem");
    if (tpl_name_is(name, "cycle") || tpl_name_is(name, "changed"))
        return bound(c, lv, name);
    return tv_undef(name);
}

/* jinja's getattr: the object's attribute (a method), else its item, else undefined */
static struct tv get_attr(struct tctx *c, struct tv v, const char *name)
{
    switch (v.t) {
    case TV_UNDEF:
        tpl_undefined_use(c, &v);
    case TV_DICT:
        if (tpl_has_method(&v, name))
            return bound(c, v, name);
        /* fall through */
    case TV_NS: {
        struct tv *x = td_gets(v.u.d, name, strlen(name));
        return x ? *x : tv_undef(name);
    }
    case TV_LOOP:
        return loop_attr(c, v, name);
    default:
        return tpl_has_method(&v, name) ? bound(c, v, name) : tv_undef(name);
    }
}

/* jinja's getitem: the item, else (a string key) the attribute, else undefined */
static struct tv get_item(struct tctx *c, struct tv v, struct tv k)
{
    if (v.t == TV_UNDEF)
        tpl_undefined_use(c, &v);
    if (v.t == TV_LIST && (v.u.l->lazy || v.u.l->view)) /* a generator or a dict's view has no items to index */
        return tv_undef("item");
    if ((v.t == TV_LIST || v.t == TV_STR) && (k.t == TV_INT || k.t == TV_BOOL)) {
        int64_t i = k.t == TV_INT ? k.u.i : k.u.b;
        int64_t n = v.t == TV_LIST ? (int64_t)v.u.l->n : (int64_t)u8_count(v.u.s.p, v.u.s.n);
        if (i < 0)
            i += n;
        if (i < 0 || i >= n)
            return tv_undef("item");
        if (v.t == TV_LIST)
            return v.u.l->v[i];
        size_t a = u8_offset(v.u.s.p, v.u.s.n, (size_t)i), b = u8_offset(v.u.s.p, v.u.s.n, (size_t)i + 1);
        return tv_strref(v.u.s.p + a, b - a);
    }
    if (v.t == TV_DICT) {
        struct tv *x = td_get(v.u.d, k);
        if (x)
            return *x;
    }
    if (k.t == TV_STR) {
        char *name = tpl_alloc(c, k.u.s.n + 1);
        memcpy(name, k.u.s.p, k.u.s.n);
        if (v.t == TV_DICT)
            return tpl_has_method(&v, name) ? bound(c, v, name) : tv_undef(name);
        return get_attr(c, v, name);
    }
    return tv_undef("item");
}

/* ---- calls: arguments (with `*args` and `**kwargs`), macros, call blocks and their caller ---- */

struct targs { /* a call's arguments, unpacked */
    struct tv *v, *kw;
    const char **kwn;
    size_t n, nkw;
};

/* Arguments of a call, filter or test node, evaluated (no unpacking: tpl_call_expr does it for calls). */
static struct tv *tpl_eval_args(struct tctx *c, struct tscope *s, const struct tnode *n, struct tv **kw)
{
    struct tv *a = tpl_alloc(c, (n->nkids + 1) * sizeof *a);
    for (size_t i = 0; i < n->nkids; i++)
        a[i] = tpl_eval(c, s, n->kids[i]);
    *kw = tpl_alloc(c, (n->nnames + 1) * sizeof **kw);
    for (size_t i = 0; i < n->nnames; i++)
        (*kw)[i] = tpl_eval(c, s, n->kwvals[i]);
    return a;
}

/* Runs body with its output captured; returns the text. The output it set aside is on c->captures until then, so
 * an error inside (unwinding past this frame) does not lose it: tpl_uncapture frees it. */
static struct tv tpl_capture(struct tctx *c, struct tscope *s, struct tnode **body, size_t n)
{
    struct tcapture *k = tpl_alloc(c, sizeof *k);
    *k = (struct tcapture){c->out, c->outn, c->outcap, c->captures};
    c->captures = k;
    c->out = NULL;
    c->outn = c->outcap = 0;
    tpl_exec(c, s, body, n);
    struct tv r = tv_str(c, c->out ? c->out : "", c->outn);
    free(c->out);
    c->out = k->out;
    c->outn = k->outn;
    c->outcap = k->outcap;
    c->captures = k->outer;
    return r;
}

/* A macro's call: its parameters bound in a scope of their own over the template's (a caller's over the scope its
 * block stands in), `caller` among them where its body names it (jinja's Macro.caller). */
static struct tv call_macro(struct tctx *c, const struct tnode *m, struct tv *args, size_t nargs, const char **kwn,
                            struct tv *kwv, size_t nkw)
{
    if (nargs > m->nnames)
        tpl_fail(c, "macro '%s' takes not more than %zu argument(s)", m->name, m->nnames);
    if (++c->depth > c->maxdepth)
        tpl_fail(c, "macros call each other too deeply");
    struct tscope *ms = scope_new(c, m->scope ? m->scope : c->root);
    for (size_t i = 0; i < m->nnames; i++) {
        struct tv v = i < nargs ? args[i] : tv_undef(m->names[i]);
        int given = i < nargs;
        for (size_t k = 0; k < nkw; k++)
            if (!strcmp(kwn[k], m->names[i])) {
                if (given)
                    tpl_fail(c, "macro '%s' got multiple values for argument '%s'", m->name, m->names[i]);
                v = kwv[k];
                given = 1;
            }
        if (!given && m->kwvals[i])
            v = tpl_eval(c, ms, m->kwvals[i]);
        tpl_assign(c, ms, m->names[i], v);
    }
    if (m->op) /* the body names `caller`: undefined unless one is given */
        tpl_assign(c, ms, "caller", tv_undef("caller"));
    for (size_t k = 0; k < nkw; k++) {
        size_t i = 0;
        while (i < m->nnames && strcmp(kwn[k], m->names[i]))
            i++;
        if (i < m->nnames)
            continue;
        if (!m->op || strcmp(kwn[k], "caller"))
            tpl_fail(c, "macro '%s' takes no keyword argument '%s'", m->name, kwn[k]);
        tpl_assign(c, ms, "caller", kwv[k]);
    }
    struct tv r = tpl_capture(c, ms, m->kids, m->nkids);
    c->depth--;
    return r;
}

static struct tv tpl_call(struct tctx *c, struct tscope *s, const struct tv *f, struct tv *args, size_t nargs,
                   const char **kwn, struct tv *kwv, size_t nkw)
{
    switch (f->t) {
    case TV_FUNC: return tpl_global_call(c, f->u.fn, args, nargs, kwn, kwv, nkw);
    case TV_METHOD: return tpl_method(c, f->u.m, args, nargs, kwn, kwv, nkw);
    case TV_MACRO: return call_macro(c, f->u.mac, args, nargs, kwn, kwv, nkw);
    case TV_UNDEF: tpl_undefined_use(c, f);
    default: tpl_fail(c, "'%s' object is not callable", tv_type_name(f));
    }
}

/* A call's or a filter's arguments: its own, then `*x`'s items after the positional ones and `**d`'s items after
 * the keywords (a name given twice fails, as in Python); caller: a call block's, passed as the keyword `caller`. */
static void tpl_args(struct tctx *c, struct tscope *s, const struct tnode *e, const struct tv *caller, struct targs *g)
{
    g->v = tpl_eval_args(c, s, e, &g->kw);
    g->n = e->nkids;
    g->nkw = e->nnames;
    g->kwn = (const char **)e->names;
    struct tlist *star = NULL;
    struct tv dd = {0};
    if (e->c) {
        struct tv x = tpl_eval(c, s, e->c);
        if (x.t != TV_LIST && x.t != TV_DICT && x.t != TV_STR)
            tpl_fail(c, "Value after * must be an iterable, not %s", tv_type_name(&x));
        star = tv_iter(c, &x);
    }
    if (e->b) {
        dd = tpl_eval(c, s, e->b);
        if (dd.t != TV_DICT)
            tpl_fail(c, "argument after ** must be a mapping, not %s", tv_type_name(&dd));
    }
    size_t more = star ? star->n : 0, morekw = (e->b ? dd.u.d->n : 0) + (caller != NULL);
    if (!more && !morekw)
        return;
    struct tv *a2 = tpl_alloc(c, (g->n + more + 1) * sizeof *a2),
              *k2 = tpl_alloc(c, (g->nkw + morekw + 1) * sizeof *k2);
    const char **n2 = tpl_alloc(c, (g->nkw + morekw + 1) * sizeof *n2);
    memcpy(a2, g->v, g->n * sizeof *a2);
    for (size_t i = 0; i < more; i++)
        a2[g->n++] = star->v[i];
    memcpy(k2, g->kw, g->nkw * sizeof *k2);
    if (g->nkw)
        memcpy(n2, g->kwn, g->nkw * sizeof *n2);
    for (size_t i = 0; e->b && i < dd.u.d->n; i++) {
        const struct tv *k = &dd.u.d->k[i];
        if (k->t != TV_STR)
            tpl_fail(c, "keywords must be strings");
        char *name = tpl_alloc(c, k->u.s.n + 1);
        memcpy(name, k->u.s.p, k->u.s.n);
        for (size_t j = 0; j < g->nkw; j++)
            if (!strcmp(n2[j], name))
                tpl_fail(c, "got multiple values for keyword argument '%s'", name);
        n2[g->nkw] = name;
        k2[g->nkw++] = dd.u.d->v[i];
    }
    if (caller) {
        n2[g->nkw] = "caller";
        k2[g->nkw++] = *caller;
    }
    g->v = a2;
    g->kw = k2;
    g->kwn = n2;
}

static struct tv tpl_call_expr(struct tctx *c, struct tscope *s, const struct tnode *e, const struct tv *caller)
{
    struct tv f = tpl_eval(c, s, e->a);
    struct targs g;
    tpl_args(c, s, e, caller, &g);
    c->line = e->line;
    if (caller && f.t != TV_MACRO) /* only a macro takes a caller */
        tpl_fail(c, "%s() got an unexpected keyword argument 'caller'", tv_type_name(&f));
    return tpl_call(c, s, &f, g.v, g.n, g.kwn, g.kw, g.nkw);
}

/* {% call(params) m(args) %}body{% endcall %}: m called with `caller`, a macro of the block's parameters and body
 * over the scope the block stands in; the call's text printed. */
static void tpl_call_block(struct tctx *c, struct tscope *s, const struct tnode *n)
{
    struct tnode *m = tpl_alloc(c, sizeof *m);
    *m = (struct tnode){.kind = N_MACRO,
                        .line = n->line,
                        .name = "caller",
                        .names = n->names,
                        .nnames = n->nnames,
                        .kwvals = n->kwvals,
                        .kids = n->kids,
                        .nkids = n->nkids,
                        .scope = s};
    struct tv caller = {.t = TV_MACRO};
    caller.u.mac = m;
    struct tv r = tpl_call_expr(c, s, n->a, &caller);
    tpl_emit_value(c, &r);
}

#define CHAIN_MAX 32

/* a + b + c ... (or a ~ b ~ c ...): the operands evaluated left to right; strings joined with one copy each
 * (emit: written straight to the output, no string built: `{{ '<|im_start|>' + m.role + '\n' + m.content }}`;
 * CHAIN_KEEP: not joined at all, its parts kept for a `set`: `{% set content = ... %}{{ content }}`, Llama 3's),
 * else folded pairwise as Python adds them. A long conversation's text is copied once, not once per `+`. */
#define CHAIN_KEEP 2
static struct tv chain(struct tctx *c, struct tscope *s, const struct tnode *e, int emit)
{
    const struct tnode *spine[CHAIN_MAX];
    int n = 0;
    const struct tnode *x = e;
    while (x->kind == E_BIN && x->op == e->op && n < CHAIN_MAX - 1) {
        spine[n++] = x;
        x = x->a;
    }
    struct tv v[CHAIN_MAX];
    int k = 0, strs = 1;
    v[k] = tpl_eval(c, s, x); /* the leftmost operand, then each right one */
    strs &= v[k++].t == TV_STR;
    for (int i = n - 1; i >= 0; i--) {
        step(c, spine[i]);
        v[k] = tpl_eval(c, s, spine[i]->b);
        strs &= v[k++].t == TV_STR;
    }
    c->line = e->line;
    if (e->op == OP_CONCAT && !strs) {
        for (int i = 0; i < k; i++)
            v[i] = tv_to_str(c, &v[i]);
        strs = 1;
    }
    if (!strs) {
        struct tv acc = v[0];
        for (int i = 1; i < k; i++) {
            c->line = spine[n - i]->line;
            acc = tpl_binop(c, e->op, acc, v[i]);
        }
        if (emit == 1) {
            struct tbuf b = {0};
            tv_str_into(c, &b, &acc);
            tpl_emit(c, b.p, b.n);
        }
        return acc;
    }
    struct tseg seg[CHAIN_MAX];
    for (int i = 0; i < k; i++)
        seg[i] = (struct tseg){v[i].u.s.p, v[i].u.s.n};
    if (emit == CHAIN_KEEP) {
        struct trope *r = tpl_alloc(c, sizeof *r + (size_t)k * sizeof r->seg[0]);
        memcpy(r->seg, seg, (size_t)k * sizeof *seg);
        r->k = (size_t)k;
        struct tv rv = {.t = TV_ROPE};
        rv.u.rope = r;
        return rv;
    }
    if (emit) {
        emit_parts(c, seg, (size_t)k);
        return tv_none();
    }
    return join_parts(c, seg, (size_t)k);
}

struct tv tpl_eval(struct tctx *c, struct tscope *s, const struct tnode *e)
{
    step(c, e);
    struct tv a, b, r, *kw;
    switch (e->kind) {
    case E_CONST:
        return e->val;
    case E_NAME:
        return lookup(c, s, e->name);
    case E_LIST:
    case E_TUPLE:
        r.t = TV_LIST;
        r.u.l = tl_new(c, e->nkids + 1);
        r.u.l->tuple = e->kind == E_TUPLE;
        for (size_t i = 0; i < e->nkids; i++)
            tl_push(c, r.u.l, tpl_eval(c, s, e->kids[i]));
        return r;
    case E_DICT:
        r.t = TV_DICT;
        r.u.d = td_new(c);
        for (size_t i = 0; i + 1 < e->nkids; i += 2) {
            a = tpl_eval(c, s, e->kids[i]);
            td_set(c, r.u.d, a, tpl_eval(c, s, e->kids[i + 1]));
        }
        return r;
    case E_ATTR:
        return get_attr(c, tpl_eval(c, s, e->a), e->name);
    case E_ITEM:
        a = tpl_eval(c, s, e->a);
        return get_item(c, a, tpl_eval(c, s, e->b));
    case E_SLICE: {
        struct tv p[3];
        a = tpl_eval(c, s, e->a);
        for (int k = 0; k < 3; k++)
            p[k] = e->kids[k] ? tpl_eval(c, s, e->kids[k]) : tv_none();
        return tpl_get_slice(c, a, p);
    }
    case E_CALL:
        return tpl_call_expr(c, s, e, NULL);
    case E_FILTER: {
        a = tpl_eval(c, s, e->a);
        struct targs g;
        tpl_args(c, s, e, NULL, &g);
        c->line = e->line;
        return tpl_filter(c, s, e->name, a, g.v, g.n, g.kwn, g.kw, g.nkw);
    }
    case E_TEST: {
        a = tpl_eval(c, s, e->a);
        struct tv *args = tpl_eval_args(c, s, e, &kw);
        c->line = e->line;
        int t = tpl_test(c, e->name, &a, args, e->nkids);
        return tv_bool(e->op ? !t : t);
    }
    case E_NOT:
        a = tpl_eval(c, s, e->a);
        return tv_bool(!tv_truth(&a));
    case E_NEG:
    case E_POS:
        a = tpl_eval(c, s, e->a);
        if (!tv_is_num(&a)) {
            if (a.t == TV_UNDEF)
                tpl_undefined_use(c, &a);
            tpl_fail(c, "bad operand type for unary %c: '%s'", e->kind == E_NEG ? '-' : '+', tv_type_name(&a));
        }
        if (e->kind == E_POS)
            return a.t == TV_BOOL ? tv_int(a.u.b) : a;
        if (a.t == TV_FLOAT)
            return tv_float(-a.u.f);
        if (tv_inum(&a) == INT64_MIN)
            tpl_fail(c, "an integer beyond 64 bits");
        return tv_int(-tv_inum(&a));
    case E_BIN:
        if (e->op == OP_ADD || e->op == OP_CONCAT)
            return chain(c, s, e, 0);
        a = tpl_eval(c, s, e->a);
        b = tpl_eval(c, s, e->b);
        c->line = e->line;
        return tpl_binop(c, e->op, a, b);
    case E_CMP:
        a = tpl_eval(c, s, e->kids[0]);
        for (size_t i = 1; i < e->nkids; i++) {
            b = tpl_eval(c, s, e->kids[i]);
            c->line = e->line;
            if (!tpl_compare(c, e->ops[i - 1], &a, &b))
                return tv_bool(0);
            a = b;
        }
        return tv_bool(1);
    case E_AND:
        a = tpl_eval(c, s, e->a);
        return tv_truth(&a) ? tpl_eval(c, s, e->b) : a;
    case E_OR:
        a = tpl_eval(c, s, e->a);
        return tv_truth(&a) ? a : tpl_eval(c, s, e->b);
    case E_COND:
        b = tpl_eval(c, s, e->b);
        if (tv_truth(&b))
            return tpl_eval(c, s, e->a);
        return e->c ? tpl_eval(c, s, e->c) : tv_undef("else");
    default:
        tpl_fail(c, "a statement where an expression was expected");
    }
}

static void bind_targets(struct tctx *c, struct tscope *s, const struct tnode *n, struct tv v)
{
    if (n->nnames == 1) {
        tpl_assign(c, s, n->names[0], v);
        return;
    }
    struct tlist *items = tv_iter(c, &v);
    if (items->n != n->nnames)
        tpl_fail(c, "cannot unpack %zu values into %zu names", items->n, n->nnames);
    for (size_t i = 0; i < n->nnames; i++)
        tpl_assign(c, s, n->names[i], items->v[i]);
}

static void exec_for(struct tctx *c, struct tscope *s, const struct tnode *n)
{
    struct tv it = tpl_eval(c, s, n->a);
    struct tlist *all = tv_iter(c, &it), *items = all;
    if (n->b) { /* the loop's own filter: items that fail it are not iterations (loop.length counts the rest) */
        items = tl_new(c, all->n + 1);
        for (size_t i = 0; i < all->n; i++) {
            struct tscope *fs = scope_new(c, s);
            bind_targets(c, fs, n, all->v[i]);
            struct tv ok = tpl_eval(c, fs, n->b);
            if (tv_truth(&ok))
                tl_push(c, items, all->v[i]);
        }
    }
    struct tloop *l = tpl_alloc(c, sizeof *l);
    l->items = items;
    l->depth = 1; /* jinja counts only a recursive loop's levels (refused at load); a nested loop is depth 1 too */
    struct tv lv = {.t = TV_LOOP};
    lv.u.loop = l;
    for (l->i = 0; l->i < items->n; l->i++) {
        step(c, n);
        struct tscope *is = scope_new(c, s); /* each iteration starts afresh, as jinja's frames do */
        bind_targets(c, is, n, items->v[l->i]);
        tpl_assign(c, is, "loop", lv);
        tpl_exec(c, is, n->kids, n->nkids);
        if (c->loopctl == 1) {
            c->loopctl = 0;
            break;
        }
        c->loopctl = 0;
    }
    if (!items->n)
        tpl_exec(c, s, n->body2, n->nbody2);
}

void tpl_exec(struct tctx *c, struct tscope *s, struct tnode **body, size_t nbody)
{
    for (size_t i = 0; i < nbody && !c->loopctl; i++) {
        const struct tnode *n = body[i];
        step(c, n);
        struct tv v;
        switch (n->kind) {
        case N_TEXT:
            tpl_emit(c, n->val.u.s.p, n->val.u.s.n);
            break;
        case N_OUT: {
            if (n->a->kind == E_BIN && (n->a->op == OP_ADD || n->a->op == OP_CONCAT)) {
                step(c, n->a);
                chain(c, s, n->a, 1); /* written as it is evaluated */
                break;
            }
            if (n->a->kind == E_NAME) { /* a variable: one kept as parts is written part by part */
                step(c, n->a);
                struct tv *slot = lookup_slot(s, n->a->name);
                if (slot && slot->t == TV_ROPE) {
                    emit_parts(c, slot->u.rope->seg, slot->u.rope->k);
                    break;
                }
                v = slot ? *slot : tv_undef(n->a->name);
            } else {
                v = tpl_eval(c, s, n->a);
            }
            c->line = n->line;
            tpl_emit_value(c, &v);
            break;
        }
        case N_IF:
            v = tpl_eval(c, s, n->a);
            if (tv_truth(&v))
                tpl_exec(c, s, n->kids, n->nkids);
            else
                tpl_exec(c, s, n->body2, n->nbody2);
            break;
        case N_FOR:
            if (++c->depth > c->maxdepth)
                tpl_fail(c, "loops nested too deeply");
            exec_for(c, s, n);
            c->depth--;
            break;
        case N_SET:
            if (!n->c && n->nnames == 1 && n->a->kind == E_BIN && (n->a->op == OP_ADD || n->a->op == OP_CONCAT)) {
                step(c, n->a);
                v = chain(c, s, n->a, CHAIN_KEEP); /* strings: kept as parts until read */
            } else {
                v = tpl_eval(c, s, n->a);
            }
            c->line = n->line;
            if (n->c) {
                struct tv ns = tpl_eval(c, s, n->c);
                if (ns.t != TV_NS)
                    tpl_fail(c, "cannot assign attribute on non-namespace object");
                td_set(c, ns.u.d, tv_strref(n->name, strlen(n->name)), v);
            } else {
                bind_targets(c, s, n, v);
            }
            break;
        case N_SETBLOCK:
            tpl_assign(c, s, n->name, tpl_capture(c, s, n->kids, n->nkids));
            break;
        case N_MACRO:
            v.t = TV_MACRO;
            v.u.mac = (struct tnode *)n;
            tpl_assign(c, s, n->name, v);
            break;
        case N_BREAK:
            c->loopctl = 1;
            break;
        case N_CONTINUE:
            c->loopctl = 2;
            break;
        case N_BLOCK:
            tpl_exec(c, s, n->kids, n->nkids);
            break;
        case N_CALLBLOCK:
            tpl_call_block(c, s, n);
            break;
        default:
            tpl_fail(c, "an expression where a statement was expected");
        }
    }
}
