/* SPDX-License-Identifier: Apache-2.0 */
/* tpl_parse.c - a chat template's tokens (tpl_lex.c) to its tree (tpl_internal.h), as jinja2's parser reads them:
 * operator precedence, filters and tests binding tighter than binary operators, the statements of the supported
 * subset. Anything outside it is refused here, with its line. */
#include "tpl_internal.h"
#include "tpl_parse.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------- parser ---------------- */

struct ttok *cur(struct parser *ps)
{
    return &ps->toks[ps->at];
}

int is_op(struct parser *ps, const char *op)
{
    struct ttok *t = cur(ps);
    return t->t == T_OP && t->n == strlen(op) && !memcmp(t->p, op, t->n);
}

int is_name(struct parser *ps, const char *name)
{
    struct ttok *t = cur(ps);
    return t->t == T_NAME && t->n == strlen(name) && !memcmp(t->p, name, t->n);
}

void expect_op(struct parser *ps, const char *op)
{
    if (!is_op(ps, op))
        perr(ps, cur(ps)->line, "expected '%s'", op);
    ps->at++;
}

const char *take_name(struct parser *ps)
{
    struct ttok *t = cur(ps);
    if (t->t != T_NAME)
        perr(ps, t->line, "expected a name");
    char *s = palloc(ps, t->n + 1);
    memcpy(s, t->p, t->n);
    ps->at++;
    return s;
}

struct tnode *node(struct parser *ps, int kind, int line)
{
    struct tnode *n = palloc(ps, sizeof *n);
    n->kind = kind;
    n->line = line;
    return n;
}

void nv_push(struct parser *ps, struct nvec *a, struct tnode *x)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 4;
        struct tnode **nv = palloc(ps, cap * sizeof *nv);
        if (a->n)
            memcpy(nv, a->v, a->n * sizeof *nv);
        a->v = nv;
        a->cap = cap;
    }
    a->v[a->n++] = x;
}

static struct tnode *parse_unary(struct parser *ps, int with_filter);

void enter(struct parser *ps)
{
    if (++ps->depth > MAX_DEPTH)
        perr(ps, cur(ps)->line, "nested too deeply");
}

/* call arguments after '(' : positional and name=value */
void parse_args(struct parser *ps, struct tnode *n)
{
    struct nvec pos = {0}, kwv = {0};
    const char *kwn[64];
    size_t nkw = 0;
    while (!is_op(ps, ")")) {
        if (is_op(ps, "*") || is_op(ps, "**")) { /* f(a, *rest, k=v, **more), as jinja orders them */
            int two = is_op(ps, "**");
            if (n->kind == E_TEST)
                perr(ps, cur(ps)->line, "argument unpacking is supported in calls and filters only");
            if (n->b || (n->c && !two))
                perr(ps, cur(ps)->line, "invalid syntax for function call expression");
            ps->at++;
            if (two)
                n->b = parse_expr(ps);
            else
                n->c = parse_expr(ps);
        } else if (n->b || (n->c && !(cur(ps)->t == T_NAME && ps->toks[ps->at + 1].t == T_OP &&
                                        ps->toks[ps->at + 1].n == 1 && ps->toks[ps->at + 1].p[0] == '='))) {
            perr(ps, cur(ps)->line, "invalid syntax for function call expression");
        } else if (cur(ps)->t == T_NAME && ps->toks[ps->at + 1].t == T_OP && ps->toks[ps->at + 1].n == 1 &&
            ps->toks[ps->at + 1].p[0] == '=') {
            if (nkw == 64)
                perr(ps, cur(ps)->line, "too many keyword arguments");
            kwn[nkw++] = take_name(ps);
            ps->at++;
            nv_push(ps, &kwv, parse_expr(ps));
        } else {
            if (nkw)
                perr(ps, cur(ps)->line, "a positional argument after keyword arguments");
            nv_push(ps, &pos, parse_expr(ps));
        }
        if (!is_op(ps, ","))
            break;
        ps->at++;
    }
    expect_op(ps, ")");
    n->kids = pos.v;
    n->nkids = pos.n;
    n->kwvals = kwv.v;
    n->nnames = nkw;
    if (nkw) {
        n->names = palloc(ps, nkw * sizeof *n->names);
        memcpy(n->names, kwn, nkw * sizeof *kwn);
    }
}

static struct tnode *parse_primary(struct parser *ps)
{
    struct ttok *t = cur(ps);
    struct tnode *n;
    enter(ps);
    if (t->t == T_NAME) {
        static const char *const lits[] = {"true", "True", "false", "False", "none", "None"};
        for (int k = 0; k < 6; k++)
            if (t->n == strlen(lits[k]) && !memcmp(t->p, lits[k], t->n)) {
                n = node(ps, E_CONST, t->line);
                n->val = k < 4 ? tv_bool(k < 2) : tv_none();
                ps->at++;
                ps->depth--;
                return n;
            }
        n = node(ps, E_NAME, t->line);
        n->name = take_name(ps);
        if (!strcmp(n->name, "caller"))
            ps->saw_caller = 1;
    } else if (t->t == T_STRING) {
        n = node(ps, E_CONST, t->line);
        n->val = tpl_string_value(ps, t);
        ps->at++;
        while (cur(ps)->t == T_STRING) { /* adjacent literals join */
            struct tv b = tpl_string_value(ps, cur(ps));
            char *j = palloc(ps, n->val.u.s.n + b.u.s.n + 1);
            memcpy(j, n->val.u.s.p, n->val.u.s.n);
            memcpy(j + n->val.u.s.n, b.u.s.p, b.u.s.n);
            n->val = tv_strref(j, n->val.u.s.n + b.u.s.n);
            ps->at++;
        }
    } else if (t->t == T_INT || t->t == T_FLOAT) {
        char buf[80];
        size_t k = 0;
        for (size_t i = 0; i < t->n && k + 1 < sizeof buf; i++)
            if (t->p[i] != '_')
                buf[k++] = t->p[i];
        buf[k] = 0;
        n = node(ps, E_CONST, t->line);
        if (t->t == T_INT) {
            char *end;
            int base = k > 2 && buf[0] == '0' ? ((buf[1] | 0x20) == 'x' ? 16 : (buf[1] | 0x20) == 'o' ? 8
                                                : (buf[1] | 0x20) == 'b' ? 2 : 10) : 10;
            errno = 0;
            long long v = strtoll(base == 10 ? buf : buf + 2, &end, base);
            if (*end || errno == ERANGE)
                perr(ps, t->line, "an integer beyond 64 bits");
            n->val = tv_int(v);
        } else {
            n->val = tv_float(strtod(buf, NULL));
        }
        ps->at++;
    } else if (is_op(ps, "(")) {
        ps->at++;
        if (is_op(ps, ")")) {
            ps->at++;
            n = node(ps, E_TUPLE, t->line);
        } else {
            struct tnode *e = parse_expr(ps);
            if (is_op(ps, ",")) {
                struct nvec v = {0};
                nv_push(ps, &v, e);
                while (is_op(ps, ",")) {
                    ps->at++;
                    if (is_op(ps, ")"))
                        break;
                    nv_push(ps, &v, parse_expr(ps));
                }
                e = node(ps, E_TUPLE, t->line);
                e->kids = v.v;
                e->nkids = v.n;
            }
            expect_op(ps, ")");
            n = e;
        }
    } else if (is_op(ps, "[")) {
        ps->at++;
        struct nvec v = {0};
        while (!is_op(ps, "]")) {
            nv_push(ps, &v, parse_expr(ps));
            if (!is_op(ps, ","))
                break;
            ps->at++;
        }
        expect_op(ps, "]");
        n = node(ps, E_LIST, t->line);
        n->kids = v.v;
        n->nkids = v.n;
    } else if (is_op(ps, "{")) {
        ps->at++;
        struct nvec v = {0};
        while (!is_op(ps, "}")) {
            nv_push(ps, &v, parse_expr(ps));
            expect_op(ps, ":");
            nv_push(ps, &v, parse_expr(ps));
            if (!is_op(ps, ","))
                break;
            ps->at++;
        }
        expect_op(ps, "}");
        n = node(ps, E_DICT, t->line);
        n->kids = v.v;
        n->nkids = v.n;
    } else {
        perr(ps, t->line, t->t == T_EOF || t->t == T_VAR_END || t->t == T_BLOCK_END ? "an expression is missing"
                                                                                     : "unexpected '%.*s'",
             (int)(t->n > 40 ? 40 : t->n), t->p);
    }
    ps->depth--;
    return n;
}

static struct tnode *parse_postfix(struct parser *ps, struct tnode *n)
{
    for (;;) {
        int line = cur(ps)->line;
        if (is_op(ps, ".")) {
            ps->at++;
            struct tnode *a;
            if (cur(ps)->t == T_INT) { /* x.0: an item */
                a = node(ps, E_ITEM, line);
                a->b = parse_primary(ps);
            } else {
                a = node(ps, E_ATTR, line);
                a->name = take_name(ps);
            }
            a->a = n;
            n = a;
        } else if (is_op(ps, "[")) {
            ps->at++;
            struct tnode *parts[3] = {0};
            int k = 0, slice = 0;
            for (;;) {
                if (!is_op(ps, ":") && !is_op(ps, "]"))
                    parts[k] = parse_expr(ps);
                if (is_op(ps, ":") && k < 2) {
                    slice = 1;
                    k++;
                    ps->at++;
                    continue;
                }
                break;
            }
            expect_op(ps, "]");
            struct tnode *a = node(ps, slice ? E_SLICE : E_ITEM, line);
            a->a = n;
            if (slice) {
                a->kids = palloc(ps, 3 * sizeof *a->kids);
                memcpy(a->kids, parts, sizeof parts);
                a->nkids = 3;
            } else {
                if (!parts[0])
                    perr(ps, line, "an empty subscript");
                a->b = parts[0];
            }
            n = a;
        } else if (is_op(ps, "(")) {
            ps->at++;
            struct tnode *a = node(ps, E_CALL, line);
            a->a = n;
            parse_args(ps, a);
            n = a;
        } else {
            return n;
        }
    }
}

static struct tnode *parse_filters(struct parser *ps, struct tnode *n)
{
    for (;;) {
        int line = cur(ps)->line;
        if (is_op(ps, "|")) {
            ps->at++;
            struct tnode *f = node(ps, E_FILTER, line);
            f->name = take_name(ps);
            while (is_op(ps, ".")) { /* dotted filter names are not supported, but say so */
                perr(ps, line, "filter '%s.' is not supported", f->name);
            }
            if (!tpl_filter_known(f->name))
                perr(ps, line, "filter '%s' is not supported", f->name);
            if (is_op(ps, "(")) {
                ps->at++;
                parse_args(ps, f);
            }
            f->a = n;
            n = f;
        } else if (is_name(ps, "is")) {
            ps->at++;
            int neg = 0;
            if (is_name(ps, "not")) {
                neg = 1;
                ps->at++;
            }
            struct tnode *f = node(ps, E_TEST, line);
            if (is_name(ps, "none") || is_name(ps, "true") || is_name(ps, "false") || is_name(ps, "None") ||
                is_name(ps, "True") || is_name(ps, "False")) {
                char *lower = palloc(ps, cur(ps)->n + 1);
                for (size_t i = 0; i < cur(ps)->n; i++)
                    lower[i] = (char)(cur(ps)->p[i] | 0x20);
                f->name = lower;
                ps->at++;
            } else {
                f->name = take_name(ps);
            }
            if (!tpl_test_known(f->name))
                perr(ps, line, "test '%s' is not supported", f->name);
            if (is_op(ps, "(")) {
                ps->at++;
                parse_args(ps, f);
            } else if ((cur(ps)->t == T_STRING || cur(ps)->t == T_INT || cur(ps)->t == T_FLOAT || is_op(ps, "[") ||
                        is_op(ps, "{") || cur(ps)->t == T_NAME) &&
                       !is_name(ps, "else") && !is_name(ps, "or") && !is_name(ps, "and")) {
                if (is_name(ps, "is"))
                    perr(ps, line, "You cannot chain multiple tests with is");
                struct nvec v = {0}; /* `is divisibleby 3`: one argument without parentheses, as jinja reads it */
                nv_push(ps, &v, parse_postfix(ps, parse_primary(ps)));
                f->kids = v.v;
                f->nkids = v.n;
            }
            f->a = n;
            f->op = neg;
            n = f;
        } else if (is_op(ps, "(")) {
            ps->at++;
            struct tnode *a = node(ps, E_CALL, line);
            a->a = n;
            parse_args(ps, a);
            n = a;
        } else {
            return n;
        }
    }
}

static struct tnode *parse_unary(struct parser *ps, int with_filter)
{
    int line = cur(ps)->line;
    struct tnode *n;
    enter(ps);
    if (is_op(ps, "-") || is_op(ps, "+")) {
        n = node(ps, is_op(ps, "-") ? E_NEG : E_POS, line);
        ps->at++;
        n->a = parse_unary(ps, 0);
    } else {
        n = parse_primary(ps);
    }
    n = parse_postfix(ps, n);
    if (with_filter)
        n = parse_filters(ps, n);
    ps->depth--;
    return n;
}

static struct tnode *binary(struct parser *ps, int op, struct tnode *a, struct tnode *b, int line)
{
    struct tnode *n = node(ps, E_BIN, line);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static int names_a_variable(const struct tnode *e)
{
    if (!e)
        return 0;
    if (e->kind == E_NAME)
        return 1;
    for (size_t i = 0; i < e->nkids; i++)
        if (names_a_variable(e->kids[i]))
            return 1;
    return names_a_variable(e->a) || names_a_variable(e->b) || names_a_variable(e->c);
}

static struct tnode *parse_pow(struct parser *ps)
{
    struct tnode *n = parse_unary(ps, 1);
    while (is_op(ps, "**")) {
        int line = cur(ps)->line;
        ps->at++;
        struct tnode *r = parse_unary(ps, 1);
        const struct tv *k = n->kind == E_NEG && n->a->kind == E_CONST ? &n->a->val : NULL;
        if (k && ((k->t == TV_INT && k->u.i) || (k->t == TV_BOOL && k->u.b) || k->t == TV_FLOAT) &&
            names_a_variable(r)) { /* (an integer -0 is written 0) */
            /* jinja folds -2 into the constant -2 and writes it into Python as `(-2 ** x)`, which Python reads
             * as -(2 ** x): what vLLM renders, so what this renders (a power of constants folds whole there) */
            n->a = binary(ps, OP_POW, n->a, r, line);
            continue;
        }
        n = binary(ps, OP_POW, n, r, line);
    }
    return n;
}

static struct tnode *parse_mul(struct parser *ps)
{
    struct tnode *n = parse_pow(ps);
    for (;;) {
        int op = is_op(ps, "*") ? OP_MUL : is_op(ps, "/") ? OP_DIV : is_op(ps, "//") ? OP_FLOORDIV
               : is_op(ps, "%") ? OP_MOD : 0;
        if (!op)
            return n;
        int line = cur(ps)->line;
        ps->at++;
        n = binary(ps, op, n, parse_pow(ps), line);
    }
}

static struct tnode *parse_concat(struct parser *ps)
{
    struct tnode *n = parse_mul(ps);
    while (is_op(ps, "~")) {
        int line = cur(ps)->line;
        ps->at++;
        n = binary(ps, OP_CONCAT, n, parse_mul(ps), line);
    }
    return n;
}

static struct tnode *parse_add(struct parser *ps)
{
    struct tnode *n = parse_concat(ps);
    for (;;) {
        int op = is_op(ps, "+") ? OP_ADD : is_op(ps, "-") ? OP_SUB : 0;
        if (!op)
            return n;
        int line = cur(ps)->line;
        ps->at++;
        n = binary(ps, op, n, parse_concat(ps), line);
    }
}

static int cmp_op(struct parser *ps)
{
    static const char *const ops[] = {"==", "!=", "<", "<=", ">", ">="};
    static const int codes[] = {OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE};
    for (int k = 0; k < 6; k++)
        if (is_op(ps, ops[k])) {
            ps->at++;
            return codes[k];
        }
    if (is_name(ps, "in")) {
        ps->at++;
        return OP_IN;
    }
    if (is_name(ps, "not") && ps->toks[ps->at + 1].t == T_NAME && ps->toks[ps->at + 1].n == 2 &&
        !memcmp(ps->toks[ps->at + 1].p, "in", 2)) {
        ps->at += 2;
        return OP_NOTIN;
    }
    return 0;
}

static struct tnode *parse_compare(struct parser *ps)
{
    int line = cur(ps)->line;
    struct tnode *first = parse_add(ps);
    int op = cmp_op(ps);
    if (!op)
        return first;
    struct nvec v = {0};
    int ops[64], nops = 0;
    nv_push(ps, &v, first);
    while (op) {
        if (nops == 64)
            perr(ps, line, "too many comparisons in a row");
        ops[nops++] = op;
        nv_push(ps, &v, parse_add(ps));
        op = cmp_op(ps);
    }
    struct tnode *n = node(ps, E_CMP, line);
    n->kids = v.v;
    n->nkids = v.n;
    n->ops = palloc(ps, (size_t)nops * sizeof *n->ops);
    memcpy(n->ops, ops, (size_t)nops * sizeof *ops);
    return n;
}

static struct tnode *parse_not(struct parser *ps)
{
    if (is_name(ps, "not")) {
        struct tnode *n = node(ps, E_NOT, cur(ps)->line);
        ps->at++;
        enter(ps);
        n->a = parse_not(ps);
        ps->depth--;
        return n;
    }
    return parse_compare(ps);
}

/* `x and y and ...` / `x or y or ...`: left-associative, over the next tighter level */
static struct tnode *parse_logic(struct parser *ps, const char *word, int kind,
                                 struct tnode *(*operand)(struct parser *ps))
{
    struct tnode *n = operand(ps);
    while (is_name(ps, word)) {
        struct tnode *a = node(ps, kind, cur(ps)->line);
        ps->at++;
        a->a = n;
        a->b = operand(ps);
        n = a;
    }
    return n;
}

static struct tnode *parse_and(struct parser *ps)
{
    return parse_logic(ps, "and", E_AND, parse_not);
}

struct tnode *parse_or(struct parser *ps)
{
    return parse_logic(ps, "or", E_OR, parse_and);
}

struct tnode *parse_expr(struct parser *ps)
{
    enter(ps);
    struct tnode *n = parse_or(ps);
    while (is_name(ps, "if")) {
        struct tnode *c = node(ps, E_COND, cur(ps)->line);
        ps->at++;
        c->a = n;
        c->b = parse_or(ps);
        if (is_name(ps, "else")) {
            ps->at++;
            c->c = parse_expr(ps);
        }
        n = c;
    }
    ps->depth--;
    return n;
}
