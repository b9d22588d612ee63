/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_settings.c - the settings-table machinery shared by xpyd_router and xpyd_sim (see xpyd_settings.h). */
#include "xpyd_settings.h"

#include "xpyd_util.h"

#include <limits.h>
#include <stdint.h>
#include <string.h>

int xpyd_setting_set(void *base, const struct xpyd_setting *s, const char *v, const char *prog)
{
    char *field = (char *)base + s->off;
    switch (s->kind) {
    case XS_LONG: {
        long x;
        if (xpyd_parse_long(v, (long)s->lo, (long)s->hi, &x) != 0) {
            fprintf(stderr, "%s: --%s needs an integer in [%.0f, %.0f], got '%s'\n", prog, s->name, s->lo, s->hi, v);
            return -1;
        }
        if (s->size == sizeof(int))
            *(int *)field = (int)x; /* xpyd_settings_defaults checked that the range fits an int */
        else
            *(long *)field = x;
        return 0;
    }
    case XS_DOUBLE:
        if (xpyd_parse_double(v, s->lo, s->hi, (double *)field) != 0) {
            fprintf(stderr, "%s: --%s needs a number in [%g, %g], got '%s'\n", prog, s->name, s->lo, s->hi, v);
            return -1;
        }
        return 0;
    case XS_STR:
        if (strlen(v) >= s->size) {
            fprintf(stderr, "%s: --%s: longer than %zu bytes\n", prog, s->name, s->size - 1);
            return -1;
        }
        memcpy(field, v, strlen(v) + 1);
        return 0;
    case XS_ENUM:
        for (int i = 0; s->choices[i]; i++) {
            if (strcmp(s->choices[i], v) == 0) {
                *(int *)field = i;
                return 0;
            }
        }
        fprintf(stderr, "%s: --%s: unknown value '%s' (", prog, s->name, v);
        for (int i = 0; s->choices[i]; i++)
            fprintf(stderr, "%s%s", i ? ", " : "", s->choices[i]);
        fprintf(stderr, ")\n");
        return -1;
    default:
        return -1;
    }
}

int xpyd_setting_equal(const void *a, const void *b, const struct xpyd_setting *s)
{
    const char *fa = (const char *)a + s->off, *fb = (const char *)b + s->off;
    if (s->kind == XS_STR)
        return strncmp(fa, fb, s->size) == 0;
    return memcmp(fa, fb, s->size) == 0;
}

const struct xpyd_setting *xpyd_setting_find(const struct xpyd_setting *t, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++) {
        const char *a = t[i].name, *b = name;
        while (*a && (*a == *b || (*a == '-' && *b == '_'))) /* JSON keys may use '_' */
            a++, b++;
        if (!*a && !*b)
            return &t[i];
    }
    return NULL;
}

/* A row must fit the field it names (so a field changed from int to long, or a string buffer shrunk, stops
 * every start instead of writing past it), and its default must parse. */
int xpyd_settings_defaults(void *base, const struct xpyd_setting *t, size_t n, const char *prog)
{
    for (size_t i = 0; i < n; i++) {
        const struct xpyd_setting *s = &t[i];
        int ok = 0;
        switch (s->kind) {
        case XS_LONG:
            ok = s->size == sizeof(long) || (s->size == sizeof(int) && s->lo >= INT_MIN && s->hi <= INT_MAX);
            break;
        case XS_DOUBLE:
            ok = s->size == sizeof(double);
            break;
        case XS_ENUM:
            ok = s->size == sizeof(int) && s->choices;
            break;
        case XS_STR:
            ok = s->size > strlen(s->def);
            break;
        }
        if (!ok || (s->def[0] && xpyd_setting_set(base, s, s->def, prog) != 0)) {
            fprintf(stderr, "%s: internal error: setting --%s does not fit its field\n", prog, s->name);
            return -1;
        }
    }
    return 0;
}

void xpyd_print_wrapped(FILE *f, const char *text, int indent, int width)
{
    int col = indent;
    const char *p = text;
    while (*p) {
        while (*p == ' ')
            p++;
        const char *w = p;
        int len = 0;
        for (; *p && *p != ' '; p++)
            len += *p != '`' && ((unsigned char)*p & 0xC0) != 0x80; /* display width: no quotes, UTF-8 once */
        if (col > indent && col + 1 + len > width) {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
        } else if (col > indent) {
            fputc(' ', f);
            col++;
        }
        for (; w < p; w++)
            if (*w != '`')
                fputc(*w, f);
        col += len;
    }
    fputc('\n', f);
}

void xpyd_settings_usage(FILE *f, const struct xpyd_setting *t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char line[2048], choices[256] = "";
        for (int k = 0; t[i].kind == XS_ENUM && t[i].choices[k]; k++)
            snprintf(choices + strlen(choices), sizeof choices - strlen(choices), "%s%s", k ? "|" : " (",
                     t[i].choices[k]);
        if (choices[0])
            snprintf(choices + strlen(choices), sizeof choices - strlen(choices), ")");
        snprintf(line, sizeof line, "%s%s [%s]", t[i].help, choices, t[i].def[0] ? t[i].def : "none");
        fprintf(f, "  --%-24s ", t[i].name);
        xpyd_print_wrapped(f, line, 29, 110);
    }
}

void xpyd_settings_reference(FILE *f, const struct xpyd_setting *t, size_t n)
{
    fputs("| setting | default | range | meaning |\n|---|---|---|---|\n", f);
    for (size_t i = 0; i < n; i++) {
        const struct xpyd_setting *s = &t[i];
        fprintf(f, "| `--%s` | %s%s%s | ", s->name, s->def[0] ? "`" : "", s->def[0] ? s->def : "none",
                s->def[0] ? "`" : "");
        if (s->kind == XS_LONG)
            fprintf(f, "%.0f – %.0f", s->lo, s->hi);
        else if (s->kind == XS_DOUBLE)
            fprintf(f, "%g – %g", s->lo, s->hi);
        else if (s->kind == XS_ENUM)
            for (int k = 0; s->choices[k]; k++)
                fprintf(f, "%s`%s`", k ? ", " : "", s->choices[k]);
        fputs(" | ", f);
        for (const char *c = s->help; *c; c++) {
            if (*c == '|')
                fputc('\\', f);
            fputc(*c, f);
        }
        fputs(" |\n", f);
    }
}
