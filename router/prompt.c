/* SPDX-License-Identifier: Apache-2.0 */
/* prompt.c - checks, the token estimate and the prefix blocks of a client's request, read in place (see
 * prompt.h). */
#include "prompt.h"
#include "xb_prefix.h"

#include "xpyd_util.h"

#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* range first: converting an out-of-range double to an integer is undefined behaviour */
static int is_int_value(struct jv v, double lo, double hi, double *out)
{
    double d;
    if (jv_double(v, &d) != 0 || !(d >= lo && d <= hi) || d != (double)(long long)d)
        return 0;
    *out = d;
    return 1;
}

const char *rw_validate(const struct rw_src *body, int chat, int *stream, int64_t *max_tokens)
{
    if (chat) {
        struct jv m = rw_src_get(body, "messages");
        struct jv_iter it;
        jv_iter_init(&it, m);
        if (jv_type(m) != JV_ARRAY || !jv_next(&it, NULL, NULL))
            return "'messages' is required and must be a non-empty array";
    } else {
        enum jv_type t = jv_type(rw_src_get(body, "prompt"));
        if (t != JV_STRING && t != JV_ARRAY)
            return "'prompt' is required and must be a string or an array";
    }
    enum jv_type s = jv_type(rw_src_get(body, "stream"));
    if (s != JV_NONE && s != JV_NULL && s != JV_TRUE && s != JV_FALSE)
        return "'stream' must be a boolean";
    *stream = s == JV_TRUE;
    enum jv_type so = jv_type(rw_src_get(body, "stream_options"));
    if (so != JV_NONE && so != JV_NULL && so != JV_OBJECT)
        return "'stream_options' must be an object";
    static const char *const names[] = {"max_completion_tokens", "max_tokens"};
    *max_tokens = -1;
    for (int i = 0; i < 2; i++) {
        struct jv v = rw_src_get(body, names[i]);
        double d;
        if (jv_type(v) == JV_NONE || jv_type(v) == JV_NULL)
            continue;
        if (!is_int_value(v, 1, (double)RW_MAX_TOKENS_LIMIT, &d))
            return i ? "'max_tokens' must be an integer from 1 to 1000000000000"
                     : "'max_completion_tokens' must be an integer from 1 to 1000000000000";
        if (*max_tokens < 0)
            *max_tokens = (int64_t)d;
    }
    if (*max_tokens < 0)
        *max_tokens = 16; /* unknown: the engine decides; 16 is the cost estimate (vLLM's completions default) */
    return NULL;
}

int64_t rw_room_tokens(const struct rw_src *body, int chat, int64_t max_tokens)
{
    static const char *const names[] = {"max_completion_tokens", "max_tokens"};
    int null = 0;
    for (int i = 0; i < 2; i++) {
        enum jv_type t = jv_type(rw_src_get(body, names[i]));
        if (t == JV_NUMBER) /* (rw_validate checked it) */
            return max_tokens;
        null |= t == JV_NULL;
    }
    return chat || null ? 1 : max_tokens;
}

static int64_t estimate_text(struct jv s, double bpt)
{
    return (int64_t)((double)jv_str_len(s) / bpt) + 1;
}

/* A completion prompt of token ids as clients send them, "[1, 2,3]": a flat array of non-negative integers
 * (the bytes were checked as strict JSON on arrival, so an array of only digits, commas and whitespace is
 * that). Such a prompt is read three times per request (its size, its kind, its blocks), and the generic
 * reading (jv_next, a value at a time) of a 4,000-token prompt was most of the router's CPU for it: its size
 * and kind are counted here sixteen bytes at a time, its blocks read in one tight pass (plain_ids). */

/* The elements of such an array, or -1 when arr is anything else. */
static long plain_count(struct jv arr)
{
    if (jv_type(arr) != JV_ARRAY)
        return -1;
    const char *p = arr.p + 1, *e = arr.p + arr.n - 1; /* between the brackets */
    long commas = 0;
    int digits = 0;
#ifdef __SSE2__
    const __m128i below0 = _mm_set1_epi8('0' - 1), above9 = _mm_set1_epi8('9' + 1), comma = _mm_set1_epi8(','),
                  sp = _mm_set1_epi8(' '), tab = _mm_set1_epi8('\t'), nl = _mm_set1_epi8('\n'),
                  cr = _mm_set1_epi8('\r');
    for (; e - p >= 16; p += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
        /* signed: a byte >= 0x80 is negative, so not a digit */
        __m128i d = _mm_and_si128(_mm_cmpgt_epi8(v, below0), _mm_cmplt_epi8(v, above9));
        __m128i c = _mm_cmpeq_epi8(v, comma);
        __m128i w = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, sp), _mm_cmpeq_epi8(v, tab)),
                                 _mm_or_si128(_mm_cmpeq_epi8(v, nl), _mm_cmpeq_epi8(v, cr)));
        if (_mm_movemask_epi8(_mm_or_si128(_mm_or_si128(d, c), w)) != 0xffff)
            return -1;
        commas += __builtin_popcount((unsigned)_mm_movemask_epi8(c));
        digits |= _mm_movemask_epi8(d);
    }
#endif
    for (; p < e; p++) {
        if (*p >= '0' && *p <= '9')
            digits = 1;
        else if (*p == ',')
            commas++;
        else if (!jv_is_ws(*p))
            return -1;
    }
    return digits ? commas + 1 : 0;
}

/* The ids of such an array, each fed to h; -1 (h then holds the ids fed so far) when arr is not an array or at
 * the first element that is not 1 to 15 digits (a longer number is read the generic way: token_id hashes it by
 * its double's value). */
static long plain_ids(struct jv arr, struct xb_hasher *h)
{
    if (jv_type(arr) != JV_ARRAY)
        return -1;
    const char *p = arr.p + 1, *e = arr.p + arr.n - 1; /* between the brackets */
    long n = 0;
    while (p < e && jv_is_ws(*p))
        p++;
    while (p < e) {
        const char *d = p;
        int64_t x = 0;
        for (; p < e && *p >= '0' && *p <= '9'; p++) {
            if (p - d == 15)
                return -1;
            x = x * 10 + (*p - '0');
        }
        if (p == d)
            return -1;
        while (p < e && jv_is_ws(*p))
            p++;
        if (p < e && *p != ',')
            return -1; /* a fraction or an exponent */
        xb_hasher_feed_id(h, x);
        n++;
        if (p < e) /* past the comma: another element follows (strict JSON) */
            for (p++; p < e && jv_is_ws(*p); p++)
                ;
    }
    return n;
}

int64_t rw_estimate_prompt(const struct rw_src *body, int chat, double bpt)
{
    int64_t n = 0;
    struct jv_iter it, parts;
    struct jv v, part;
    if (bpt <= 0)
        bpt = 4.0;
    if (!chat) {
        struct jv p = rw_src_get(body, "prompt");
        if (jv_type(p) == JV_STRING)
            return estimate_text(p, bpt);
        long ids = plain_count(p);
        if (ids >= 0)
            return ids; /* token ids are counted exactly */
        jv_iter_init(&it, p);
        while (jv_next(&it, NULL, &v)) {
            enum jv_type t = jv_type(v);
            if (t == JV_NUMBER)
                n++; /* token ids are counted exactly */
            else if (t == JV_STRING)
                n += estimate_text(v, bpt);
            else if (t == JV_ARRAY)
                n += (int64_t)jv_count(v);
        }
        return n;
    }
    jv_iter_init(&it, rw_src_get(body, "messages"));
    while (jv_next(&it, NULL, &v)) {
        n += 4; /* chat template overhead per message */
        struct jv c = jv_get(v, "content");
        if (jv_type(c) == JV_STRING)
            n += estimate_text(c, bpt);
        jv_iter_init(&parts, c);
        while (jv_next(&parts, NULL, &part)) {
            struct jv tx = jv_get(part, "text");
            if (jv_type(tx) == JV_STRING)
                n += estimate_text(tx, bpt);
        }
    }
    return n;
}

/* ---- prefix blocks: the prompt decoded straight into the chained block hasher ---- */

static void feed(void *h, const char *p, size_t n)
{
    xb_hasher_feed(h, p, n);
}

static void feed_str(struct xb_hasher *h, struct jv s)
{
    if (jv_type(s) == JV_STRING)
        jv_str_each(s, feed, h);
    xb_hasher_feed(h, "\x1f", 1); /* field separator: fields cannot run into each other */
}

static void feed_raw(struct xb_hasher *h, struct jv v)
{
    if (v.p)
        xb_hasher_feed(h, v.p, v.n);
    xb_hasher_feed(h, "\x1f", 1);
}

static void chat_serialize(const struct rw_src *body, struct xb_hasher *h)
{
    struct jv_iter it, parts;
    struct jv m, part;
    jv_iter_init(&it, rw_src_get(body, "messages"));
    while (jv_next(&it, NULL, &m)) {
        xb_hasher_feed(h, "\x1e", 1); /* message separator */
        feed_str(h, jv_get(m, "role"));
        feed_str(h, jv_get(m, "name"));
        struct jv c = jv_get(m, "content");
        if (jv_type(c) == JV_ARRAY) {
            jv_iter_init(&parts, c);
            while (jv_next(&parts, NULL, &part)) {
                struct jv tx = jv_get(part, "text");
                if (jv_type(tx) == JV_STRING)
                    feed_str(h, tx);
                else
                    feed_raw(h, part); /* an image or audio part: its whole description, as sent */
            }
        } else {
            feed_str(h, c);
        }
        feed_raw(h, jv_get(m, "tool_calls"));
        feed_str(h, jv_get(m, "tool_call_id"));
    }
}

/* A token id: the number's value as an integer; beyond int64 (or not an integer) hashed by its double's bits,
 * so such a value (which every engine refuses) still hashes deterministically. */
static int64_t token_id(struct jv v)
{
    if (v.n > 0 && v.n <= 15) { /* the usual id: digits only, exact */
        int64_t x = 0;
        size_t i = v.p[0] == '-';
        for (; i < v.n && v.p[i] >= '0' && v.p[i] <= '9'; i++)
            x = x * 10 + (v.p[i] - '0');
        if (i == v.n && v.n > (size_t)(v.p[0] == '-'))
            return v.p[0] == '-' ? -x : x;
    }
    double d = 0;
    jv_double(v, &d);
    if (d >= -9.2e18 && d <= 9.2e18)
        return (int64_t)d;
    int64_t bits;
    memcpy(&bits, &d, sizeof bits);
    return bits;
}

size_t rw_prefix_blocks(const struct rw_src *body, int chat, size_t block_tokens, double bpt, const uint64_t *extra,
                        uint64_t **out)
{
    *out = NULL;
    if (block_tokens == 0)
        return 0;
    size_t block_bytes = (size_t)((double)block_tokens * (bpt > 0 ? bpt : 4.0) + 0.5);
    if (block_bytes == 0)
        block_bytes = 1;
    if (chat) {
        struct xb_hasher *h = xb_hasher_new(block_bytes);
        xb_hasher_extra(h, extra);
        chat_serialize(body, h);
        return xb_hasher_finish(h, out);
    }
    struct jv p = rw_src_get(body, "prompt");
    struct jv_iter it;
    struct jv v;
    if (jv_type(p) == JV_ARRAY) { /* ["text"] or [[ids]]: the one prompt */
        struct jv first;
        jv_iter_init(&it, p);
        if (jv_next(&it, NULL, &first) && jv_type(first) != JV_NUMBER && !jv_next(&it, NULL, NULL))
            p = first;
    }
    if (jv_type(p) == JV_STRING) {
        struct xb_hasher *h = xb_hasher_new(block_bytes);
        xb_hasher_extra(h, extra);
        jv_str_each(p, feed, h);
        return xb_hasher_finish(h, out);
    }
    if (jv_type(p) != JV_ARRAY)
        return 0;
    struct xb_hasher *h = xb_hasher_new(block_tokens * sizeof(int64_t));
    xb_hasher_extra(h, extra);
    if (plain_ids(p, h) >= 0)
        return xb_hasher_finish(h, out);
    xb_hasher_finish(h, out); /* not plain ids: read again, the generic way */
    free(*out);
    *out = NULL;
    h = xb_hasher_new(block_tokens * sizeof(int64_t));
    xb_hasher_extra(h, extra);
    jv_iter_init(&it, p);
    while (jv_next(&it, NULL, &v) && jv_type(v) == JV_NUMBER) /* ids up to the first non-number */
        xb_hasher_feed_id(h, token_id(v));
    return xb_hasher_finish(h, out);
}

size_t rw_id_blocks(const uint32_t *ids, size_t n, size_t block_tokens, const uint64_t *extra, uint64_t **out)
{
    *out = NULL;
    if (block_tokens == 0)
        return 0;
    struct xb_hasher *h = xb_hasher_new(block_tokens * sizeof(int64_t)); /* as a token-id prompt is hashed */
    xb_hasher_extra(h, extra);
    for (size_t i = 0; i < n; i++)
        xb_hasher_feed_id(h, (int64_t)ids[i]);
    return xb_hasher_finish(h, out);
}

int rw_prompt_is_ids(const struct rw_src *body, int64_t *longest)
{
    struct jv p = rw_src_get(body, "prompt"), v;
    struct jv_iter it;
    int64_t flat = 0, inner = 0, n = 0;
    *longest = 0;
    if (jv_type(p) != JV_ARRAY)
        return 0;
    long ids = plain_count(p);
    if (ids >= 0) {
        *longest = ids;
        return ids > 0;
    }
    jv_iter_init(&it, p);
    while (jv_next(&it, NULL, &v)) {
        if (jv_type(v) == JV_NUMBER) {
            flat++;
        } else if (jv_type(v) == JV_ARRAY) {
            int64_t k = (int64_t)jv_count(v);
            inner = k > inner ? k : inner;
        } else {
            return 0;
        }
        n++;
    }
    *longest = flat > inner ? flat : inner;
    return n > 0;
}

size_t rw_prompt_texts(const struct rw_src *body, char **text, size_t **lens, size_t max)
{
    struct jv p = rw_src_get(body, "prompt"), v;
    struct jv_iter it;
    size_t n = 0, total = 0;
    *text = NULL;
    *lens = NULL;
    if (jv_type(p) == JV_STRING) {
        total = jv_str_len(p);
        n = 1;
    } else if (jv_type(p) == JV_ARRAY) {
        jv_iter_init(&it, p);
        while (jv_next(&it, NULL, &v)) {
            if (jv_type(v) != JV_STRING || n == max)
                return 0;
            total += jv_str_len(v);
            n++;
        }
    }
    if (!n)
        return 0;
    char *w = *text = XPYD_XALLOC(malloc(total + 1));
    size_t *l = *lens = XPYD_XALLOC(malloc(n * sizeof *l));
    if (jv_type(p) == JV_STRING) {
        l[0] = jv_str_decode(p, w);
        return 1;
    }
    size_t i = 0;
    jv_iter_init(&it, p);
    while (jv_next(&it, NULL, &v)) {
        l[i] = jv_str_decode(v, w);
        w += l[i++];
    }
    return n;
}

char *rw_string_member(const struct rw_src *body, const char *key)
{
    return jv_str_dup(rw_src_get(body, key));
}
