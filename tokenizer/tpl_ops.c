/* SPDX-License-Identifier: Apache-2.0 */
/* tpl_ops.c - Python's operators on template values (tpl_internal.h): arithmetic with Python's int/float rules
 * (floor division and modulo signs, 64-bit overflow refused, `str % x` formatting), sequence repetition and
 * concatenation, comparisons and ordering, `in`, and slices with Python's index clamping. Values only: the
 * evaluator (tpl_eval.c) evaluates the operands. */
#include "tpl_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

struct tv tpl_get_slice(struct tctx *c, struct tv v, struct tv *p)
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

int tpl_contains(struct tctx *c, const struct tv *hay, const struct tv *needle)
{
    switch (hay->t) {
    case TV_UNDEF: return 0;
    case TV_STR:
        if (needle->t != TV_STR)
            tpl_fail(c, "'in <string>' requires string as left operand, not %s", tv_type_name(needle));
        return !needle->u.s.n ||
               (hay->u.s.n >= needle->u.s.n && ts_memmem(hay->u.s.p, hay->u.s.n, needle->u.s.p, needle->u.s.n) != NULL);
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
    default: tpl_fail(c, "argument of type '%s' is not iterable", tv_type_name(hay));
    }
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

struct tv tpl_binop(struct tctx *c, int op, struct tv a, struct tv b)
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
            tpl_fail(c, "can only concatenate %s to %s", a.u.l->tuple ? "tuple" : "list",
                     a.u.l->tuple ? "tuple" : "list");
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
        return repeat(c, a, tv_inum(&b));
    if (op == OP_MUL && (b.t == TV_STR || b.t == TV_LIST) && (a.t == TV_INT || a.t == TV_BOOL))
        return repeat(c, b, tv_inum(&a));
    if (op == OP_MOD && a.t == TV_STR)
        return ts_percent(c, a, b);
    if (!tv_is_num(&a) || !tv_is_num(&b))
        bad_operands(c, names[op], &a, &b);
    int ints = a.t != TV_FLOAT && b.t != TV_FLOAT;
    int64_t x = ints ? tv_inum(&a) : 0, y = ints ? tv_inum(&b) : 0;
    double fx = tv_fnum(&a), fy = tv_fnum(&b);
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

int tpl_compare(struct tctx *c, int op, const struct tv *a, const struct tv *b)
{
    switch (op) {
    case OP_EQ: return tv_equal(a, b);
    case OP_NE: return !tv_equal(a, b);
    case OP_IN: return tpl_contains(c, b, a);
    case OP_NOTIN: return !tpl_contains(c, b, a);
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
