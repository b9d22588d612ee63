/* SPDX-License-Identifier: Apache-2.0 */
/* tpl_stmt.c - a chat template's statements (if/elif/else, for with its filter and else, set and block set,
 * namespace attribute assignment, macro, break/continue, transformers' generation block) and the entry point
 * tpl_parse; expressions are tpl_parse.c's. A tag outside these is refused with its line. */
#include "tpl_internal.h"
#include "tpl_parse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------- statements ---------------- */

static void end_block(struct parser *ps)
{
    if (cur(ps)->t != T_BLOCK_END)
        perr(ps, cur(ps)->line, "expected the end of the tag");
    ps->at++;
}

/* A macro's or a caller's parameters, with their defaults, up to and past the ')' */
static void parse_params(struct parser *ps, struct tnode *n, int line)
{
    const char *names[64];
    struct tnode *defs[64];
    size_t k = 0;
    while (!is_op(ps, ")")) {
        if (k == 64)
            perr(ps, line, "too many macro parameters");
        names[k] = take_name(ps);
        defs[k] = NULL;
        if (is_op(ps, "=")) {
            ps->at++;
            defs[k] = parse_expr(ps);
        }
        k++;
        if (!is_op(ps, ","))
            break;
        ps->at++;
    }
    expect_op(ps, ")");
    n->names = palloc(ps, (k ? k : 1) * sizeof *names);
    n->kwvals = palloc(ps, (k ? k : 1) * sizeof *defs);
    memcpy(n->names, names, k * sizeof *names);
    memcpy(n->kwvals, defs, k * sizeof *defs);
    n->nnames = k;
}

/* Statements until a {% name %} in `ends` (a space-separated list); the name found is left current. */
static void parse_body(struct parser *ps, const char *ends, struct nvec *out, const char **found);

/* n's statements up to {% end %} (its name, as `end`), past that tag */
static void body_until(struct parser *ps, struct tnode *n, const char *end)
{
    struct nvec body = {0};
    const char *f;
    parse_body(ps, end, &body, &f);
    n->kids = body.v;
    n->nkids = body.n;
    ps->at += 2;
    end_block(ps);
}

static const char *tag_name_at(struct parser *ps)
{
    struct ttok *t = &ps->toks[ps->at + 1];
    if (t->t != T_NAME)
        perr(ps, t->line, "a tag without a name");
    char *s = palloc(ps, t->n + 1);
    memcpy(s, t->p, t->n);
    return s;
}

static int in_list(const char *name, const char *list)
{
    size_t n = strlen(name);
    for (const char *p = list; p && *p;) {
        const char *e = strchr(p, ' ');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == n && !memcmp(p, name, n))
            return 1;
        p = e ? e + 1 : NULL;
    }
    return 0;
}

static void target_names(struct parser *ps, struct tnode *n)
{
    const char *names[16];
    size_t k = 0;
    int paren = is_op(ps, "(");
    if (paren)
        ps->at++;
    do {
        if (k && is_op(ps, ","))
            ps->at++;
        if (k == 16)
            perr(ps, cur(ps)->line, "too many names to unpack");
        names[k++] = take_name(ps);
    } while (is_op(ps, ","));
    if (paren)
        expect_op(ps, ")");
    n->names = palloc(ps, k * sizeof *names);
    memcpy(n->names, names, k * sizeof *names);
    n->nnames = k;
}

static struct tnode *parse_stmt(struct parser *ps)
{
    int line = cur(ps)->line;
    const char *name = tag_name_at(ps);
    ps->at += 2;
    struct tnode *n;
    enter(ps);
    if (!strcmp(name, "if")) {
        n = node(ps, N_IF, line);
        n->a = parse_expr(ps);
        end_block(ps);
        struct nvec body = {0}, els = {0};
        const char *f;
        parse_body(ps, "elif else endif", &body, &f);
        n->kids = body.v;
        n->nkids = body.n;
        struct tnode *tail = n;
        while (!strcmp(f, "elif")) {
            struct tnode *e = node(ps, N_IF, cur(ps)->line);
            ps->at += 2;
            e->a = parse_expr(ps);
            end_block(ps);
            struct nvec b = {0};
            parse_body(ps, "elif else endif", &b, &f);
            e->kids = b.v;
            e->nkids = b.n;
            tail->body2 = palloc(ps, sizeof *tail->body2);
            tail->body2[0] = e;
            tail->nbody2 = 1;
            tail = e;
        }
        if (!strcmp(f, "else")) {
            ps->at += 2;
            end_block(ps);
            parse_body(ps, "endif", &els, &f);
            tail->body2 = els.v;
            tail->nbody2 = els.n;
        }
        ps->at += 2;
        end_block(ps);
    } else if (!strcmp(name, "for")) {
        n = node(ps, N_FOR, line);
        target_names(ps, n);
        if (!is_name(ps, "in"))
            perr(ps, cur(ps)->line, "expected 'in'");
        ps->at++;
        n->a = parse_or(ps); /* jinja: no conditional expression here (its 'if' filters the loop) */
        if (is_name(ps, "if")) {
            ps->at++;
            n->b = parse_expr(ps);
        }
        if (is_name(ps, "recursive"))
            perr(ps, line, "recursive loops are not supported");
        end_block(ps);
        struct nvec body = {0}, els = {0};
        const char *f;
        parse_body(ps, "else endfor", &body, &f);
        n->kids = body.v;
        n->nkids = body.n;
        if (!strcmp(f, "else")) {
            ps->at += 2;
            end_block(ps);
            parse_body(ps, "endfor", &els, &f);
            n->body2 = els.v;
            n->nbody2 = els.n;
        }
        ps->at += 2;
        end_block(ps);
    } else if (!strcmp(name, "set")) {
        if (cur(ps)->t == T_NAME && ps->toks[ps->at + 1].t == T_BLOCK_END) { /* {% set x %}...{% endset %} */
            n = node(ps, N_SETBLOCK, line);
            n->name = take_name(ps);
            end_block(ps);
            body_until(ps, n, "endset");
        } else {
            n = node(ps, N_SET, line);
            if (cur(ps)->t == T_NAME && ps->toks[ps->at + 1].t == T_OP && ps->toks[ps->at + 1].n == 1 &&
                ps->toks[ps->at + 1].p[0] == '.') { /* {% set ns.attr = ... %} */
                n->c = node(ps, E_NAME, line);
                n->c->name = take_name(ps);
                ps->at++;
                n->name = take_name(ps);
            } else {
                target_names(ps, n);
            }
            expect_op(ps, "=");
            n->a = parse_expr(ps);
            if (is_op(ps, ",")) { /* set a, b = x, y */
                struct nvec v = {0};
                nv_push(ps, &v, n->a);
                while (is_op(ps, ",")) {
                    ps->at++;
                    nv_push(ps, &v, parse_expr(ps));
                }
                n->a = node(ps, E_TUPLE, line);
                n->a->kids = v.v;
                n->a->nkids = v.n;
            }
            end_block(ps);
        }
    } else if (!strcmp(name, "macro")) {
        n = node(ps, N_MACRO, line);
        n->name = take_name(ps);
        expect_op(ps, "(");
        parse_params(ps, n, line);
        end_block(ps);
        int outer = ps->saw_caller;
        ps->saw_caller = 0;
        struct nvec body = {0};
        const char *f;
        parse_body(ps, "endmacro", &body, &f);
        n->op = ps->saw_caller; /* it takes a caller */
        ps->saw_caller = outer;
        n->kids = body.v;
        n->nkids = body.n;
        ps->at += 2;
        if (cur(ps)->t == T_NAME)
            ps->at++; /* {% endmacro name %} */
        end_block(ps);
    } else if (!strcmp(name, "call")) { /* {% call(params) m(args) %}body{% endcall %} */
        n = node(ps, N_CALLBLOCK, line);
        if (is_op(ps, "(")) {
            ps->at++;
            parse_params(ps, n, line);
        }
        n->a = parse_expr(ps);
        if (n->a->kind != E_CALL)
            perr(ps, line, "expected a call after 'call'");
        end_block(ps);
        body_until(ps, n, "endcall");
    } else if (!strcmp(name, "break") || !strcmp(name, "continue")) {
        n = node(ps, name[0] == 'b' ? N_BREAK : N_CONTINUE, line);
        end_block(ps);
    } else if (!strcmp(name, "generation")) { /* transformers' assistant-mask marker: its body, as it is */
        n = node(ps, N_BLOCK, line);
        end_block(ps);
        body_until(ps, n, "endgeneration");
    } else {
        perr(ps, line, "the '%s' tag is not supported", name);
    }
    ps->depth--;
    return n;
}

static void parse_body(struct parser *ps, const char *ends, struct nvec *out, const char **found)
{
    for (;;) {
        struct ttok *t = cur(ps);
        if (t->t == T_EOF) {
            if (ends)
                perr(ps, t->line, "the template ends inside a block (expected one of: %s)", ends);
            *found = NULL;
            return;
        }
        if (t->t == T_DATA) {
            struct tnode *n = node(ps, N_TEXT, t->line);
            n->val = tv_strref(t->p, t->n);
            nv_push(ps, out, n);
            ps->at++;
        } else if (t->t == T_VAR_BEGIN) {
            struct tnode *n = node(ps, N_OUT, t->line);
            ps->at++;
            n->a = parse_expr(ps);
            if (cur(ps)->t != T_VAR_END)
                perr(ps, cur(ps)->line, "expected '}}'");
            ps->at++;
            nv_push(ps, out, n);
        } else if (t->t == T_BLOCK_BEGIN) {
            const char *name = tag_name_at(ps);
            if (ends && in_list(name, ends)) {
                *found = name;
                return;
            }
            if (in_list(name, "endif endfor endset endmacro endcall else elif endgeneration"))
                perr(ps, t->line, "unexpected '%s'", name);
            nv_push(ps, out, parse_stmt(ps));
        } else {
            perr(ps, t->line, "unexpected text in a tag");
        }
    }
}

struct tpl *tpl_parse(const char *src, size_t len, char *err, size_t errlen)
{
    struct tpl *volatile t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    t->arena.limit = 64u << 20;
    /* newlines normalized to \n, one trailing newline dropped (jinja's keep_trailing_newline=False) */
    char *s = tarena_alloc(&t->arena, len + 1);
    size_t n = 0;
    for (size_t i = 0; s && i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n')
        n--;
    struct parser ps = {.err = err, .errlen = errlen, .arena = &t->arena, .src = s, .len = n};
    if (!s || setjmp(ps.jb)) {
        if (!s)
            snprintf(err, errlen, "the template is too large");
        free(ps.toks);
        tarena_free(&t->arena);
        free(t);
        return NULL;
    }
    tpl_lex(&ps);
    struct nvec body = {0};
    const char *f;
    parse_body(&ps, NULL, &body, &f);
    t->body = body.v;
    t->nbody = body.n;
    free(ps.toks);
    return t;
}
