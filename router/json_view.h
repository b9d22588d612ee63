/* SPDX-License-Identifier: Apache-2.0 */
/* json_view.h - strict JSON, checked once and then read where it lies (pure: no router state, no tree).
 *
 * A client's body is checked by the scanner (RFC 8259: one value, nothing after it, no NaN/Infinity, valid
 * UTF-8, nesting bounded) and its members are then read in place through views: spans of the checked bytes.
 * Nothing is allocated per value, so reading a body costs memory in proportion to what is taken out of it
 * (a decoded string, a block hash), never a node per value (a tree of `[0,0,...]` costs ~30 bytes per input
 * byte). Duplicate keys read as Python's json.loads reads them, which is what the engines run: the last wins.
 * Views are only valid over bytes the scanner accepted. */
#ifndef XPYD_JSON_VIEW_H
#define XPYD_JSON_VIEW_H

#include <stddef.h>
#include <stdint.h>

#define JV_MAX_DEPTH 512

/* JSON's whitespace */
static inline int jv_is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* ---- the scanner ---- */
struct jv_scan {
    const char *p, *s, *e; /* position, start, end */
    const char *err;       /* the first reason it failed, or NULL */
};
void jv_ws(struct jv_scan *j);
/* At a '"': past the string; *has_nul (optional) set when it holds \u0000. 0, or -1 with j->err. */
int jv_scan_string(struct jv_scan *j, int *has_nul);
/* One value at j->p (whitespace first) nested at depth; 0, or -1 with j->err. */
int jv_scan_value(struct jv_scan *j, int depth);
/* 0 when data[0..len) is exactly one strict value, else -1 with *err and *err_at (both optional). */
int jv_check(const char *data, size_t len, const char **err, size_t *err_at);

/* ---- views ---- */
struct jv {
    const char *p; /* the value's first byte, NULL: absent */
    size_t n;      /* its length */
};
enum jv_type { JV_NONE = 0, JV_OBJECT, JV_ARRAY, JV_STRING, JV_NUMBER, JV_TRUE, JV_FALSE, JV_NULL };

enum jv_type jv_type(struct jv v);
/* The view of the checked value starting at p (whitespace skipped), ending before e. */
struct jv jv_at(const char *p, const char *e);
/* The member key of object o (the last of a repeated key), or an absent view. */
struct jv jv_get(struct jv o, const char *key);

/* Members of an object (key and value) or elements of an array (value only), in order. */
struct jv_iter {
    const char *p, *e;
    int obj;
};
void jv_iter_init(struct jv_iter *it, struct jv container);
int jv_next(struct jv_iter *it, struct jv *key, struct jv *val);
/* The same for the container that starts at p (whitespace first) without finding its end first (a view's length
 * is a pass over it): e bounds it, e.g. its own container's end. Once jv_next has returned 0, jv_iter_end is the
 * byte after its closing bracket. */
void jv_iter_open(struct jv_iter *it, const char *p, const char *e);
const char *jv_iter_end(const struct jv_iter *it);
/* Elements of an array, members of an object; 0 otherwise. */
size_t jv_count(struct jv v);

/* A string's decoded bytes (UTF-8; \u escapes decoded, a lone surrogate as its three-byte form, as Python's
 * surrogatepass writes it; \u0000 as a NUL byte). At most s.n - 2 bytes. */
size_t jv_str_len(struct jv s);
size_t jv_str_decode(struct jv s, char *out);
/* The decoded bytes of s handed to put in pieces, in order (nothing is copied but escapes). */
void jv_str_each(struct jv s, void (*put)(void *arg, const char *p, size_t n), void *arg);
/* The decoded string, NUL-terminated, malloc'd (aborts on OOM); NULL when v is not a string. */
char *jv_str_dup(struct jv v);
/* 1 when string s decodes to exactly lit[0..len). */
int jv_str_eq(struct jv s, const char *lit, size_t len);
/* A number's value; 0, or -1 when v is not a number. */
int jv_double(struct jv v, double *out);

#endif
