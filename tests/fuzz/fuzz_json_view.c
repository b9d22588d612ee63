/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_json_view.c - libFuzzer harness: the strict JSON scanner and the in-place views (router/json_view.c),
 * checked against an independent parser, cJSON. Whatever the scanner accepts, cJSON must read too (but for
 * lone UTF-16 surrogates, which Python's json and the scanner accept and cJSON refuses), and every view must
 * say what cJSON's tree says: the same type, the same decoded strings (byte for byte, NULs included), the same
 * numbers, the same elements, and for objects the same members, a repeated key reading as its last value (as
 * Python's json.loads, and cJSON's own list of members, hold them); and the views agree among themselves (views()). */
#include "json_view.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* UTF-8 as the scanner must require it, written out from the definition (RFC 3629, but surrogates allowed, as
 * Python's json.loads reads bytes): an accepted input holds nothing else */
static int utf8_ok(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = s[i], cp;
        size_t k;
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xc2 && c <= 0xdf)
            k = 1, cp = c & 0x1f;
        else if (c >= 0xe0 && c <= 0xef)
            k = 2, cp = c & 0x0f;
        else if (c >= 0xf0 && c <= 0xf4)
            k = 3, cp = c & 0x07;
        else
            return 0;
        if (n - i <= k)
            return 0;
        for (size_t x = 1; x <= k; x++) {
            if ((s[i + x] & 0xc0) != 0x80)
                return 0;
            cp = cp << 6 | (s[i + x] & 0x3f);
        }
        if ((k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10ffff)))
            return 0;
        i += k + 1;
    }
    return 1;
}

static int has_lone_surrogate(const char *s, size_t n)
{
    for (size_t i = 0; i + 5 < n; i++)
        if (s[i] == '\\' && s[i + 1] == 'u' && (s[i + 2] == 'd' || s[i + 2] == 'D') && strchr("89abcdefABCDEF", s[i + 3]))
            return 1; /* any surrogate escape: cJSON refuses the lone ones; keep the comparison simple */
    return 0;
}

static void same(struct jv v, const cJSON *c, int depth)
{
    if (depth > 64)
        return;
    switch (jv_type(v)) {
    case JV_NULL:
        if (!cJSON_IsNull(c))
            abort();
        return;
    case JV_TRUE:
        if (!cJSON_IsTrue(c))
            abort();
        return;
    case JV_FALSE:
        if (!cJSON_IsFalse(c))
            abort();
        return;
    case JV_NUMBER: {
        double d;
        if (!cJSON_IsNumber(c) || jv_double(v, &d) != 0)
            abort();
        if (!(d == c->valuedouble || (isnan(d) && isnan(c->valuedouble))))
            abort();
        return;
    }
    case JV_STRING: {
        if (!cJSON_IsString(c))
            abort();
        char *s = jv_str_dup(v);
        size_t n = jv_str_len(v);
        /* cJSON's string ends at its first NUL: compare up to it */
        if (strcmp(s, c->valuestring) != 0 || n < strlen(c->valuestring))
            abort();
        free(s);
        return;
    }
    case JV_ARRAY: {
        if (!cJSON_IsArray(c) || jv_count(v) != (size_t)cJSON_GetArraySize(c))
            abort();
        struct jv_iter it;
        struct jv e;
        const cJSON *k = c->child;
        jv_iter_init(&it, v);
        while (jv_next(&it, NULL, &e)) {
            same(e, k, depth + 1);
            k = k->next;
        }
        return;
    }
    case JV_OBJECT: {
        if (!cJSON_IsObject(c) || jv_count(v) != (size_t)cJSON_GetArraySize(c))
            abort();
        struct jv_iter it;
        struct jv key, val;
        const cJSON *k = c->child;
        /* cJSON keeps a key only up to a NUL ("a\u0000b" reads as "a"): with such a key in the object, its keys
         * cannot be looked up in cJSON's tree (another key "a" would find the wrong member) */
        int nul_keys = 0;
        jv_iter_init(&it, v);
        while (jv_next(&it, &key, NULL)) {
            char *ks = jv_str_dup(key);
            nul_keys |= strlen(ks) != jv_str_len(key);
            free(ks);
        }
        jv_iter_init(&it, v);
        while (jv_next(&it, &key, &val)) {
            char *ks = jv_str_dup(key);
            if (strcmp(ks, k->string) != 0) /* members in order */
                abort();
            if (!nul_keys) { /* looked up */
                const cJSON *last = NULL;
                for (const cJSON *x = c->child; x; x = x->next)
                    if (!strcmp(x->string, ks))
                        last = x;
                same(jv_get(v, ks), last, depth + 1);
            }
            same(val, k, depth + 1);
            free(ks);
            k = k->next;
        }
        return;
    }
    case JV_NONE:
        abort();
    }
}

/* The views among themselves, for every accepted input (no cJSON: lone surrogates too): a string decoded into
 * exactly its length (jv_str_decode) and into room for its escaped bytes (jv_str_dup's 16-byte copies) gives the
 * same bytes; a container opened where it starts (jv_iter_open, bounded by the input's end, not its own) gives
 * the same members as its view and ends where the view does. */
static void views(struct jv v, const char *end, int depth)
{
    if (depth > 64)
        return;
    if (jv_type(v) == JV_STRING) {
        size_t n = jv_str_len(v);
        char *exact = malloc(n + 1), *dup = jv_str_dup(v);
        if (jv_str_decode(v, exact) != n || memcmp(exact, dup, n) != 0 || dup[n] != 0)
            abort();
        free(exact);
        free(dup);
        return;
    }
    if (jv_type(v) != JV_OBJECT && jv_type(v) != JV_ARRAY)
        return;
    struct jv_iter a, b;
    struct jv ka, va, kb, vb;
    jv_iter_init(&a, v);
    jv_iter_open(&b, v.p, end);
    for (;;) {
        int more = jv_next(&a, &ka, &va);
        if (more != jv_next(&b, &kb, &vb))
            abort();
        if (!more)
            break;
        if (ka.p != kb.p || ka.n != kb.n || va.p != vb.p || va.n != vb.n)
            abort();
        if (ka.p)
            views(ka, end, depth + 1);
        views(va, end, depth + 1);
    }
    if (jv_iter_end(&b) != v.p + v.n)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *s = (const char *)data;
    const char *err = NULL;
    size_t at = 0;
    if (jv_check(s, size, &err, &at) != 0) {
        if (!err || at > size)
            abort(); /* a refusal says why and where */
        return 0;
    }
    struct jv v = jv_at(s, s + size);
    if (!v.p)
        abort();
    views(v, s + size, 0);
    if (!utf8_ok(data, size))
        abort(); /* accepted bytes that are not UTF-8 */
    if (has_lone_surrogate(s, size) || memchr(s, 0, size))
        return 0;
    cJSON *c = cJSON_ParseWithLength(s, size);
    if (!c)
        abort(); /* accepted here, refused by an independent parser */
    same(v, c, 0);
    cJSON_Delete(c);
    return 0;
}
