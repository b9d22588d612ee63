/* SPDX-License-Identifier: Apache-2.0 */
/* body_src.c - the client's body bytes, their top-level members, and the engines' bodies built from them (see
 * body_src.h). */
#include "body_src.h"

#include "xpyd_util.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void rw_src_free(struct rw_src *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++)
        free(s->m[i].key);
    free(s->m);
    free(s->text);
    free(s);
}

static int member_cmp(const void *a, const void *b)
{
    const struct rw_member *const *x = a, *const *y = b;
    int c = strcmp((*x)->key, (*y)->key);
    return c ? c : ((*x)->start > (*y)->start) - ((*x)->start < (*y)->start);
}

/* Marks every member but the last of each key as a duplicate. */
static void mark_dups(struct rw_src *s)
{
    struct rw_member *m = s->m;
    size_t n = s->n;
    if (n > 1 && n <= 16) { /* the usual body: pairs compared, no sort */
        for (size_t i = 0; i + 1 < n; i++)
            for (size_t k = i + 1; k < n && !m[i].dup; k++)
                if (!strcmp(m[i].key, m[k].key))
                    m[i].dup = s->has_dup = 1;
    } else if (n > 1) { /* sorted by key then position: a hostile body with many keys costs n log n */
        struct rw_member **order = XPYD_XALLOC(malloc(n * sizeof *order));
        for (size_t i = 0; i < n; i++)
            order[i] = &m[i];
        qsort(order, n, sizeof *order, member_cmp);
        for (size_t i = 0; i + 1 < n; i++)
            if (!strcmp(order[i]->key, order[i + 1]->key))
                order[i]->dup = s->has_dup = 1;
        free(order);
    }
}

struct rw_src *rw_src_take(char *text, size_t len, size_t max_members, const char **err, size_t *err_at)
{
    text[len] = 0;
    struct jv_scan j = {text, text, text + len, NULL};
    size_t cap = 0, n = 0;
    struct rw_member *m = NULL;
    jv_ws(&j);
    int ok = 1;
    if (j.p >= j.e || *j.p != '{') {
        j.err = "request body must be a JSON object";
        ok = 0;
    } else {
        j.p++;
        jv_ws(&j);
    }
    if (ok && j.p < j.e && *j.p == '}') {
        j.p++;
    } else if (ok) {
        for (;;) {
            jv_ws(&j);
            if (j.p >= j.e || *j.p != '"') {
                ok = 0, j.err = j.err ? j.err : "expected a string key";
                break;
            }
            size_t start = (size_t)(j.p - text);
            int nul = 0;
            if (jv_scan_string(&j, &nul)) {
                ok = 0;
                break;
            }
            if (nul) {
                ok = 0, j.err = "NUL in an object key";
                break;
            }
            size_t kend = (size_t)(j.p - text);
            jv_ws(&j);
            if (j.p >= j.e || *j.p != ':') {
                ok = 0, j.err = "expected ':'";
                break;
            }
            j.p++;
            jv_ws(&j);
            size_t vstart = (size_t)(j.p - text);
            if (jv_scan_value(&j, 1)) {
                ok = 0;
                break;
            }
            if (n == max_members) {
                ok = 0, j.err = "too many top-level members (--max-body-keys)";
                break;
            }
            if (n == cap) {
                cap = cap ? cap * 2 : 16;
                m = XPYD_XALLOC(realloc(m, cap * sizeof *m));
            }
            m[n++] = (struct rw_member){jv_str_dup((struct jv){text + start, kend - start}), start, vstart,
                                        (size_t)(j.p - text), 0};
            jv_ws(&j);
            if (j.p < j.e && *j.p == ',') {
                j.p++;
                continue;
            }
            if (j.p < j.e && *j.p == '}') {
                j.p++;
                break;
            }
            ok = 0, j.err = "expected ',' or '}'";
            break;
        }
    }
    if (ok) {
        jv_ws(&j);
        if (j.p != j.e)
            ok = 0, j.err = "unexpected data after the JSON object";
    }
    if (!ok) {
        *err = j.err ? j.err : "malformed JSON";
        *err_at = (size_t)(j.p - text);
        for (size_t i = 0; i < n; i++)
            free(m[i].key);
        free(m);
        free(text);
        return NULL;
    }
    struct rw_src *s = XPYD_XALLOC(calloc(1, sizeof *s));
    s->text = text;
    s->len = len;
    s->m = m;
    s->n = n;
    mark_dups(s);
    return s;
}

struct rw_src *rw_src_parse(const char *data, size_t len, size_t max_members, const char **err, size_t *err_at)
{
    char *text = XPYD_XALLOC(malloc(len + 1));
    memcpy(text, data, len);
    return rw_src_take(text, len, max_members, err, err_at);
}

struct jv rw_src_get(const struct rw_src *s, const char *key)
{
    for (size_t i = s->n; i-- > 0;) /* the last of a repeated key */
        if (!strcmp(s->m[i].key, key))
            return (struct jv){s->text + s->m[i].vstart, s->m[i].end - s->m[i].vstart};
    return (struct jv){NULL, 0};
}

struct jv rw_src_view(const struct rw_src *s)
{
    return jv_at(s->text, s->text + s->len);
}

/* ---- bodies for the engines: the client's members, byte for byte, but for the ones set or removed ---- */

struct rw_edit {
    const char *key;
    const char *raw;   /* the new value's JSON text; NULL removes the member */
    int if_present;    /* set only when the client sent the key */
};

static int has_key(const struct rw_src *s, const char *k)
{
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->m[i].key, k))
            return 1;
    return 0;
}

static char *emit(const struct rw_src *s, const struct rw_edit *ed, size_t ne, size_t *len)
{
    int changed = s->has_dup;
    for (size_t k = 0; k < ne && !changed; k++)
        changed = ed[k].raw ? (!ed[k].if_present || has_key(s, ed[k].key)) : has_key(s, ed[k].key);
    if (!changed) { /* nothing to change: exactly the client's bytes */
        char *out = XPYD_XALLOC(malloc(s->len + 1));
        memcpy(out, s->text, s->len + 1);
        *len = s->len;
        return out;
    }
    size_t cap = s->len + 64, n = 0;
    for (size_t k = 0; k < ne; k++)
        cap += (ed[k].raw ? strlen(ed[k].raw) : 0) + strlen(ed[k].key) + 8;
    char *out = XPYD_XALLOC(malloc(cap));
    out[n++] = '{';
    for (size_t i = 0; i < s->n; i++) {
        const struct rw_member *m = &s->m[i];
        size_t k = 0;
        while (k < ne && strcmp(ed[k].key, m->key) != 0)
            k++;
        if (m->dup || k < ne)
            continue;
        if (n > 1)
            out[n++] = ',';
        memcpy(out + n, s->text + m->start, m->end - m->start);
        n += m->end - m->start;
    }
    for (size_t k = 0; k < ne; k++) {
        if (!ed[k].raw || (ed[k].if_present && !has_key(s, ed[k].key)))
            continue;
        n += (size_t)sprintf(out + n, "%s\"%s\":%s", n > 1 ? "," : "", ed[k].key, ed[k].raw);
    }
    out[n++] = '}';
    out[n] = 0;
    *len = n;
    return out;
}

char *rw_prefill_body(const struct rw_src *client, int kv_params, size_t *len)
{
    return rw_prefill_body_kv(client,
                              kv_params ? "{\"do_remote_decode\":true,\"do_remote_prefill\":false,\"remote_engine_id\":null,"
                                          "\"remote_block_ids\":null,\"remote_host\":null,\"remote_port\":null}"
                                        : NULL,
                              len);
}

char *rw_prefill_body_kv(const struct rw_src *client, const char *kv_json, size_t *len)
{
    const struct rw_edit ed[] = {
        {"stream_options", NULL, 0},
        {"min_tokens", NULL, 0},
        {"min_completion_tokens", NULL, 0},
        {"stream", "false", 0},
        {"max_tokens", "1", 0},
        {"max_completion_tokens", "1", 1},
        {"kv_transfer_params", kv_json, 0},
    };
    return emit(client, ed, kv_json ? 7 : 6, len);
}

char *rw_decode_body(const struct rw_src *client, const char *kv_params, int kv_mode, size_t *len)
{
    if (!kv_mode)
        return emit(client, NULL, 0, len);
    const struct rw_edit ed[] = {{"kv_transfer_params", kv_params, 0}};
    return emit(client, ed, 1, len);
}

/* s as a JSON string's text (quoted, escaped; malloc'd). */
static char *json_quote(const char *s)
{
    cJSON *j = XPYD_XALLOC(cJSON_CreateString(s));
    char *out = XPYD_XALLOC(cJSON_PrintUnformatted(j));
    cJSON_Delete(j);
    return out;
}

char *rw_bootstrap_body(const struct rw_src *client, const char *host, int port, uint64_t room, const char *rid,
                        size_t *len)
{
    char roomtxt[32], porttxt[16];
    snprintf(roomtxt, sizeof roomtxt, "%" PRIu64, room); /* exact 63-bit integer */
    snprintf(porttxt, sizeof porttxt, "%d", port);
    char *hs = json_quote(host), *rs = json_quote(rid);
    const struct rw_edit ed[] = {
        {"bootstrap_host", hs, 0}, {"bootstrap_port", porttxt, 0}, {"bootstrap_room", roomtxt, 0}, {"rid", rs, 0}};
    char *out = emit(client, ed, 4, len);
    free(hs);
    free(rs);
    return out;
}

char *rw_kv_release_body(const struct rw_src *client, const char *kv_params, size_t *len)
{
    const struct rw_edit ed[] = {
        {"kv_transfer_params", kv_params, 0}, {"stream_options", NULL, 0}, {"stream", "false", 0},
        {"max_tokens", "1", 0},               {"max_completion_tokens", "1", 1},
    };
    return emit(client, ed, 5, len);
}

/* The new value of the prompt member: the client's own bytes with the text spliced in before their end. */
static char *continued_prompt(struct jv v, int chat, const char *text)
{
    char *q = json_quote(text); /* "..." */
    size_t ql = strlen(q), n = 0;
    const char *end = v.p + v.n - 1; /* the closing ']' or '"' */
    char *out = XPYD_XALLOC(malloc(v.n + ql + 64));
    memcpy(out, v.p, (size_t)(end - v.p));
    n = (size_t)(end - v.p);
    if (chat) {
        size_t k = n; /* is the array empty (only whitespace after '[')? */
        while (k > 1 && (out[k - 1] == ' ' || out[k - 1] == '\t' || out[k - 1] == '\n' || out[k - 1] == '\r'))
            k--;
        n += (size_t)sprintf(out + n, "%s{\"role\":\"assistant\",\"content\":%s}]", k > 1 ? "," : "", q);
    } else {
        memcpy(out + n, q + 1, ql - 1); /* the text's escaped bytes and the closing quote */
        n += ql - 1;
        out[n] = 0;
    }
    free(q);
    return out;
}

static int64_t whole_number(struct jv v, int64_t dflt)
{
    double d;
    if (jv_double(v, &d) != 0 || !(d >= -9e15 && d <= 9e15))
        return dflt;
    return (int64_t)d;
}

char *rw_continuation_body(const struct rw_src *client, int chat, const char *text, int64_t delivered, size_t *len)
{
    struct jv prompt = rw_src_get(client, chat ? "messages" : "prompt");
    if (jv_type(prompt) != (chat ? JV_ARRAY : JV_STRING)) /* token ids or a batch: the text cannot be appended */
        return NULL;
    char *vtxt = continued_prompt(prompt, chat, text);
    /* the limits shrink by what the client already has; absent ones stay absent (the engine's default) */
    char left_max[32], left_min[32];
    int64_t max = -1, min = -1;
    struct jv v = rw_src_get(client, "max_completion_tokens");
    if (jv_type(v) != JV_NUMBER)
        v = rw_src_get(client, "max_tokens");
    if (jv_type(v) == JV_NUMBER)
        max = whole_number(v, -1);
    else if (!chat)
        max = 16; /* vLLM's completions default */
    if (jv_type(v = rw_src_get(client, "min_tokens")) == JV_NUMBER)
        min = whole_number(v, -1);
    snprintf(left_max, sizeof left_max, "%" PRId64, max - delivered > 1 ? max - delivered : 1);
    snprintf(left_min, sizeof left_min, "%" PRId64, min - delivered > 0 ? min - delivered : 0);
    const struct rw_edit ed[] = {
        {chat ? "messages" : "prompt", vtxt, 0},
        {"max_completion_tokens", left_max, 1},
        {"max_tokens", left_max, chat}, /* completions: always (its default was counted); chat: if sent */
        {"min_tokens", left_min, 1},
        {"kv_transfer_params", NULL, 0},
        {"continue_final_message", chat ? "true" : NULL, 0},
        {"add_generation_prompt", chat ? "false" : NULL, 0},
    };
    char *out = emit(client, ed, sizeof ed / sizeof ed[0], len);
    free(vtxt);
    return out;
}
