/* SPDX-License-Identifier: Apache-2.0 */
/* json_view.c - strict JSON checked once, then read in place (see json_view.h). */
#include "json_view.h"

#include "xpyd_util.h"

#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* ---------- the scanner ---------- */

static int jfail(struct jv_scan *j, const char *why)
{
    if (!j->err)
        j->err = why;
    return -1;
}

void jv_ws(struct jv_scan *j)
{
    while (j->p < j->e && jv_is_ws(*j->p))
        j->p++;
}

/* The first byte at or after p that ends a run of plain string bytes: a quote, a backslash, a control
 * character or a non-ASCII byte; sixteen bytes at a time where SSE2 is there (every x86-64), since a prompt is
 * mostly such runs and the scan is most of what reading a body costs. */
static const char *plain_run(const char *p, const char *e)
{
#ifdef __SSE2__
    const __m128i q = _mm_set1_epi8('"'), bs = _mm_set1_epi8('\\'), sp = _mm_set1_epi8(0x20);
    while (e - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
        /* signed: bytes >= 0x80 are negative, so below 0x20 too */
        __m128i m = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, q), _mm_cmpeq_epi8(v, bs)), _mm_cmplt_epi8(v, sp));
        int mask = _mm_movemask_epi8(m);
        if (mask)
            return p + __builtin_ctz((unsigned)mask);
        p += 16;
    }
#endif
    while (p < e) {
        unsigned char c = (unsigned char)*p;
        if (c < 0x20 || c >= 0x80 || c == '"' || c == '\\')
            break;
        p++;
    }
    return p;
}

/* Past one UTF-8 sequence at p (a byte >= 0x80), or NULL when it is not well-formed (surrogates allowed, as
 * Python's json.loads on bytes accepts them). Two- and three-byte sequences that cannot be overlong (most text not
 * in Latin script) are taken at once. */
static inline const char *utf8_next(const char *p, const char *e)
{
    const unsigned char *u = (const unsigned char *)p;
    size_t left = (size_t)(e - p);
    if (left >= 3 && u[0] >= 0xe1 && u[0] <= 0xef && (u[1] & 0xc0) == 0x80 && (u[2] & 0xc0) == 0x80)
        return p + 3;
    if (left >= 2 && u[0] >= 0xc2 && u[0] <= 0xdf && (u[1] & 0xc0) == 0x80)
        return p + 2;
    int n;
    uint32_t cp;
    if (u[0] >= 0xc2 && u[0] <= 0xdf)
        n = 2, cp = u[0] & 0x1f;
    else if (u[0] >= 0xe0 && u[0] <= 0xef)
        n = 3, cp = u[0] & 0x0f;
    else if (u[0] >= 0xf0 && u[0] <= 0xf4)
        n = 4, cp = u[0] & 0x07;
    else
        return NULL;
    if (left < (size_t)n)
        return NULL;
    for (int i = 1; i < n; i++) {
        if ((u[i] & 0xc0) != 0x80)
            return NULL;
        cp = cp << 6 | (u[i] & 0x3f);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)))
        return NULL;
    return p + n;
}

/* a hex digit's value + 1 (0: not one): one load per digit (text sent as \uXXXX has four in every six bytes) */
static const unsigned char HEX1[256] = {
    ['0'] = 1,  ['1'] = 2,  ['2'] = 3,  ['3'] = 4,  ['4'] = 5,  ['5'] = 6,  ['6'] = 7,  ['7'] = 8,
    ['8'] = 9,  ['9'] = 10, ['a'] = 11, ['b'] = 12, ['c'] = 13, ['d'] = 14, ['e'] = 15, ['f'] = 16,
    ['A'] = 11, ['B'] = 12, ['C'] = 13, ['D'] = 14, ['E'] = 15, ['F'] = 16};

static int hexval(char c)
{
    return HEX1[(unsigned char)c] - 1;
}

int jv_scan_string(struct jv_scan *j, int *has_nul)
{
    j->p++; /* the opening quote */
    for (;;) {
        j->p = plain_run(j->p, j->e);
        if (j->p >= j->e)
            break;
        unsigned char c = (unsigned char)*j->p;
        if (c == '"') {
            j->p++;
            return 0;
        }
        if (c < 0x20)
            return jfail(j, "control character in a string");
        if (c >= 0x80) { /* a run of them (Chinese, Cyrillic...) checked here, not one per return to plain_run */
            const char *p = j->p;
            do
                if (!(p = utf8_next(p, j->e)))
                    return jfail(j, "invalid UTF-8 in a string");
            while (p < j->e && (unsigned char)*p >= 0x80);
            j->p = p;
            continue;
        }
        /* a backslash */
        if (j->e - j->p < 2)
            break;
        char x = j->p[1];
        if (x == 'u') {
            if (j->e - j->p < 6)
                break;
            for (int i = 2; i < 6; i++)
                if (hexval(j->p[i]) < 0)
                    return jfail(j, "invalid \\u escape");
            if (has_nul && !memcmp(j->p + 2, "0000", 4))
                *has_nul = 1;
            j->p += 6;
        } else if (x && strchr("\"\\/bfnrt", x)) {
            j->p += 2;
        } else {
            return jfail(j, "invalid escape in a string");
        }
    }
    return jfail(j, "unterminated string");
}

static int digits(struct jv_scan *j)
{
    const char *a = j->p;
    while (j->p < j->e && *j->p >= '0' && *j->p <= '9')
        j->p++;
    return j->p > a ? 0 : jfail(j, "invalid number");
}

static int jnumber(struct jv_scan *j)
{
    if (*j->p == '-')
        j->p++;
    if (j->p < j->e && *j->p == '0')
        j->p++;
    else if (digits(j))
        return -1;
    if (j->p < j->e && *j->p == '.') {
        j->p++;
        if (digits(j))
            return -1;
    }
    if (j->p < j->e && (*j->p == 'e' || *j->p == 'E')) {
        j->p++;
        if (j->p < j->e && (*j->p == '+' || *j->p == '-'))
            j->p++;
        if (digits(j))
            return -1;
    }
    return 0;
}

/* Inside an array, a run of plain integers each followed by a comma ("1, 22,333," of a token-id prompt, most of
 * such a body), checked in one tight loop: '0' or [1-9][0-9]*, whitespace, ','. It stops at the first element
 * that is anything else (a sign, a fraction, an exponent, a leading zero, the last element, another value),
 * leaving j->p at that element's first byte for the generic reading, so what is accepted does not change. */
static void int_run(struct jv_scan *j)
{
    const char *p = j->p, *e = j->e;
    while (p < e && *p >= '0' && *p <= '9') {
        const char *q = p + 1;
        if (*p != '0')
            while (q < e && *q >= '0' && *q <= '9')
                q++;
        while (q < e && jv_is_ws(*q))
            q++;
        if (q >= e || *q != ',')
            break;
        for (q++; q < e && jv_is_ws(*q); q++)
            ;
        p = j->p = q;
    }
}

static int jcontainer(struct jv_scan *j, int depth)
{
    char close = *j->p == '{' ? '}' : ']';
    int obj = close == '}';
    if (depth >= JV_MAX_DEPTH)
        return jfail(j, "JSON nested too deeply");
    j->p++;
    jv_ws(j);
    if (j->p < j->e && *j->p == close) {
        j->p++;
        return 0;
    }
    for (;;) {
        jv_ws(j);
        if (obj) {
            if (j->p >= j->e || *j->p != '"')
                return jfail(j, "expected a string key");
            if (jv_scan_string(j, NULL))
                return -1;
            jv_ws(j);
            if (j->p >= j->e || *j->p != ':')
                return jfail(j, "expected ':'");
            j->p++;
        } else {
            int_run(j);
        }
        if (jv_scan_value(j, depth + 1))
            return -1;
        jv_ws(j);
        if (j->p < j->e && *j->p == ',') {
            j->p++;
            continue;
        }
        if (j->p < j->e && *j->p == close) {
            j->p++;
            return 0;
        }
        return jfail(j, obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

int jv_scan_value(struct jv_scan *j, int depth)
{
    jv_ws(j);
    if (j->p >= j->e)
        return jfail(j, "unexpected end of JSON");
    char c = *j->p;
    if (c == '{' || c == '[')
        return jcontainer(j, depth);
    if (c == '"')
        return jv_scan_string(j, NULL);
    if (c == '-' || (c >= '0' && c <= '9'))
        return jnumber(j);
    static const char *const lit[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(lit[i]);
        if ((size_t)(j->e - j->p) >= n && !memcmp(j->p, lit[i], n)) {
            j->p += n;
            return 0;
        }
    }
    return jfail(j, "invalid JSON value");
}

int jv_check(const char *data, size_t len, const char **err, size_t *err_at)
{
    if (!data) /* nothing: no value (and no arithmetic on a null pointer) */
        data = "", len = 0;
    struct jv_scan j = {data, data, data + len, NULL};
    int rc = jv_scan_value(&j, 0);
    if (rc == 0) {
        jv_ws(&j);
        if (j.p != j.e)
            rc = jfail(&j, "unexpected data after the JSON value");
    }
    if (rc && err)
        *err = j.err;
    if (rc && err_at)
        *err_at = (size_t)(j.p - data);
    return rc;
}

/* ---------- views (over checked bytes) ---------- */

static const char *skip_ws(const char *p, const char *e)
{
    while (p < e && jv_is_ws(*p))
        p++;
    return p;
}

/* Past a checked string (p at its opening quote): its closing quote is the first quote after an even run of
 * backslashes (an odd one escapes it; in checked bytes a backslash only ever begins an escape), found with
 * memchr: neither UTF-8 text nor escapes (a conversation's Chinese as \uXXXX) stop the search, only quotes */
static const char *skip_string(const char *p, const char *e)
{
    const char *start = ++p;
    for (;;) {
        const char *q = p < e ? memchr(p, '"', (size_t)(e - p)) : NULL;
        if (!q)
            return e;
        size_t bs = 0;
        while (q - bs > start && q[-1 - (ptrdiff_t)bs] == '\\')
            bs++;
        if (!(bs & 1))
            return q + 1;
        p = q + 1;
    }
}

static const char *skip_value(const char *p, const char *e)
{
    if (p >= e)
        return e;
    if (*p == '"')
        return skip_string(p, e);
    if (*p == '{' || *p == '[') {
        long depth = 0;
        while (p < e) {
            char c = *p;
            if (c == '"') {
                p = skip_string(p, e);
                continue;
            }
            if (c == '{' || c == '[')
                depth++;
            else if ((c == '}' || c == ']') && --depth == 0)
                return p + 1;
            p++;
        }
        return e;
    }
    while (p < e && *p != ',' && *p != ']' && *p != '}' && !jv_is_ws(*p)) /* a number or a literal */
        p++;
    return p;
}

struct jv jv_at(const char *p, const char *e)
{
    p = skip_ws(p, e);
    struct jv v = {p < e ? p : NULL, 0};
    if (v.p)
        v.n = (size_t)(skip_value(p, e) - p);
    return v;
}

enum jv_type jv_type(struct jv v)
{
    if (!v.p || !v.n)
        return JV_NONE;
    switch (*v.p) {
    case '{': return JV_OBJECT;
    case '[': return JV_ARRAY;
    case '"': return JV_STRING;
    case 't': return JV_TRUE;
    case 'f': return JV_FALSE;
    case 'n': return JV_NULL;
    default: return JV_NUMBER;
    }
}

void jv_iter_init(struct jv_iter *it, struct jv c)
{
    enum jv_type t = jv_type(c);
    it->obj = t == JV_OBJECT;
    if (t != JV_OBJECT && t != JV_ARRAY) {
        it->p = it->e = NULL;
        return;
    }
    it->p = c.p + 1;
    it->e = c.p + c.n - 1; /* the closing bracket */
}

void jv_iter_open(struct jv_iter *it, const char *p, const char *e)
{
    p = skip_ws(p, e);
    it->obj = p < e && *p == '{';
    it->p = p < e && (*p == '{' || *p == '[') ? p + 1 : NULL;
    it->e = e;
}

const char *jv_iter_end(const struct jv_iter *it)
{
    return it->p && it->p < it->e ? it->p + 1 : it->e;
}

int jv_next(struct jv_iter *it, struct jv *key, struct jv *val)
{
    if (!it->p)
        return 0;
    const char *p = skip_ws(it->p, it->e);
    it->p = p;
    if (p >= it->e || *p == '}' || *p == ']') /* (a closing bracket: an opened container's end) */
        return 0;
    if (it->obj) {
        const char *k = p;
        p = skip_string(p, it->e);
        if (key)
            *key = (struct jv){k, (size_t)(p - k)};
        p = skip_ws(p, it->e);
        p = skip_ws(p + 1, it->e); /* the colon */
    } else if (key) {
        *key = (struct jv){NULL, 0};
    }
    const char *end = skip_value(p, it->e);
    if (val)
        *val = (struct jv){p, (size_t)(end - p)};
    p = skip_ws(end, it->e);
    it->p = p < it->e && *p == ',' ? p + 1 : p;
    return 1;
}

size_t jv_count(struct jv v)
{
    struct jv_iter it;
    size_t n = 0;
    jv_iter_init(&it, v);
    while (jv_next(&it, NULL, NULL))
        n++;
    return n;
}

struct jv jv_get(struct jv o, const char *key)
{
    struct jv found = {NULL, 0}, k, v;
    if (jv_type(o) != JV_OBJECT)
        return found;
    size_t kl = strlen(key);
    struct jv_iter it;
    jv_iter_init(&it, o);
    while (jv_next(&it, &k, &v))
        if (jv_str_eq(k, key, kl))
            found = v; /* the last of a repeated key, as json.loads */
    return found;
}

static unsigned hex4(const char *p)
{
    return (unsigned)(hexval(p[0]) << 12 | hexval(p[1]) << 8 | hexval(p[2]) << 4 | hexval(p[3]));
}

/* The code point of the escape at p (past it in *next): \uXXXX, a surrogate pair, or a one-letter one. */
static uint32_t escape_at(const char *p, const char *e, const char **next)
{
    char x = p[1];
    *next = p + 2;
    switch (x) {
    case 'b': return '\b';
    case 'f': return '\f';
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case 'u': break;
    default: return (unsigned char)x; /* " \ / */
    }
    uint32_t cp = hex4(p + 2);
    *next = p + 6;
    if (cp >= 0xd800 && cp <= 0xdbff && e - *next >= 6 && (*next)[0] == '\\' && (*next)[1] == 'u') {
        uint32_t lo = hex4(*next + 2);
        if (lo >= 0xdc00 && lo <= 0xdfff) {
            *next += 6;
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        }
    }
    return cp;
}

static size_t utf8_put(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) { /* a lone surrogate too: its three-byte form */
        out[0] = (char)(0xe0 | cp >> 12);
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | cp >> 18);
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Decodes string s into out, or hands its decoded pieces to put, or (neither) measures it. roomy: out has s.n - 2
 * bytes (what the escaped text takes), not only the decoded length. */
static size_t str_walk(struct jv s, char *out, int roomy, void (*put)(void *arg, const char *p, size_t n), void *arg)
{
    if (jv_type(s) != JV_STRING || s.n < 2)
        return 0;
    const char *p = s.p + 1, *e = s.p + s.n - 1;
    size_t n = 0;
    char tmp[4];
#ifdef __SSE2__
    /* decoded with 16-byte copies while looking for escapes (roomy: a store ends before p's 16 bytes end, and the
     * decoded text is never longer, so inside s.n - 2 bytes), or measured the same way */
    if ((out && roomy) || (!out && !put)) {
        const __m128i bs = _mm_set1_epi8('\\');
        while (e - p >= 16) {
            __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
            if (out)
                _mm_storeu_si128((__m128i *)(void *)(out + n), v);
            int mask = _mm_movemask_epi8(_mm_cmpeq_epi8(v, bs));
            if (!mask) {
                p += 16;
                n += 16;
                continue;
            }
            int k = __builtin_ctz((unsigned)mask);
            p += k;
            n += (size_t)k;
            do /* escapes one after the other (text sent as \uXXXX) without a load between them */
                n += utf8_put(escape_at(p, e, &p), out ? out + n : tmp);
            while (p < e && *p == '\\');
        }
    }
#endif
    while (p < e) {
        const char *q = memchr(p, '\\', (size_t)(e - p));
        if (!q)
            q = e;
        if (out)
            memcpy(out + n, p, (size_t)(q - p));
        else if (put && q > p)
            put(arg, p, (size_t)(q - p));
        n += (size_t)(q - p);
        p = q;
        if (p >= e)
            break;
        uint32_t cp = escape_at(p, e, &p);
        size_t k = utf8_put(cp, out ? out + n : tmp);
        if (!out && put)
            put(arg, tmp, k);
        n += k;
    }
    return n;
}

size_t jv_str_len(struct jv s)
{
    return str_walk(s, NULL, 0, NULL, NULL);
}

size_t jv_str_decode(struct jv s, char *out)
{
    return str_walk(s, out, 0, NULL, NULL);
}

void jv_str_each(struct jv s, void (*put)(void *arg, const char *p, size_t n), void *arg)
{
    str_walk(s, NULL, 0, put, arg);
}

char *jv_str_dup(struct jv v)
{
    if (jv_type(v) != JV_STRING)
        return NULL;
    char *out = XPYD_XALLOC(malloc(v.n)); /* decoded: at most n - 2 bytes, and the NUL */
    out[str_walk(v, out, 1, NULL, NULL)] = 0;
    return out;
}

int jv_str_eq(struct jv s, const char *lit, size_t len)
{
    if (jv_type(s) != JV_STRING || s.n < 2)
        return 0;
    const char *raw = s.p + 1;
    size_t rawn = s.n - 2;
    if (!memchr(raw, '\\', rawn)) /* the usual key: compared as it lies */
        return rawn == len && memcmp(raw, lit, len) == 0;
    if (len > rawn)
        return 0;
    char buf[256], *d = rawn <= sizeof buf ? buf : XPYD_XALLOC(malloc(rawn));
    size_t n = str_walk(s, d, 1, NULL, NULL);
    int eq = n == len && memcmp(d, lit, len) == 0;
    if (d != buf)
        free(d);
    return eq;
}

int jv_double(struct jv v, double *out)
{
    if (jv_type(v) != JV_NUMBER)
        return -1;
    char buf[64], *d = v.n < sizeof buf ? buf : XPYD_XALLOC(malloc(v.n + 1));
    memcpy(d, v.p, v.n);
    d[v.n] = 0;
    *out = strtod(d, NULL);
    if (d != buf)
        free(d);
    return 0;
}
