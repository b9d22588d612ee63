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

_Noreturn void tpl_undefined_use(struct tctx *c, const struct tv *v)
{
    tpl_fail(c, "'%s' is undefined", v->undef_name ? v->undef_name : "value");
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

/* Python's slice indices for a sequence of n */
static void slice_bounds(struct tctx *c, struct tv *p, int64_t n, int64_t *start, int64_t *stop, int64_t *stepv)
{
    int64_t st = 1;
    if (p[2].t != TV_NONE && p[2].t != TV_UNDEF) {
        if (p[2].t != TV_INT || !p[2].u.i)
            tpl_fail(c, "slice step must be a non-zero integer");
        st = p[2].u.i;
    }
    int64_t lo = st > 0 ? 0 : -1, hi = st > 0 ? n : n - 1, v[2];
    int64_t def[2] = {st > 0 ? 0 : n - 1, st > 0 ? n : -1};
    for (int k = 0; k < 2; k++) {
        if (p[k].t == TV_NONE || p[k].t == TV_UNDEF) {
            v[k] = def[k];
            continue;
        }
        if (p[k].t != TV_INT)
            tpl_fail(c, "slice indices must be integers or None");
        int64_t x = p[k].u.i;
        if (x < 0)
            x += n;
        v[k] = x < lo ? lo : x > hi ? hi : x;
    }
    *start = v[0];
    *stop = v[1];
    *stepv = st;
}

static struct tv get_slice(struct tctx *c, struct tv v, struct tv *p)
{
    if (v.t == TV_UNDEF)
        tpl_undefined_use(c, &v);
    if (v.t == TV_DICT || v.t == TV_NS)
        tpl_fail(c, "unhashable type: 'slice'");
    if ((v.t != TV_LIST && v.t != TV_STR) || (v.t == TV_LIST && (v.u.l->lazy || v.u.l->view)))
        return tv_undef("item"); /* jinja's getitem: what cannot be sliced gives undefined */
    struct tlist *items = tv_iter(c, &v);
    int64_t a, b, st;
    slice_bounds(c, p, (int64_t)items->n, &a, &b, &st);
    struct tlist *out = tl_new(c, 8);
    for (int64_t i = a; st > 0 ? i < b : i > b; i += st)
        tl_push(c, out, items->v[i]);
    if (v.t == TV_LIST) {
        struct tv r = {.t = TV_LIST};
        r.u.l = out;
        return r;
    }
    struct tbuf buf = {0};
    for (size_t i = 0; i < out->n; i++)
        tb_put(c, &buf, out->v[i].u.s.p, out->v[i].u.s.n);
    return tv_strref(buf.p ? buf.p : "", buf.n);
}

static int contains(struct tctx *c, const struct tv *hay, const struct tv *needle)
{
    switch (hay->t) {
    case TV_UNDEF:
        return 0;
    case TV_STR:
        if (needle->t != TV_STR)
            tpl_fail(c, "'in <string>' requires string as left operand, not %s", tv_type_name(needle));
        return !needle->u.s.n || (hay->u.s.n >= needle->u.s.n &&
                                  ts_memmem(hay->u.s.p, hay->u.s.n, needle->u.s.p, needle->u.s.n) != NULL);
    case TV_LIST: {
        const struct tlist *l = tv_iter(c, hay); /* (a generator that fails when iterated fails here) */
        for (size_t i = 0; i < l->n; i++)
            if (tv_equal(&l->v[i], needle))
                return 1;
        return 0;
    }
    case TV_DICT:
    case TV_NS:
        if ((needle->t == TV_LIST && !needle->u.l->tuple) || needle->t == TV_DICT || needle->t == TV_NS)
            tpl_fail(c, "unhashable type: '%s'", tv_type_name(needle));
        return td_get(hay->u.d, *needle) != NULL;
    default:
        tpl_fail(c, "argument of type '%s' is not iterable", tv_type_name(hay));
    }
}

static int is_num(const struct tv *v)
{
    return v->t == TV_INT || v->t == TV_FLOAT || v->t == TV_BOOL;
}

static double fnum(const struct tv *v)
{
    return v->t == TV_FLOAT ? v->u.f : v->t == TV_INT ? (double)v->u.i : (double)v->u.b;
}

static int64_t inum(const struct tv *v)
{
    return v->t == TV_INT ? v->u.i : v->u.b;
}

static struct tv repeat(struct tctx *c, struct tv seq, int64_t k)
{
    if (seq.t == TV_LIST && (seq.u.l->lazy || seq.u.l->view))
        tpl_fail(c, "unsupported operand type(s) for *: '%s' and 'int'", tv_type_name(&seq));
    if (k < 0)
        k = 0;
    size_t unit = seq.t == TV_STR ? seq.u.s.n : seq.u.l->n;
    if (unit && (uint64_t)k > (c->arena.limit / (unit * (seq.t == TV_STR ? 1 : sizeof(struct tv)))))
        tpl_fail(c, "a repetition beyond the render's memory limit");
    if (seq.t == TV_STR) {
        struct tbuf b = {0};
        for (int64_t i = 0; i < k; i++)
            tb_put(c, &b, seq.u.s.p, seq.u.s.n);
        return tv_strref(b.p ? b.p : "", b.n);
    }
    struct tv r = {.t = TV_LIST};
    r.u.l = tl_new(c, unit * (size_t)k + 1);
    r.u.l->tuple = seq.u.l->tuple;
    for (int64_t i = 0; i < k; i++)
        for (size_t j = 0; j < unit; j++)
            tl_push(c, r.u.l, seq.u.l->v[j]);
    return r;
}

static _Noreturn void bad_operands(struct tctx *c, const char *op, const struct tv *a, const struct tv *b)
{
    if (a->t == TV_UNDEF)
        tpl_undefined_use(c, a);
    if (b->t == TV_UNDEF)
        tpl_undefined_use(c, b);
    tpl_fail(c, "unsupported operand type(s) for %s: '%s' and '%s'", op, tv_type_name(a), tv_type_name(b));
}

static struct tv binop(struct tctx *c, int op, struct tv a, struct tv b)
{
    static const char *const names[] = {"", "+", "-", "*", "/", "//", "%", "**"};
    int64_t r;
    if (op == OP_CONCAT || (op == OP_ADD && a.t == TV_STR && b.t == TV_STR)) { /* one allocation, one copy each */
        struct tv x = op == OP_CONCAT ? tv_to_str(c, &a) : a, y = op == OP_CONCAT ? tv_to_str(c, &b) : b;
        char *o = tpl_alloc_raw(c, x.u.s.n + y.u.s.n + 1);
        memcpy(o, x.u.s.p, x.u.s.n);
        memcpy(o + x.u.s.n, y.u.s.p, y.u.s.n);
        return tv_strref(o, x.u.s.n + y.u.s.n);
    }
    if (op == OP_ADD && a.t == TV_LIST && b.t == TV_LIST) {
        if (a.u.l->tuple != b.u.l->tuple || a.u.l->lazy || b.u.l->lazy || a.u.l->view || b.u.l->view)
            tpl_fail(c, "can only concatenate %s to %s", a.u.l->tuple ? "tuple" : "list", a.u.l->tuple ? "tuple" : "list");
        struct tv l = {.t = TV_LIST};
        l.u.l = tl_new(c, a.u.l->n + b.u.l->n + 1);
        l.u.l->tuple = a.u.l->tuple;
        for (size_t i = 0; i < a.u.l->n; i++)
            tl_push(c, l.u.l, a.u.l->v[i]);
        for (size_t i = 0; i < b.u.l->n; i++)
            tl_push(c, l.u.l, b.u.l->v[i]);
        return l;
    }
    if (op == OP_MUL && (a.t == TV_STR || a.t == TV_LIST) && (b.t == TV_INT || b.t == TV_BOOL))
        return repeat(c, a, inum(&b));
    if (op == OP_MUL && (b.t == TV_STR || b.t == TV_LIST) && (a.t == TV_INT || a.t == TV_BOOL))
        return repeat(c, b, inum(&a));
    if (op == OP_MOD && a.t == TV_STR)
        return ts_percent(c, a, b);
    if (!is_num(&a) || !is_num(&b))
        bad_operands(c, names[op], &a, &b);
    int ints = a.t != TV_FLOAT && b.t != TV_FLOAT;
    int64_t x = ints ? inum(&a) : 0, y = ints ? inum(&b) : 0;
    double fx = fnum(&a), fy = fnum(&b);
    switch (op) {
    case OP_ADD:
        if (ints && __builtin_add_overflow(x, y, &r))
            tpl_fail(c, "an integer beyond 64 bits");
        return ints ? tv_int(r) : tv_float(fx + fy);
    case OP_SUB:
        if (ints && __builtin_sub_overflow(x, y, &r))
            tpl_fail(c, "an integer beyond 64 bits");
        return ints ? tv_int(r) : tv_float(fx - fy);
    case OP_MUL:
        if (ints && __builtin_mul_overflow(x, y, &r))
            tpl_fail(c, "an integer beyond 64 bits");
        return ints ? tv_int(r) : tv_float(fx * fy);
    case OP_DIV:
        if (fy == 0)
            tpl_fail(c, "division by zero");
        return tv_float(fx / fy);
    case OP_FLOORDIV:
    case OP_MOD:
        if (ints) {
            if (!y)
                tpl_fail(c, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1)
                tpl_fail(c, "an integer beyond 64 bits");
            int64_t q = x / y, m = x % y;
            if (m && ((m < 0) != (y < 0))) { /* Python floors */
                q--;
                m += y;
            }
            return tv_int(op == OP_MOD ? m : q);
        }
        if (fy == 0)
            tpl_fail(c, "float division by zero");
        if (op == OP_FLOORDIV)
            return tv_float(floor(fx / fy));
        {
            double m = fmod(fx, fy);
            if (m && ((m < 0) != (fy < 0)))
                m += fy;
            return tv_float(m);
        }
    default: /* OP_POW */
        if (ints && y >= 0) {
            int64_t p = 1;
            for (int64_t i = 0; i < y; i++)
                if (__builtin_mul_overflow(p, x, &p))
                    tpl_fail(c, "an integer beyond 64 bits");
            return tv_int(p);
        }
        if (fx == 0 && fy < 0)
            tpl_fail(c, "0.0 cannot be raised to a negative power");
        return tv_float(pow(fx, fy));
    }
}

static int compare(struct tctx *c, int op, const struct tv *a, const struct tv *b)
{
    switch (op) {
    case OP_EQ:
        return tv_equal(a, b);
    case OP_NE:
        return !tv_equal(a, b);
    case OP_IN:
        return contains(c, b, a);
    case OP_NOTIN:
        return !contains(c, b, a);
    default: {
        if (a->t == TV_UNDEF)
            tpl_undefined_use(c, a);
        if (b->t == TV_UNDEF)
            tpl_undefined_use(c, b);
        int r = tv_compare(c, a, b);
        return op == OP_LT ? r < 0 : op == OP_LE ? r <= 0 : op == OP_GT ? r > 0 : r >= 0;
    }
    }
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
            acc = binop(c, e->op, acc, v[i]);
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
        return get_slice(c, a, p);
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
        if (!is_num(&a)) {
            if (a.t == TV_UNDEF)
                tpl_undefined_use(c, &a);
            tpl_fail(c, "bad operand type for unary %c: '%s'", e->kind == E_NEG ? '-' : '+', tv_type_name(&a));
        }
        if (e->kind == E_POS)
            return a.t == TV_BOOL ? tv_int(a.u.b) : a;
        if (a.t == TV_FLOAT)
            return tv_float(-a.u.f);
        if (inum(&a) == INT64_MIN)
            tpl_fail(c, "an integer beyond 64 bits");
        return tv_int(-inum(&a));
    case E_BIN:
        if (e->op == OP_ADD || e->op == OP_CONCAT)
            return chain(c, s, e, 0);
        a = tpl_eval(c, s, e->a);
        b = tpl_eval(c, s, e->b);
        c->line = e->line;
        return binop(c, e->op, a, b);
    case E_CMP:
        a = tpl_eval(c, s, e->kids[0]);
        for (size_t i = 1; i < e->nkids; i++) {
            b = tpl_eval(c, s, e->kids[i]);
            c->line = e->line;
            if (!compare(c, e->ops[i - 1], &a, &b))
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
            struct tscope *fs = tpl_alloc(c, sizeof *fs);
            fs->parent = s;
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
        struct tscope *is = tpl_alloc(c, sizeof *is); /* each iteration starts afresh, as jinja's frames do */
        is->parent = s;
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
