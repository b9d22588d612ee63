/* SPDX-License-Identifier: Apache-2.0 */
/* tpl_fmt.c - Python's formatting for chat templates (tpl_internal.h): `str % args` and jinja's format filter
 * (printf-style conversions with Python's flags, widths in code points, %r/%a reprs, mapping keys, Python's
 * errors), and jinja's round filter (Python's round: ties to even on the exact binary value). */
#include "tpl_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- Python's printf-style formatting: str % args, and jinja's format filter ---- */

static void pad_put(struct tctx *c, struct tbuf *b, const char *p, size_t n, size_t width, int left, char fill)
{
    size_t cps = u8_count(p, n);
    if (!left)
        for (size_t k = cps; k < width; k++)
            tb_put(c, b, &fill, 1);
    tb_put(c, b, p, n);
    if (left)
        for (size_t k = cps; k < width; k++)
            tb_put(c, b, " ", 1);
}

/* An integer conversion (d i u o x X): sign, the '#' prefix, zeros to the precision or (flag 0) to the width */
static void put_int(struct tctx *c, struct tbuf *b, int neg, const char *digits, char conv, const char *flags,
                    size_t width, int prec)
{
    const char *sign = neg ? "-" : strchr(flags, '+') ? "+" : strchr(flags, ' ') ? " " : "";
    const char *pre = !strchr(flags, '#') ? "" : conv == 'o' ? "0o" : conv == 'x' ? "0x" : conv == 'X' ? "0X" : "";
    size_t nd = strlen(digits), head = strlen(sign) + strlen(pre);
    size_t zeros = prec > 0 && (size_t)prec > nd ? (size_t)prec - nd : 0;
    int left = strchr(flags, '-') != NULL;
    if (strchr(flags, '0') && !left && width > head + zeros + nd)
        zeros = width - head - nd;
    struct tbuf t = {0};
    tb_put(c, &t, sign, strlen(sign));
    tb_put(c, &t, pre, strlen(pre));
    for (size_t k = 0; k < zeros; k++)
        tb_put(c, &t, "0", 1);
    tb_put(c, &t, digits, nd);
    pad_put(c, b, t.p, t.n, width, left, ' ');
}

static struct tbuf ascii_of(struct tctx *c, struct tbuf s)
{
    struct tbuf o = {0};
    for (size_t i = 0; i < s.n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)s.p + i, (utf8proc_ssize_t)(s.n - i), &cp);
        if (l <= 0)
            l = 1, cp = (unsigned char)s.p[i];
        if (cp < 0x80) {
            tb_put(c, &o, s.p + i, 1);
        } else {
            char e[16];
            int n = snprintf(e, sizeof e, cp < 0x100 ? "\\x%02x" : cp < 0x10000 ? "\\u%04x" : "\\U%08x", (unsigned)cp);
            tb_put(c, &o, e, (size_t)n);
        }
        i += (size_t)l;
    }
    return o;
}

/* One conversion of a format: its flags, width and precision already read */
static void convert(struct tctx *c, struct tbuf *b, char conv, const struct tv *v, const char *flags, size_t width,
                    int prec)
{
    int left = strchr(flags, '-') != NULL;
    if (conv == 's' || conv == 'r' || conv == 'a') {
        struct tbuf s = {0};
        if (conv == 's')
            tv_str_into(c, &s, v);
        else
            tv_repr_into(c, &s, v);
        if (conv == 'a') /* ascii(): repr with what is not ASCII escaped */
            s = ascii_of(c, s);
        size_t n = prec >= 0 ? u8_offset(s.p ? s.p : "", s.n, (size_t)prec) : s.n;
        pad_put(c, b, s.p ? s.p : "", n, width, left, ' ');
        return;
    }
    if (conv == 'c') {
        char ch[8];
        size_t n;
        if (v->t == TV_STR && u8_count(v->u.s.p, v->u.s.n) == 1) {
            pad_put(c, b, v->u.s.p, v->u.s.n, width, left, ' ');
            return;
        }
        if (v->t != TV_INT && v->t != TV_BOOL)
            tpl_fail(c, "%%c requires an int or a unicode character, not %s", tv_type_name(v));
        int64_t cp = v->t == TV_INT ? v->u.i : v->u.b;
        if (cp < 0 || cp > 0x10FFFF)
            tpl_fail(c, "%%c arg not in range(0x110000)");
        n = (size_t)utf8proc_encode_char((utf8proc_int32_t)cp, (utf8proc_uint8_t *)ch);
        pad_put(c, b, ch, n, width, left, ' ');
        return;
    }
    if (!tv_is_num(v))
        tpl_fail(c, "%%%c format: %s is required, not %s", conv, strchr("doxXiu", conv) ? "a real number" : "a number",
                 tv_type_name(v));
    if (strchr("diu", conv) || ((conv == 'o' || conv == 'x' || conv == 'X') && v->t != TV_FLOAT)) {
        char digits[400];
        int neg;
        if (v->t == TV_FLOAT) { /* int(): toward zero; a float past 64 bits is an integer, printed exactly */
            if (isnan(v->u.f) || isinf(v->u.f))
                tpl_fail(c, "cannot convert float %s to integer", isnan(v->u.f) ? "NaN" : "infinity");
            double t = trunc(v->u.f);
            neg = t < 0;
            snprintf(digits, sizeof digits, "%.0f", fabs(t));
        } else {
            int64_t x = v->t == TV_INT ? v->u.i : v->u.b;
            uint64_t u = x < 0 ? (uint64_t)0 - (uint64_t)x : (uint64_t)x;
            neg = x < 0;
            snprintf(digits, sizeof digits,
                     conv == 'o'   ? "%llo"
                     : conv == 'x' ? "%llx"
                     : conv == 'X' ? "%llX"
                                   : "%llu",
                     (unsigned long long)u);
        }
        put_int(c, b, neg, digits, conv, flags, width, prec);
        return;
    }
    if (conv == 'o' || conv == 'x' || conv == 'X')
        tpl_fail(c, "%%%c format: an integer is required, not float", conv);
    double f = v->t == TV_FLOAT ? v->u.f : (double)(v->t == TV_INT ? v->u.i : v->u.b);
    char spec[16], out[400];
    if (isnan(f))
        f = fabs(f); /* Python prints nan without a sign */
    snprintf(spec, sizeof spec, "%%%s%s%s%s%s*.*%c", strchr(flags, '-') ? "-" : "", strchr(flags, '+') ? "+" : "",
             strchr(flags, ' ') ? " " : "", strchr(flags, '#') ? "#" : "", strchr(flags, '0') ? "0" : "", conv);
    if (width > 300 || prec > 300)
        tpl_fail(c, "a format width or precision beyond 300");
    int n = snprintf(out, sizeof out, spec, (int)width, prec < 0 ? 6 : prec, f);
    tb_put(c, b, out, (size_t)n);
}

/* fmt % rhs, as Python formats: a tuple gives the arguments in turn, anything else is the one argument, and a
 * dict (or a list: Python takes any non-tuple with items) may be read by %(key)s */
struct tv ts_percent(struct tctx *c, struct tv fmt, struct tv rhs)
{
    int tuple = rhs.t == TV_LIST && rhs.u.l->tuple;
    int mapping = (rhs.t == TV_DICT || rhs.t == TV_LIST || rhs.t == TV_UNDEF) && !tuple; /* jinja's Undefined
                                                                                          * has __getitem__ */
    size_t nargs = tuple ? rhs.u.l->n : 1, next = 0;
    int used_single = 0;
    struct tbuf b = {0};
    const char *p = fmt.u.s.p, *end = p + fmt.u.s.n;
    while (p < end) {
        const char *pc = memchr(p, '%', (size_t)(end - p));
        if (!pc) {
            tb_put(c, &b, p, (size_t)(end - p));
            break;
        }
        tb_put(c, &b, p, (size_t)(pc - p));
        p = pc + 1;
        if (++c->steps > c->maxsteps)
            tpl_fail(c, "the render takes more than its step limit");
        const struct tv *arg = NULL, *keyed = NULL;
        struct tv kv;
        if (p < end && *p == '(') { /* %(key)s */
            if (rhs.t != TV_DICT)
                tpl_fail(c, "format requires a mapping");
            int depth = 1;
            const char *k = ++p;
            while (p < end && depth)
                depth += *p == '(' ? 1 : *p == ')' ? -1 : 0, p++;
            if (depth)
                tpl_fail(c, "incomplete format key");
            struct tv *found = td_get(rhs.u.d, tv_strref(k, (size_t)(p - 1 - k)));
            if (!found)
                tpl_fail(c, "KeyError: '%.*s'", (int)(p - 1 - k), k);
            kv = *found;
            keyed = &kv;
        }
        char flags[8] = {0};
        size_t nf = 0, width = 0;
        int prec = -1;
        while (p < end && strchr("-+ #0", *p) && *p) {
            if (nf < sizeof flags - 1 && !strchr(flags, *p))
                flags[nf++] = *p;
            p++;
        }
        for (int part = 0; part < 2; part++) { /* the width, then after '.' the precision: digits or '*' */
            if (part) {
                if (p >= end || *p != '.')
                    break;
                p++;
                prec = 0;
            }
            size_t v = 0;
            if (p < end && *p == '*') {
                p++;
                if (!tuple || next >= nargs)
                    tpl_fail(c, "not enough arguments for format string");
                const struct tv *w = &rhs.u.l->v[next++];
                if (w->t != TV_INT)
                    tpl_fail(c, "* wants int");
                int64_t x = w->u.i;
                if (!part && x < 0) { /* a negative width aligns left */
                    x = -x;
                    if (!strchr(flags, '-'))
                        flags[nf++] = '-';
                }
                v = x < 0 ? 0 : (size_t)x;
            } else {
                while (p < end && *p >= '0' && *p <= '9' && v < 100000)
                    v = v * 10 + (size_t)(*p++ - '0');
            }
            if (part)
                prec = (int)(v > 100000 ? 100000 : v);
            else
                width = v;
        }
        while (p < end && (*p == 'h' || *p == 'l' || *p == 'L'))
            p++;
        if (p >= end)
            tpl_fail(c, "incomplete format");
        char conv = *p++;
        if (conv == '%' && p == pc + 2) { /* %%; with anything between, an error as in Python */
            tb_put(c, &b, "%", 1);
            continue;
        }
        if (!strchr("sdiuoxXeEfFgGcra", conv))
            tpl_fail(c, "unsupported format character '%c' (0x%x)", conv, (unsigned char)conv);
        if (keyed) {
            arg = keyed;
        } else if (tuple) {
            if (next >= nargs)
                tpl_fail(c, "not enough arguments for format string");
            arg = &rhs.u.l->v[next++];
        } else {
            if (used_single)
                tpl_fail(c, "not enough arguments for format string");
            used_single = 1;
            arg = &rhs;
        }
        if (width > 100000)
            tpl_fail(c, "a format width beyond 100,000");
        convert(c, &b, conv, arg, flags, width, prec);
    }
    if ((tuple && next < nargs) || (!tuple && !used_single && !mapping))
        tpl_fail(c, "not all arguments converted during string formatting");
    return tv_buf_str(&b);
}

/* Python's round(f, -k): the multiple of 10^k nearest to f's exact value, ties to even, from f's exact decimal
 * expansion (glibc prints it); a zero keeps f's sign */
static double round_left(double f, int k)
{
    char buf[1200];
    snprintf(buf, sizeof buf, "%.400f", fabs(f));
    char *dot = strchr(buf, '.');
    size_t ni = (size_t)(dot - buf), keep = ni > (size_t)k ? ni - (size_t)k : 0;
    char digits[800] = {0};
    size_t nd = 0;
    for (const char *q = buf; *q && nd < sizeof digits - 1; q++)
        if (*q != '.')
            digits[nd++] = *q;
    digits[nd] = 0;
    /* the first dropped digit is digits[keep] when keep < ni + fraction, and the integer digits are left of ni */
    int up = 0;
    char first = (size_t)k > ni ? '0' : digits[keep];
    if (first > '5') {
        up = 1;
    } else if (first == '5') {
        const char *rest = digits + keep + 1;
        up = rest[strspn(rest, "0")] != 0 || (keep > 0 && (digits[keep - 1] - '0') % 2);
    }
    char out[900];
    size_t n = 0;
    out[n++] = '0'; /* room for a carry */
    for (size_t i = 0; i < keep; i++)
        out[n++] = digits[i];
    for (size_t i = n; up && i-- > 0;) {
        if (out[i] == '9') {
            out[i] = '0';
        } else {
            out[i]++;
            break;
        }
    }
    for (int i = 0; i < k && n < sizeof out - 1; i++)
        out[n++] = '0';
    out[n] = 0;
    double r = strtod(out, NULL);
    return signbit(f) ? -r : r;
}

/* jinja's round filter: Python's round(value, precision) ("common": half to even on the exact value, an int stays
 * an int), or math.ceil/floor(value * 10**precision) / 10**precision (a float) */
struct tv tv_round(struct tctx *c, struct tv v, struct tv prec, struct tv method)
{
    if (method.t != TV_STR || !((method.u.s.n == 6 && !memcmp(method.u.s.p, "common", 6)) ||
                                (method.u.s.n == 4 && !memcmp(method.u.s.p, "ceil", 4)) ||
                                (method.u.s.n == 5 && !memcmp(method.u.s.p, "floor", 5))))
        tpl_fail(c, "method must be common, ceil or floor");
    if (v.t != TV_INT && v.t != TV_BOOL && v.t != TV_FLOAT)
        tpl_fail(c, "type %s doesn't define __round__ method", tv_type_name(&v));
    if (prec.t != TV_INT && prec.t != TV_BOOL)
        tpl_fail(c, "'%s' object cannot be interpreted as an integer", tv_type_name(&prec));
    int64_t p = prec.t == TV_INT ? prec.u.i : prec.u.b, x = v.t == TV_INT ? v.u.i : v.u.b;
    if (method.u.s.p[0] == 'c' && method.u.s.p[1] == 'o') {
        if (v.t != TV_FLOAT) {
            if (p >= 0)
                return tv_int(x);
            if (p < -18)
                return tv_int(0);
            int64_t q = 1;
            for (int64_t k = 0; k < -p; k++)
                q *= 10;
            int64_t r = x % q, d = x - r; /* toward zero, then half to even */
            int64_t a = r < 0 ? -r : r;
            if (a * 2 > q || (a * 2 == q && (d / q) % 2))
                d += r < 0 ? -q : q;
            return tv_int(d);
        }
        if (p > 300 || isnan(v.u.f) || isinf(v.u.f))
            return v;
        if (p < 0)
            return tv_float(round_left(v.u.f, (int)(p < -400 ? 400 : -p)));
        char buf[400];
        snprintf(buf, sizeof buf, "%.*f", (int)p, v.u.f); /* glibc rounds the exact value, ties to even */
        return tv_float(strtod(buf, NULL));
    }
    if (p > 22 || p < -22)
        tpl_fail(c, "a round precision beyond 22 digits");
    double f = v.t == TV_FLOAT ? v.u.f : (double)x, m = 1;
    for (int64_t k = 0; k < (p < 0 ? -p : p); k++)
        m *= 10; /* exact through 10^22 */
    double y = p >= 0 ? f * m : f * (1 / m);
    y = (method.u.s.p[1] == 'e' ? ceil(y) : floor(y)) + 0.0; /* math's ceil/floor give an int: no -0 */
    return tv_float(p >= 0 ? y / m : y / (1 / m));
}
