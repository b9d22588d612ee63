/* SPDX-License-Identifier: Apache-2.0 */
/* tpl_internal.h - the chat-template renderer's insides (xpyd_template.h is its interface): a Jinja2 subset as
 * transformers configures it (trim_blocks, lstrip_blocks, loop controls, an immutable sandbox), with Python's
 * value semantics.
 *   tpl_parse.c  the lexer (whitespace control) and the parser: source -> tree of struct tnode
 *   tpl_value.c  values (struct tv), the arena every render allocates from, str()/repr()/JSON, comparisons
 *   tpl_eval.c   the evaluator: statements, expressions, scopes, loops, calls (arguments and their unpacking,
 *                macros, call blocks)
 *   tpl_ops.c    Python's operators on values: arithmetic, comparisons, `in`, slices
 *   tpl_lib.c    filters, tests, string and dict methods, globals (range, namespace, raise_exception, ...)
 *   tpl_str.c    Python's str operations;  tpl_fmt.c  Python's % formatting and round
 * Errors unwind with longjmp to the entry point (tpl_fail): everything a render allocated is in its arena. */
#ifndef XPYD_TPL_INTERNAL_H
#define XPYD_TPL_INTERNAL_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---- arena: bump allocation in chunks, bounded; freed at once ---- */
struct tarena {
    struct tchunk *head;
    size_t used, limit;
};
struct tctx;
void *tpl_alloc(struct tctx *c, size_t n); /* zeroed; fails the render past the arena's limit */
void *tpl_alloc_raw(struct tctx *c, size_t n); /* the same, not zeroed (text) */
void tarena_free(struct tarena *a);
void *tarena_alloc(struct tarena *a, size_t n); /* NULL past the limit */

/* ---- values ---- */
enum tv_type { TV_UNDEF = 0, TV_NONE, TV_BOOL, TV_INT, TV_FLOAT, TV_STR, TV_LIST, TV_DICT, TV_NS, TV_FUNC,
               TV_METHOD, TV_MACRO, TV_LOOP,
               TV_ROPE /* tpl_eval.c's alone: `set x = a + b + ...` of strings kept as its parts in x's slot, written
                        * by `{{ x }}` part by part, joined where anything else reads x (never seen outside) */ };
struct tseg {
    const char *p;
    size_t n;
};
struct trope {
    size_t k;
    struct tseg seg[];
};
struct tlist {
    size_t n, cap;
    struct tv *v;
    int tuple; /* printed as Python prints a tuple: (a, b) */
    int lazy;  /* what jinja gives as a generator or iterator (map, select*, reject*, unique, reverse, items): true
                * even when empty, without len(), last or indexing (undefined); `| list` makes it a list */
    const char *poison; /* a generator over what cannot be iterated: it fails with this when iterated, as jinja's */
    const char *view;   /* dict.items()/keys()/values(): printed as Python's dict_items([...]), not indexable */
};
struct tdict { /* insertion-ordered, as Python's */
    size_t n, cap;
    struct tv *k, *v;
};
struct tv {
    enum tv_type t;
    union {
        int b;
        int64_t i;
        double f;
        struct { const char *p; size_t n; } s;
        struct tlist *l;
        struct tdict *d;   /* TV_DICT and TV_NS */
        int fn;            /* TV_FUNC: enum tpl_global */
        struct tbound *m;  /* TV_METHOD */
        struct tnode *mac; /* TV_MACRO */
        struct tloop *loop;
        struct trope *rope;
    } u;
    const char *undef_name; /* TV_UNDEF: what was missing, for messages */
};
struct tbound {
    struct tv self;
    const char *name;
};
struct tloop {
    struct tlist *items;
    size_t i;
    int depth;
    struct tlist *changed; /* loop.changed(...): the values of its last call (NULL: none yet) */
};

struct tscope;

/* ---- the tree ---- */
enum tnode_kind {
    N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_BREAK, N_CONTINUE, N_BLOCK, N_CALLBLOCK, /* statements */
    E_CONST, E_NAME, E_LIST, E_TUPLE, E_DICT, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_NOT, E_NEG,
    E_POS, E_BIN, E_CMP, E_AND, E_OR, E_COND
};
struct tnode {
    int kind, line, op;
    struct tnode *a, *b, *c;          /* operands / condition / iterable / value */
    struct tnode **kids;              /* list items, dict keys/values interleaved, call args, body, cmp operands */
    size_t nkids;
    struct tnode **body2;             /* else / elif branch */
    size_t nbody2;
    const char *name;                 /* name, attribute, filter, test, macro */
    const char **names;               /* for targets, set targets, macro parameters, call keyword names */
    size_t nnames;
    struct tnode **kwvals;            /* call keyword values, macro parameter defaults (NULL: none) */
    int *ops;                         /* E_CMP: the operators between kids */
    struct tv val;                    /* E_CONST, N_TEXT */
    struct tscope *scope;             /* a call block's caller (made at render): the scope it sees */
};
/* E_CALL: b `**kwargs`, c `*args` (NULL: none); N_MACRO: op 1 when its body names `caller`; N_CALLBLOCK: a the
 * call, names/kwvals the caller's parameters, kids its body */

/* binary and comparison operators */
enum { OP_ADD = 1, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT, OP_EQ, OP_NE, OP_LT, OP_LE,
       OP_GT, OP_GE, OP_IN, OP_NOTIN };

struct tpl {
    struct tarena arena; /* the tree */
    struct tnode **body;
    size_t nbody;
};

/* ---- a render ---- */
struct tscope {
    struct tscope *parent;
    struct tdict vars;
};
struct tctx {
    jmp_buf jb;
    char *err;
    size_t errlen;
    struct tarena arena;
    char *out;
    size_t outn, outcap, outmax;
    size_t json_bytes; /* the strings read from the request: the output's first size (a template prints them) */
    uint64_t steps, maxsteps;
    int depth, maxdepth;
    int line;              /* the node being evaluated, for messages */
    struct tscope *root;
    int loopctl;           /* 1 break, 2 continue, while unwinding a loop body */
    struct tcapture *captures; /* the outputs of the captures under way (a macro's, a set block's): freed by
                                * tpl_uncapture when an error unwinds them */
};
struct tcapture {
    char *out;
    size_t outn, outcap;
    struct tcapture *outer;
};

_Noreturn void tpl_fail(struct tctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void tpl_emit(struct tctx *c, const char *p, size_t n);
_Noreturn void tpl_undefined_use(struct tctx *c, const struct tv *v); /* "'x' is undefined" */
void tpl_uncapture(struct tctx *c, struct tcapture *upto); /* after an error: back to the output of upto */
void tpl_emit_value(struct tctx *c, const struct tv *v); /* str(v) into the output */

/* tpl_value.c */
/* Python's numbers among the values: bool, int, float; as a double; an int or bool as an int */
static inline int tv_is_num(const struct tv *v)
{
    return v->t == TV_INT || v->t == TV_FLOAT || v->t == TV_BOOL;
}
static inline double tv_fnum(const struct tv *v)
{
    return v->t == TV_FLOAT ? v->u.f : v->t == TV_INT ? (double)v->u.i : (double)v->u.b;
}
static inline int64_t tv_inum(const struct tv *v)
{
    return v->t == TV_INT ? v->u.i : v->u.b;
}
struct tv tv_str(struct tctx *c, const char *p, size_t n); /* copies */
/* the constructors that copy nothing are inline: out of line, the struct returned through the stack stalled the
 * store-to-load forwarding of every call (a seventh of a long conversation's render) */
static inline struct tv tv_strref(const char *p, size_t n) /* refers */
{
    struct tv v = {.t = TV_STR};
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}
static inline struct tv tv_int(int64_t i)
{
    struct tv v = {.t = TV_INT};
    v.u.i = i;
    return v;
}
static inline struct tv tv_float(double f)
{
    struct tv v = {.t = TV_FLOAT};
    v.u.f = f;
    return v;
}
static inline struct tv tv_bool(int b)
{
    struct tv v = {.t = TV_BOOL};
    v.u.b = !!b;
    return v;
}
static inline struct tv tv_none(void)
{
    return (struct tv){.t = TV_NONE};
}
static inline struct tv tv_undef(const char *name)
{
    return (struct tv){.t = TV_UNDEF, .undef_name = name};
}
struct tlist *tl_new(struct tctx *c, size_t cap);
void tl_push(struct tctx *c, struct tlist *l, struct tv v);
struct tdict *td_new(struct tctx *c);
void td_set(struct tctx *c, struct tdict *d, struct tv k, struct tv v);
struct tv *td_get(const struct tdict *d, struct tv k);
struct tv *td_gets(const struct tdict *d, const char *name, size_t n);
int tv_truth(const struct tv *v);
int tv_equal(const struct tv *a, const struct tv *b);
int tv_compare(struct tctx *c, const struct tv *a, const struct tv *b); /* <0, 0, >0; fails on unordered types */
const char *tv_type_name(const struct tv *v);
/* Python's str(v) and repr(v), appended to the buffer (arena). */
struct tbuf {
    char *p;
    size_t n, cap;
};
void tb_put(struct tctx *c, struct tbuf *b, const char *p, size_t n);
void tv_str_into(struct tctx *c, struct tbuf *b, const struct tv *v);
void tv_repr_into(struct tctx *c, struct tbuf *b, const struct tv *v);
struct tv tv_to_str(struct tctx *c, const struct tv *v);
struct tv tv_list_of(struct tctx *c, struct tlist *l);
struct tv tv_round(struct tctx *c, struct tv v, struct tv prec, struct tv method); /* round filter (tpl_fmt.c) */
struct tv tv_buf_str(struct tbuf *b);                              /* the buffer's text as a value */
struct tv tv_need_str(struct tctx *c, struct tv v, const char *what); /* v, or fails naming what wanted a str */
/* json.dumps(v, ensure_ascii=False, indent=indent (<0: None), separators, sort_keys) */
void tv_json_into(struct tctx *c, struct tbuf *b, const struct tv *v, int indent, const char *item_sep,
                  const char *key_sep, int sort_keys, int level);
void tv_float_repr(double f, char *out, size_t cap); /* Python's repr(float) */
struct cJSON;
struct tv tv_from_json(struct tctx *c, const struct cJSON *j);
size_t tv_len(struct tctx *c, const struct tv *v);           /* len(v); fails when it has none */
struct tlist *tv_iter(struct tctx *c, const struct tv *v);   /* the items iteration gives (dict: its keys) */
size_t u8_count(const char *p, size_t n);                    /* code points */
size_t u8_offset(const char *p, size_t n, size_t k);         /* byte offset of code point k (n when past) */
int u8_is_space(const char *p, size_t n, size_t *len);       /* Python's str.isspace for one character */
/* a name (attribute, method, filter) equals lit: the first byte compared inline, as most names differ there */
static inline int tpl_name_is(const char *name, const char *lit)
{
    return name[0] == lit[0] && !strcmp(name, lit);
}

/* tpl_eval.c */
struct tv tpl_eval(struct tctx *c, struct tscope *s, const struct tnode *e);
void tpl_exec(struct tctx *c, struct tscope *s, struct tnode **body, size_t n);
void tpl_assign(struct tctx *c, struct tscope *s, const char *name, struct tv v);

/* tpl_ops.c */
struct tv tpl_binop(struct tctx *c, int op, struct tv a, struct tv b);
int tpl_compare(struct tctx *c, int op, const struct tv *a, const struct tv *b);
int tpl_contains(struct tctx *c, const struct tv *hay, const struct tv *needle);
struct tv tpl_get_slice(struct tctx *c, struct tv v, struct tv *p); /* p: start, stop, step */

/* tpl_lib.c */
enum tpl_global { G_RANGE = 1, G_NAMESPACE, G_RAISE, G_STRFTIME, G_DICT, G_LOOP_CYCLE };
int tpl_filter_known(const char *name);
int tpl_test_known(const char *name);
struct tv tpl_filter(struct tctx *c, struct tscope *s, const char *name, struct tv v, struct tv *args, size_t nargs,
                     const char **kwn, struct tv *kwv, size_t nkw);
int tpl_test(struct tctx *c, const char *name, const struct tv *v, struct tv *args, size_t nargs);
struct tv tpl_method(struct tctx *c, const struct tbound *m, struct tv *args, size_t nargs, const char **kwn,
                     struct tv *kwv, size_t nkw);
struct tv tpl_global_call(struct tctx *c, int fn, struct tv *args, size_t nargs, const char **kwn, struct tv *kwv,
                          size_t nkw);
int tpl_has_method(const struct tv *v, const char *name);

/* tpl_str.c: Python's str operations (ts_strip: chars NULL = whitespace; ts_split: sep None = whitespace runs) */
typedef int32_t (*case_fn)(int32_t);
struct tv ts_map_case(struct tctx *c, struct tv s, case_fn f);
int ts_is_cased(int32_t cp);
struct tv ts_py_title(struct tctx *c, struct tv s);
struct tv ts_capitalize(struct tctx *c, struct tv s);
struct tv ts_jinja_title(struct tctx *c, struct tv s);
struct tv ts_strip(struct tv s, const struct tv *chars, int left, int right);
struct tv ts_split(struct tctx *c, struct tv s, struct tv sep, int64_t maxsplit, int from_right);
struct tv ts_replace(struct tctx *c, struct tv s, struct tv old, struct tv new, int64_t count);
int ts_prefix_match(struct tctx *c, struct tv s, struct tv x, int end);
struct tv ts_find(struct tv s, struct tv x, int last);
const char *ts_memmem(const char *h, size_t hn, const char *nd, size_t nn); /* memmem, faster on text */
struct tlist *ts_splitlines(struct tctx *c, struct tv s);
struct tv ts_json_ascii(struct tctx *c, struct tbuf *b);
struct tv ts_escape(struct tctx *c, struct tv s);
struct tv ts_percent(struct tctx *c, struct tv fmt, struct tv rhs); /* fmt % rhs (tpl_fmt.c), Python's printf-style */
/* str methods beyond tpl_lib.c's (zfill, ljust, rjust, center, partition, rpartition, removeprefix, removesuffix,
 * index, rindex, isdecimal, istitle, expandtabs): fails on any other name */
struct tv ts_method(struct tctx *c, const char *name, struct tv self, struct tv *args, size_t nargs);

/* tpl_parse.c */
struct tpl *tpl_parse(const char *src, size_t len, char *err, size_t errlen);

#endif
