/* SPDX-License-Identifier: Apache-2.0 */
/* tpl_lex.c - a chat template's source to tokens, as jinja2's lexer reads it with transformers' settings (newlines
 * normalized to \n and one trailing newline dropped by tpl_parse; trim_blocks: a block or comment tag eats the
 * newline after it; lstrip_blocks: spaces before a block or comment tag on its own line are dropped; '-' and '+'
 * on either side of a tag; tag ends are not seen inside brackets), and string literals decoded as Python's
 * unicode-escape decodes them. The parser is tpl_parse.c. */
#include "tpl_internal.h"
#include "tpl_parse.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Noreturn void perr(struct parser *ps, int line, const char *fmt, ...)
{
    va_list ap;
    int k = snprintf(ps->err, ps->errlen, "chat template line %d: ", line);
    va_start(ap, fmt);
    if (k >= 0 && (size_t)k < ps->errlen)
        vsnprintf(ps->err + k, ps->errlen - (size_t)k, fmt, ap);
    va_end(ap);
    longjmp(ps->jb, 1);
}

void *palloc(struct parser *ps, size_t n)
{
    void *p = tarena_alloc(ps->arena, n);
    if (!p)
        perr(ps, 0, "the template is too large");
    return p;
}

/* ---------------- lexer ---------------- */

static void push_tok(struct parser *ps, int t, const char *p, size_t n, int line)
{
    if (ps->ntok == ps->cap) {
        size_t cap = ps->cap ? ps->cap * 2 : 256;
        struct ttok *nt = realloc(ps->toks, cap * sizeof *nt);
        if (!nt)
            perr(ps, line, "out of memory");
        ps->toks = nt;
        ps->cap = cap;
    }
    ps->toks[ps->ntok++] = (struct ttok){t, line, p, n};
}

static int lines_in(const char *p, size_t n)
{
    int k = 0;
    for (size_t i = 0; i < n; i++)
        k += p[i] == '\n';
    return k;
}

/* Python's str.rstrip(): trailing Unicode whitespace */
static size_t rstrip_len(const char *p, size_t n)
{
    while (n > 0) {
        size_t s = n - 1;
        while (s > 0 && ((unsigned char)p[s] & 0xC0) == 0x80)
            s--;
        size_t cl;
        if (!u8_is_space(p + s, n - s, &cl) || cl != n - s)
            break;
        n = s;
    }
    return n;
}

static size_t skip_space(const char *p, size_t i, size_t n)
{
    size_t cl;
    while (i < n && u8_is_space(p + i, n - i, &cl))
        i += cl;
    return i;
}

/* The data before a tag, with the tag's left whitespace control applied. */
static void data_before(struct parser *ps, const char *text, size_t n, int line, char sign, int is_var,
                        int line_starting)
{
    if (sign == '-') {
        n = rstrip_len(text, n);
    } else if (sign != '+' && !is_var) { /* lstrip_blocks */
        size_t l = n;
        while (l > 0 && text[l - 1] != '\n')
            l--;
        if ((l > 0 || line_starting) && l < n && skip_space(text, l, n) == n)
            n = l;
    }
    if (n)
        push_tok(ps, T_DATA, text, n, line);
}

/* digits at s[i] separated by single underscores, as jinja's (\d+_)*\d+ (or (_?d)+ after a prefix: lead): the end,
 * or i when none */
static size_t digit_run(const char *s, size_t n, size_t i, int base, int lead)
{
    size_t j = i, last = i;
    for (;;) {
        if (lead && j < n && s[j] == '_')
            j++;
        int d = j < n ? s[j] : -1;
        int ok = base == 16 ? (d >= '0' && d <= '9') || ((d | 0x20) >= 'a' && (d | 0x20) <= 'f')
                            : d >= '0' && d < '0' + base;
        if (!ok)
            return last;
        last = ++j;
        if (!lead && j < n && s[j] == '_' && j + 1 < n && s[j + 1] >= '0' && s[j + 1] <= '9')
            j++;
    }
}

/* A number literal as jinja's lexer reads one (its float_re, then integer_re): 1_000, 1.5, 1e-3, 1_0.2_5, 0x1F,
 * 0o17, 0b101, 0, 0_0; "012" is "0" then "12" (a syntax error there, and here). */
static size_t number_end(const char *s, size_t n, size_t st, int *fl)
{
    size_t i = digit_run(s, n, st, 10, 0), f = i;
    *fl = 0;
    if (f + 1 < n && s[f] == '.' && s[f + 1] >= '0' && s[f + 1] <= '9')
        f = digit_run(s, n, f + 1, 10, 0);
    if (f < n && (s[f] | 0x20) == 'e') {
        size_t k = f + 1 + (f + 1 < n && (s[f + 1] == '+' || s[f + 1] == '-'));
        size_t e = k < n && s[k] >= '0' && s[k] <= '9' ? digit_run(s, n, k, 10, 0) : k;
        if (e > k) {
            *fl = 1;
            return e;
        }
    }
    if (f > i) {
        *fl = 1;
        return f;
    }
    if (s[st] == '0' && st + 2 < n) { /* 0b 0o 0x */
        char p = (char)(s[st + 1] | 0x20);
        int base = p == 'b' ? 2 : p == 'o' ? 8 : p == 'x' ? 16 : 0;
        size_t e = base ? digit_run(s, n, st + 2, base, 1) : st + 2;
        if (e > st + 2)
            return e;
    }
    if (s[st] != '0')
        return i;
    size_t j = st + 1; /* 0(_?0)* */
    while (j < n && (s[j] == '0' || (s[j] == '_' && j + 1 < n && s[j + 1] == '0')))
        j += s[j] == '_' ? 2 : 1;
    return j;
}


static const char *const OPS[] = {"**", "//", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]", "(",
                                  ")", "{", "}", ">", "<", "=", ".", ":", "|", ",", ";", NULL};

/* The inside of a {{ }} or {% %} tag from i; returns where its end delimiter ends. */
static size_t lex_tag(struct parser *ps, size_t i, int *line, char close, int *ended_nl)
{
    const char *s = ps->src;
    size_t n = ps->len;
    int balance = 0;
    for (;;) {
        i = skip_space(s, i, n);
        if (i >= n)
            perr(ps, *line, "a tag is not closed");
        if (!balance) { /* the end rule first, as jinja tries it first */
            size_t e = i;
            char sign = 0;
            if (s[e] == '-' || (s[e] == '+' && close == '%')) /* jinja has no `+}}` */
                sign = s[e++];
            if (e + 1 < n && s[e] == close && s[e + 1] == '}') {
                push_tok(ps, close == '%' ? T_BLOCK_END : T_VAR_END, s + i, 0, *line);
                e += 2;
                size_t after = e;
                if (sign == '-')
                    after = skip_space(s, e, n);
                else if (sign != '+' && close == '%' && e < n && s[e] == '\n') /* trim_blocks */
                    after = e + 1;
                *ended_nl = after > e && s[after - 1] == '\n';
                *line += lines_in(s + i, after - i);
                return after;
            }
        }
        int l0 = *line;
        size_t st = i;
        unsigned char ch = (unsigned char)s[i];
        if (ch == '\'' || ch == '"') {
            for (i++; i < n && s[i] != (char)ch; i++)
                if (s[i] == '\\' && i + 1 < n)
                    i++;
            if (i >= n)
                perr(ps, l0, "a string is not closed");
            i++;
            push_tok(ps, T_STRING, s + st, i - st, l0);
            *line += lines_in(s + st, i - st);
        } else if (ch >= '0' && ch <= '9') {
            int fl = 0;
            i = number_end(s, n, st, &fl);
            push_tok(ps, fl ? T_FLOAT : T_INT, s + st, i - st, l0);
        } else if (ch == '_' || (unsigned)((ch | 0x20) - 'a') < 26u || ch >= 0x80) {
            while (i < n && ((unsigned char)s[i] >= 0x80 || s[i] == '_' || (unsigned)((s[i] | 0x20) - 'a') < 26u ||
                             (s[i] >= '0' && s[i] <= '9')))
                i++;
            push_tok(ps, T_NAME, s + st, i - st, l0);
        } else {
            int k = 0;
            while (OPS[k] && strncmp(s + i, OPS[k], strlen(OPS[k])) != 0)
                k++;
            if (!OPS[k])
                perr(ps, l0, "unexpected character '%c'", ch);
            size_t ol = strlen(OPS[k]);
            if (ch == '(' || ch == '[' || ch == '{')
                balance++;
            else if ((ch == ')' || ch == ']' || ch == '}') && balance > 0)
                balance--;
            push_tok(ps, T_OP, s + i, ol, l0);
            i += ol;
        }
    }
}

/* {% raw %} ... {% endraw %}: the text between, as it is. Returns the position after endraw's tag. */
static size_t lex_raw(struct parser *ps, size_t i, int *line, int *ended_nl)
{
    const char *s = ps->src;
    size_t n = ps->len, k = i;
    for (;;) {
        const char *m = k < n ? memmem(s + k, n - k, "{%", 2) : NULL;
        if (!m)
            perr(ps, *line, "raw is not closed by endraw");
        size_t t = (size_t)(m - s), e = t + 2;
        char lsign = e < n && (s[e] == '-' || s[e] == '+') ? s[e++] : 0;
        e = skip_space(s, e, n);
        if (n - e >= 6 && !memcmp(s + e, "endraw", 6)) {
            e = skip_space(s, e + 6, n);
            char rsign = e < n && (s[e] == '-' || s[e] == '+') ? s[e++] : 0;
            if (e + 1 < n && s[e] == '%' && s[e + 1] == '}') {
                size_t dn = t - i;
                if (lsign == '-')
                    dn = rstrip_len(s + i, dn);
                if (dn)
                    push_tok(ps, T_DATA, s + i, dn, *line);
                e += 2;
                size_t after = rsign == '-' ? skip_space(s, e, n) : rsign != '+' && e < n && s[e] == '\n' ? e + 1 : e;
                *ended_nl = after > e && s[after - 1] == '\n';
                *line += lines_in(s + i, after - i);
                return after;
            }
        }
        k = t + 2;
    }
}

void tpl_lex(struct parser *ps)
{
    const char *s = ps->src;
    size_t n = ps->len, i = 0;
    int line = 1, line_starting = 1;
    while (i < n) {
        size_t j = i;
        while (j + 1 < n && !(s[j] == '{' && (s[j + 1] == '{' || s[j + 1] == '%' || s[j + 1] == '#')))
            j++;
        if (j + 1 >= n) {
            push_tok(ps, T_DATA, s + i, n - i, line);
            break;
        }
        char kind = s[j + 1];
        char sign = j + 2 < n && (s[j + 2] == '-' || s[j + 2] == '+') ? s[j + 2] : 0;
        size_t k = j + 2 + (sign != 0);
        int tline = line + lines_in(s + i, j - i);
        if (kind == '%') { /* raw? */
            size_t r = skip_space(s, k, n);
            if (n - r >= 3 && !memcmp(s + r, "raw", 3)) {
                size_t r2 = skip_space(s, r + 3, n);
                if (r2 < n && (s[r2] == '-' || s[r2] == '+'))
                    r2++;
                if (r2 + 1 < n && s[r2] == '%' && s[r2 + 1] == '}') {
                    data_before(ps, s + i, j - i, line, sign, 0, line_starting);
                    int nl = 0;
                    line = tline;
                    i = lex_raw(ps, r2 + 2, &line, &nl);
                    line_starting = nl;
                    continue;
                }
            }
        }
        data_before(ps, s + i, j - i, line, sign, kind == '{', line_starting);
        line = tline;
        if (kind == '#') {
            const char *m = memmem(s + k, n - k, "#}", 2);
            if (!m)
                perr(ps, line, "a comment is not closed");
            size_t e = (size_t)(m - s) + 2, after = e;
            char cs = m > s + k ? m[-1] : 0;
            if (cs == '-')
                after = skip_space(s, e, n);
            else if (cs != '+' && e < n && s[e] == '\n')
                after = e + 1;
            line += lines_in(s + j, after - j);
            line_starting = after > 0 && s[after - 1] == '\n';
            i = after;
            continue;
        }
        push_tok(ps, kind == '%' ? T_BLOCK_BEGIN : T_VAR_BEGIN, s + j, 2, line);
        int nl = 0;
        i = lex_tag(ps, k, &line, kind == '%' ? '%' : '}', &nl);
        line_starting = i > 0 && s[i - 1] == '\n';
    }
    push_tok(ps, T_EOF, s + n, 0, line);
}

static int hexv(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1;
}

static size_t put_utf8(char *o, unsigned long cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A string literal's value, as Python's unicode-escape decodes it. */
struct tv tpl_string_value(struct parser *ps, const struct ttok *t)
{
    char *o = palloc(ps, t->n + 1);
    size_t k = 0;
    for (size_t i = 1; i + 1 < t->n; i++) {
        char ch = t->p[i];
        if (ch != '\\' || i + 2 >= t->n) {
            o[k++] = ch;
            continue;
        }
        char e = t->p[++i];
        static const char from[] = "nrtbfva\\'\"", to[] = "\n\r\t\b\f\v\a\\'\"";
        const char *f = strchr(from, e);
        if (f && e) {
            o[k++] = to[f - from];
        } else if (e >= '0' && e <= '7') {
            unsigned v = 0;
            int d = 0;
            for (; d < 3 && i + 1 < t->n && t->p[i] >= '0' && t->p[i] <= '7'; d++, i++)
                v = v * 8 + (unsigned)(t->p[i] - '0');
            i--;
            k += put_utf8(o + k, v);
        } else if (e == 'x' || e == 'u' || e == 'U') {
            int want = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            unsigned long v = 0;
            for (int d = 0; d < want; d++) {
                int h = i + 1 + (size_t)d < t->n - 1 ? hexv(t->p[i + 1 + (size_t)d]) : -1;
                if (h < 0)
                    perr(ps, t->line, "a truncated \\%c escape in a string", e);
                v = v * 16 + (unsigned long)h;
            }
            if (v > 0x10FFFF)
                perr(ps, t->line, "an escape beyond Unicode in a string");
            i += (size_t)want;
            k += put_utf8(o + k, v);
        } else {
            o[k++] = '\\';
            o[k++] = e;
        }
    }
    return tv_strref(o, k);
}

