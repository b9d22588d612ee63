/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_settings.h - a settings table: each row names a flag (its JSON key is the same name, '-' or '_'), its
 * type, the field it fills (offset and size, taken from the field itself), its range, default, choices and
 * text. The router and the simulator each keep one table; parsing, defaults, --help and the Markdown
 * reference are written here once. */
#ifndef XPYD_SETTINGS_H
#define XPYD_SETTINGS_H

#include <stddef.h>
#include <stdio.h>

enum xpyd_setting_kind { XS_LONG = 0, XS_DOUBLE, XS_STR, XS_ENUM };

struct xpyd_setting {
    const char *name;
    int kind;           /* enum xpyd_setting_kind */
    size_t off, size;   /* the field: XPYD_FIELD(struct, member) */
    double lo, hi;      /* XS_LONG, XS_DOUBLE: inclusive range */
    const char *def;    /* default as it would be typed; "" for none (XS_STR) */
    const char *const *choices; /* XS_ENUM: NULL-terminated; the field (an int) gets the index */
    const char *help;   /* Markdown (backquotes); --help prints it without them */
};

#define XPYD_FIELD(type, member) offsetof(type, member), sizeof(((type *)0)->member)

/* Stores v into the field of s in the struct at base. 0, or -1 with a message naming prog and the flag. */
int xpyd_setting_set(void *base, const struct xpyd_setting *s, const char *v, const char *prog);
/* 1 when the field of s holds the same value in the structs at a and b. */
int xpyd_setting_equal(const void *a, const void *b, const struct xpyd_setting *s);
/* The row named name ('-' and '_' are the same), or NULL. */
const struct xpyd_setting *xpyd_setting_find(const struct xpyd_setting *t, size_t n, const char *name);
/* Checks that every row fits its field (type and size) and that its default parses, then applies the
 * defaults to base. 0, or -1 naming the row (a bug in the table). */
int xpyd_settings_defaults(void *base, const struct xpyd_setting *t, size_t n, const char *prog);
/* --help lines: "  --name   text [default]", wrapped. */
void xpyd_settings_usage(FILE *f, const struct xpyd_setting *t, size_t n);
/* The table as Markdown: | setting | default | range | meaning | */
void xpyd_settings_reference(FILE *f, const struct xpyd_setting *t, size_t n);
/* Prints text (backquotes dropped) wrapped at width, continuation lines indented. */
void xpyd_print_wrapped(FILE *f, const char *text, int indent, int width);

#endif
