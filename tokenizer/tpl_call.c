/* SPDX-License-Identifier: Apache-2.0 */
/* tpl_call.c - calls in the chat-template engine: arguments (with jinja's `*args` and `**kwargs` unpacking in a
 * call), macros, and call blocks (`{% call m(x) %}body{% endcall %}`: m runs with `caller`, a macro whose body is
 * the block's, seeing the variables where the block stands - MiniCPM3's tool template builds its classes so). */
#include "tpl_internal.h"

#include <stdlib.h>
#include <string.h>

/* Arguments of a call, filter or test node, evaluated (no unpacking: tpl_call_expr does it for calls). */
struct tv *tpl_eval_args(struct tctx *c, struct tscope *s, const struct tnode *n, struct tv **kw)
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
struct tv tpl_capture(struct tctx *c, struct tscope *s, struct tnode **body, size_t n)
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

void tpl_uncapture(struct tctx *c, struct tcapture *upto)
{
    while (c->captures != upto) {
        struct tcapture *k = c->captures;
        free(c->out);
        c->out = k->out;
        c->outn = k->outn;
        c->outcap = k->outcap;
        c->captures = k->outer;
    }
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
    struct tscope *ms = tpl_alloc(c, sizeof *ms);
    ms->parent = m->scope ? m->scope : c->root;
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

struct tv tpl_call(struct tctx *c, struct tscope *s, const struct tv *f, struct tv *args, size_t nargs,
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
void tpl_args(struct tctx *c, struct tscope *s, const struct tnode *e, const struct tv *caller, struct targs *g)
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

struct tv tpl_call_expr(struct tctx *c, struct tscope *s, const struct tnode *e, const struct tv *caller)
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
void tpl_call_block(struct tctx *c, struct tscope *s, const struct tnode *n)
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
