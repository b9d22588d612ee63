/* SPDX-License-Identifier: Apache-2.0 */
/* tpl_parse.h - what the chat template's lexer (tpl_lex.c) and parser (tpl_parse.c) share. */
#ifndef XPYD_TPL_PARSE_H
#define XPYD_TPL_PARSE_H

#include "tpl_internal.h"

enum { T_EOF, T_DATA, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STRING, T_INT, T_FLOAT, T_OP };

struct ttok {
    int t, line;
    const char *p;
    size_t n;
};

struct parser {
    jmp_buf jb;
    char *err;
    size_t errlen;
    struct tarena *arena;
    const char *src;
    size_t len;
    struct ttok *toks;
    size_t ntok, cap, at;
    int depth;
    int saw_caller; /* the name `caller` was read: the macro being parsed takes one (jinja's Macro.caller) */
};
void parse_args(struct parser *ps, struct tnode *n); /* after the '(' of a call, filter or test */

#define MAX_DEPTH 200 /* nesting of expressions and blocks: bounds the parser's and the evaluator's stacks */

_Noreturn void perr(struct parser *ps, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void *palloc(struct parser *ps, size_t n); /* in the template's arena; fails the parse past its limit */
void tpl_lex(struct parser *ps);           /* the whole source into ps->toks, ending with T_EOF */
struct tv tpl_string_value(struct parser *ps, const struct ttok *t); /* a string literal's value */

/* tpl_parse.c: the token cursor and the expression grammar */
struct nvec { /* a growing array of node pointers in the arena */
    struct tnode **v;
    size_t n, cap;
};
void nv_push(struct parser *ps, struct nvec *a, struct tnode *x);
struct ttok *cur(struct parser *ps);
int is_op(struct parser *ps, const char *op);
int is_name(struct parser *ps, const char *name);
void expect_op(struct parser *ps, const char *op);
const char *take_name(struct parser *ps);
struct tnode *node(struct parser *ps, int kind, int line);
void enter(struct parser *ps); /* one level deeper (bounded by MAX_DEPTH); the caller decrements ps->depth */
struct tnode *parse_expr(struct parser *ps); /* a whole expression, the conditional one included */
struct tnode *parse_or(struct parser *ps);   /* without the conditional (a for loop's iterable) */

#endif
