/* rewrite.c - request and response JSON rewriting (see rewrite.h). */
#include "rewrite.h"
#include "xb_prefix.h"

#include "xpyd_util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* range first: converting an out-of-range double to an integer is undefined behaviour */
static int is_int_value(const cJSON *v, double lo, double hi)
{
    return cJSON_IsNumber(v) && v->valuedouble >= lo && v->valuedouble <= hi &&
           v->valuedouble == (double)(long long)v->valuedouble;
}

static int64_t estimate_text(const char *s, double bpt)
{
    return (int64_t)((double)strlen(s) / bpt) + 1;
}

int64_t rw_estimate_prompt(const cJSON *body, int chat, double bpt)
{
    int64_t n = 0;
    if (bpt <= 0)
        bpt = 4.0;
    if (!chat) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(body, "prompt");
        if (cJSON_IsString(p))
            return estimate_text(p->valuestring, bpt);
        const cJSON *it;
        cJSON_ArrayForEach(it, p)
        {
            if (cJSON_IsNumber(it))
                n++; /* token ids are counted exactly */
            else if (cJSON_IsString(it))
                n += estimate_text(it->valuestring, bpt);
            else if (cJSON_IsArray(it))
                n += cJSON_GetArraySize(it);
        }
        return n;
    }
    const cJSON *m;
    cJSON_ArrayForEach(m, cJSON_GetObjectItemCaseSensitive(body, "messages"))
    {
        n += 4; /* chat template overhead per message */
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (cJSON_IsString(c))
            n += estimate_text(c->valuestring, bpt);
        const cJSON *part;
        cJSON_ArrayForEach(part, c)
        {
            const cJSON *tx = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (cJSON_IsString(tx))
                n += estimate_text(tx->valuestring, bpt);
        }
    }
    return n;
}

/* A growing byte buffer for the chat serialization. */
struct bytes {
    char *p;
    size_t n, cap;
};

static void bytes_add(struct bytes *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        size_t nc = b->cap ? b->cap : 1024;
        while (nc < b->n + n)
            nc *= 2;
        b->p = XPYD_XALLOC(realloc(b->p, nc));
        b->cap = nc;
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void bytes_str(struct bytes *b, const cJSON *s)
{
    if (cJSON_IsString(s))
        bytes_add(b, s->valuestring, strlen(s->valuestring));
    bytes_add(b, "\x1f", 1); /* field separator: fields cannot run into each other */
}

static void bytes_json(struct bytes *b, const cJSON *v)
{
    char *j = v ? cJSON_PrintUnformatted(v) : NULL;
    if (j)
        bytes_add(b, j, strlen(j));
    free(j);
    bytes_add(b, "\x1f", 1);
}

static void chat_serialize(const cJSON *body, struct bytes *b)
{
    const cJSON *m;
    cJSON_ArrayForEach(m, cJSON_GetObjectItemCaseSensitive(body, "messages"))
    {
        bytes_add(b, "\x1e", 1); /* message separator */
        bytes_str(b, cJSON_GetObjectItemCaseSensitive(m, "role"));
        bytes_str(b, cJSON_GetObjectItemCaseSensitive(m, "name"));
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (cJSON_IsArray(c)) {
            const cJSON *part;
            cJSON_ArrayForEach(part, c)
            {
                const cJSON *tx = cJSON_GetObjectItemCaseSensitive(part, "text");
                if (cJSON_IsString(tx))
                    bytes_str(b, tx);
                else
                    bytes_json(b, part); /* an image or audio part: its whole description */
            }
        } else {
            bytes_str(b, c);
        }
        const cJSON *tc = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        bytes_json(b, tc);
        bytes_str(b, cJSON_GetObjectItemCaseSensitive(m, "tool_call_id"));
    }
}

size_t rw_prefix_blocks(const cJSON *body, int chat, size_t block_tokens, double bpt, uint64_t **out)
{
    *out = NULL;
    if (block_tokens == 0)
        return 0;
    size_t block_bytes = (size_t)((double)block_tokens * (bpt > 0 ? bpt : 4.0) + 0.5);
    if (block_bytes == 0)
        block_bytes = 1;
    if (chat) {
        struct bytes b = {0};
        chat_serialize(body, &b);
        size_t nb = 0;
        if (b.n >= block_bytes) {
            *out = XPYD_XALLOC(malloc(b.n / block_bytes * sizeof **out));
            nb = xb_hash_bytes(b.p, b.n, block_bytes, *out, b.n / block_bytes);
        }
        free(b.p);
        return nb;
    }
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(body, "prompt");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && !cJSON_IsNumber(p->child))
        p = p->child; /* ["text"] or [[ids]]: the one prompt */
    if (cJSON_IsString(p)) {
        size_t len = strlen(p->valuestring);
        if (len < block_bytes)
            return 0;
        *out = XPYD_XALLOC(malloc(len / block_bytes * sizeof **out));
        return xb_hash_bytes(p->valuestring, len, block_bytes, *out, len / block_bytes);
    }
    size_t n = cJSON_IsArray(p) ? (size_t)cJSON_GetArraySize(p) : 0;
    if (n < block_tokens)
        return 0;
    int64_t *ids = XPYD_XALLOC(malloc(n * sizeof *ids));
    size_t k = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, p)
    {
        if (!cJSON_IsNumber(it))
            break;
        double v = it->valuedouble;
        int64_t id;
        if (v >= -9.2e18 && v <= 9.2e18) /* a token id; beyond int64 (or NaN) the conversion is undefined, */
            id = (int64_t)v;               /* so such a value (which every engine refuses) is hashed by its bits */
        else
            memcpy(&id, &v, sizeof id);
        ids[k++] = id;
    }
    size_t nb = 0;
    if (k >= block_tokens) {
        *out = XPYD_XALLOC(malloc(k / block_tokens * sizeof **out));
        nb = xb_hash_tokens(ids, k, block_tokens, *out, k / block_tokens);
    }
    free(ids);
    return nb;
}

const char *rw_validate(const cJSON *body, int chat, int *stream, int64_t *max_tokens)
{
    if (!cJSON_IsObject(body))
        return "request body must be a JSON object";
    if (chat) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(body, "messages");
        if (!cJSON_IsArray(m) || cJSON_GetArraySize(m) == 0)
            return "'messages' is required and must be a non-empty array";
    } else {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(body, "prompt");
        if (!cJSON_IsString(p) && !cJSON_IsArray(p))
            return "'prompt' is required and must be a string or an array";
    }
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(body, "stream");
    if (s && !cJSON_IsNull(s) && !cJSON_IsBool(s))
        return "'stream' must be a boolean";
    *stream = cJSON_IsTrue(s);
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(body, "stream_options");
    if (so && !cJSON_IsNull(so) && !cJSON_IsObject(so))
        return "'stream_options' must be an object";
    const char *names[] = {"max_completion_tokens", "max_tokens"};
    *max_tokens = -1;
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, names[i]);
        if (!v || cJSON_IsNull(v))
            continue;
        if (!is_int_value(v, 1, 1e12))
            return i ? "'max_tokens' must be a positive integer" : "'max_completion_tokens' must be a positive integer";
        if (*max_tokens < 0)
            *max_tokens = (int64_t)v->valuedouble;
    }
    if (*max_tokens < 0)
        *max_tokens = 16; /* unknown: the engine decides; 16 is the cost estimate (vLLM's completions default) */
    return NULL;
}

char *rw_print(const cJSON *o, size_t *len)
{
    char *s = XPYD_XALLOC(cJSON_PrintUnformatted(o));
    *len = strlen(s);
    return s;
}




struct keyref {
    cJSON *item;
    size_t pos;
};

static int keyref_cmp(const void *a, const void *b)
{
    const struct keyref *x = a, *y = b;
    int c = strcmp(x->item->string ? x->item->string : "", y->item->string ? y->item->string : "");
    return c ? c : (x->pos > y->pos) - (x->pos < y->pos);
}

/* Sorted by key then position, so a hostile body with many keys costs n log n, not n^2. */
void rw_dedupe_keys(cJSON *o)
{
    if (!cJSON_IsObject(o))
        return;
    size_t n = 0;
    for (cJSON *it = o->child; it; it = it->next)
        n++;
    if (n < 2)
        return;
    struct keyref *refs = XPYD_XALLOC(malloc(n * sizeof *refs));
    size_t i = 0;
    for (cJSON *it = o->child; it; it = it->next, i++)
        refs[i] = (struct keyref){it, i};
    qsort(refs, n, sizeof *refs, keyref_cmp);
    for (i = 0; i + 1 < n; i++) /* every one but the last of a run of equal keys goes */
        if (refs[i].item->string && refs[i + 1].item->string && !strcmp(refs[i].item->string, refs[i + 1].item->string))
            cJSON_Delete(cJSON_DetachItemViaPointer(o, refs[i].item)); /* the last one wins, as in Python's json */
    free(refs);
}

/* ---- strict JSON validation and top-level member spans ---- */

#define RW_MAX_DEPTH 512

struct jscan {
    const char *p, *s, *e;
    const char *err;
};

static void ws(struct jscan *j)
{
    while (j->p < j->e && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static int jfail(struct jscan *j, const char *why)
{
    if (!j->err)
        j->err = why;
    return -1;
}

/* One UTF-8 sequence starting at j->p (a byte >= 0x80): well-formed (surrogates allowed, as Python's
 * json.loads on bytes accepts them). */
static int utf8_seq(struct jscan *j)
{
    const unsigned char *u = (const unsigned char *)j->p;
    size_t left = (size_t)(j->e - j->p);
    int n;
    uint32_t cp;
    if (u[0] >= 0xc2 && u[0] <= 0xdf)
        n = 2, cp = u[0] & 0x1f;
    else if (u[0] >= 0xe0 && u[0] <= 0xef)
        n = 3, cp = u[0] & 0x0f;
    else if (u[0] >= 0xf0 && u[0] <= 0xf4)
        n = 4, cp = u[0] & 0x07;
    else
        return jfail(j, "invalid UTF-8 in a string");
    if (left < (size_t)n)
        return jfail(j, "invalid UTF-8 in a string");
    for (int i = 1; i < n; i++) {
        if ((u[i] & 0xc0) != 0x80)
            return jfail(j, "invalid UTF-8 in a string");
        cp = cp << 6 | (u[i] & 0x3f);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)))
        return jfail(j, "invalid UTF-8 in a string");
    j->p += n;
    return 0;
}

static int jstring(struct jscan *j, int *has_nul)
{
    j->p++; /* the opening quote */
    while (j->p < j->e) {
        unsigned char c = (unsigned char)*j->p;
        if (c == '"') {
            j->p++;
            return 0;
        }
        if (c < 0x20)
            return jfail(j, "control character in a string");
        if (c == '\\') {
            if (j->e - j->p < 2)
                break;
            char x = j->p[1];
            if (x == 'u') {
                if (j->e - j->p < 6)
                    break;
                for (int i = 2; i < 6; i++)
                    if (!strchr("0123456789abcdefABCDEF", j->p[i]) || !j->p[i])
                        return jfail(j, "invalid \\u escape");
                if (has_nul && !memcmp(j->p + 2, "0000", 4))
                    *has_nul = 1;
                j->p += 6;
            } else if (x && strchr("\"\\/bfnrt", x)) {
                j->p += 2;
            } else {
                return jfail(j, "invalid escape in a string");
            }
        } else if (c >= 0x80) {
            if (utf8_seq(j))
                return -1;
        } else {
            j->p++;
        }
    }
    return jfail(j, "unterminated string");
}

static int digits(struct jscan *j)
{
    const char *a = j->p;
    while (j->p < j->e && *j->p >= '0' && *j->p <= '9')
        j->p++;
    return j->p > a ? 0 : jfail(j, "invalid number");
}

static int jnumber(struct jscan *j)
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

static int jvalue(struct jscan *j, int depth);

static int jcontainer(struct jscan *j, int depth)
{
    char close = *j->p == '{' ? '}' : ']';
    int obj = close == '}';
    if (depth >= RW_MAX_DEPTH)
        return jfail(j, "JSON nested too deeply");
    j->p++;
    ws(j);
    if (j->p < j->e && *j->p == close) {
        j->p++;
        return 0;
    }
    for (;;) {
        ws(j);
        if (obj) {
            if (j->p >= j->e || *j->p != '"')
                return jfail(j, "expected a string key");
            if (jstring(j, NULL))
                return -1;
            ws(j);
            if (j->p >= j->e || *j->p != ':')
                return jfail(j, "expected ':'");
            j->p++;
        }
        if (jvalue(j, depth + 1))
            return -1;
        ws(j);
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

static int jvalue(struct jscan *j, int depth)
{
    ws(j);
    if (j->p >= j->e)
        return jfail(j, "unexpected end of JSON");
    char c = *j->p;
    if (c == '{' || c == '[')
        return jcontainer(j, depth);
    if (c == '"')
        return jstring(j, NULL);
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

int rw_json_check(const char *data, size_t len, size_t *err_at)
{
    struct jscan j = {data, data, data + len, NULL};
    int rc = jvalue(&j, 0);
    if (rc == 0) {
        ws(&j);
        if (j.p != j.e)
            rc = -1;
    }
    if (rc && err_at)
        *err_at = (size_t)(j.p - data);
    return rc;
}

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

struct rw_src *rw_src_parse(const char *data, size_t len, cJSON **tree, const char **err, size_t *err_at)
{
    *tree = NULL;
    struct jscan j = {data, data, data + len, NULL};
    size_t cap = 0, n = 0;
    struct rw_member *m = NULL;
    ws(&j);
    if (j.p >= j.e || *j.p != '{') {
        *err = "request body must be a JSON object";
        *err_at = (size_t)(j.p - data);
        return NULL;
    }
    j.p++;
    ws(&j);
    int ok = 1;
    if (j.p < j.e && *j.p == '}') {
        j.p++;
    } else {
        for (;;) {
            ws(&j);
            if (j.p >= j.e || *j.p != '"') {
                ok = !jfail(&j, "expected a string key");
                break;
            }
            size_t start = (size_t)(j.p - data);
            int nul = 0;
            if (jstring(&j, &nul)) {
                ok = 0;
                break;
            }
            if (nul) {
                ok = !jfail(&j, "NUL in an object key");
                break;
            }
            ws(&j);
            if (j.p >= j.e || *j.p != ':') {
                ok = !jfail(&j, "expected ':'");
                break;
            }
            j.p++;
            if (jvalue(&j, 1)) {
                ok = 0;
                break;
            }
            if (n == cap) {
                cap = cap ? cap * 2 : 16;
                m = XPYD_XALLOC(realloc(m, cap * sizeof *m));
            }
            m[n++] = (struct rw_member){NULL, start, (size_t)(j.p - data), 0};
            ws(&j);
            if (j.p < j.e && *j.p == ',') {
                j.p++;
                continue;
            }
            if (j.p < j.e && *j.p == '}') {
                j.p++;
                break;
            }
            ok = !jfail(&j, "expected ',' or '}'");
            break;
        }
    }
    if (ok) {
        ws(&j);
        if (j.p != j.e)
            ok = !jfail(&j, "unexpected data after the JSON object");
    }
    cJSON *t = ok ? cJSON_ParseWithLength(data, len) : NULL;
    size_t kids = 0;
    for (const cJSON *c = t ? t->child : NULL; c; c = c->next)
        kids++;
    if (!ok || !cJSON_IsObject(t) || kids != n) {
        *err = j.err ? j.err : "malformed JSON";
        *err_at = (size_t)(j.p - data);
        cJSON_Delete(t);
        free(m);
        return NULL;
    }
    struct rw_src *s = XPYD_XALLOC(calloc(1, sizeof *s));
    s->text = XPYD_XALLOC(malloc(len + 1));
    memcpy(s->text, data, len);
    s->text[len] = 0;
    s->len = len;
    s->m = m;
    s->n = n;
    size_t i = 0;
    for (const cJSON *c = t->child; c; c = c->next, i++)
        m[i].key = XPYD_XALLOC(strdup(c->string ? c->string : ""));
    if (n > 1 && n <= 16) { /* the usual body: pairs compared, no sort (every member but a key's last is a dup) */
        for (i = 0; i + 1 < n; i++)
            for (size_t k = i + 1; k < n && !m[i].dup; k++)
                if (!strcmp(m[i].key, m[k].key))
                    m[i].dup = s->has_dup = 1;
    } else if (n > 1) { /* sorted by key then position: a hostile body with many keys costs n log n */
        struct rw_member **order = XPYD_XALLOC(malloc(n * sizeof *order));
        for (i = 0; i < n; i++)
            order[i] = &m[i];
        qsort(order, n, sizeof *order, member_cmp);
        for (i = 0; i + 1 < n; i++)
            if (!strcmp(order[i]->key, order[i + 1]->key))
                order[i]->dup = s->has_dup = 1;
        free(order);
    }
    if (s->has_dup) /* the tree's members are these: without a repeated key there is nothing to drop */
        rw_dedupe_keys(t);
    *tree = t;
    return s;
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

char *rw_bootstrap_body(const struct rw_src *client, const char *host, int port, uint64_t room, const char *rid,
                        size_t *len)
{
    char roomtxt[32], porttxt[16];
    snprintf(roomtxt, sizeof roomtxt, "%" PRIu64, room); /* exact 63-bit integer */
    snprintf(porttxt, sizeof porttxt, "%d", port);
    cJSON *h = XPYD_XALLOC(cJSON_CreateString(host)), *r = XPYD_XALLOC(cJSON_CreateString(rid));
    char *hs = XPYD_XALLOC(cJSON_PrintUnformatted(h)), *rs = XPYD_XALLOC(cJSON_PrintUnformatted(r));
    const struct rw_edit ed[] = {
        {"bootstrap_host", hs, 0}, {"bootstrap_port", porttxt, 0}, {"bootstrap_room", roomtxt, 0}, {"rid", rs, 0}};
    char *out = emit(client, ed, 4, len);
    cJSON_Delete(h);
    cJSON_Delete(r);
    free(hs);
    free(rs);
    return out;
}

static int delete_all(cJSON *o, const char *k);

char *rw_continuation_body(const struct rw_src *client, const cJSON *body, int chat, const char *text,
                           int64_t delivered, size_t *len)
{
    cJSON *value = NULL;
    if (chat) {
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(body, "messages");
        if (!cJSON_IsArray(msgs))
            return NULL;
        value = XPYD_XALLOC(cJSON_Duplicate(msgs, 1));
        cJSON *m = XPYD_XALLOC(cJSON_CreateObject());
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddStringToObject(m, "content", text);
        cJSON_AddItemToArray(value, m);
    } else {
        const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(body, "prompt");
        if (!cJSON_IsString(prompt)) /* token ids or a batch: the text cannot be appended */
            return NULL;
        size_t a = strlen(prompt->valuestring), b = strlen(text);
        char *joined = XPYD_XALLOC(malloc(a + b + 1));
        memcpy(joined, prompt->valuestring, a);
        memcpy(joined + a, text, b + 1);
        value = XPYD_XALLOC(cJSON_CreateString(joined));
        free(joined);
    }
    char *vtxt = XPYD_XALLOC(cJSON_PrintUnformatted(value));
    cJSON_Delete(value);
    /* the limits shrink by what the client already has; absent ones stay absent (the engine's default) */
    char left_max[32], left_min[32];
    int64_t max = -1, min = -1;
    const cJSON *v;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(body, "max_completion_tokens")) ||
        cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(body, "max_tokens")))
        max = (int64_t)v->valuedouble;
    else if (!chat)
        max = 16; /* vLLM's completions default */
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(body, "min_tokens")))
        min = (int64_t)v->valuedouble;
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

int rw_patch_usage_continuation(cJSON *o, long delivered)
{
    cJSON *usage = cJSON_GetObjectItemCaseSensitive(o, "usage");
    if (!cJSON_IsObject(usage))
        return 0;
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens");
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(usage, "completion_tokens");
    double pd = cJSON_IsNumber(pt) ? pt->valuedouble : 0, cd = cJSON_IsNumber(ct) ? ct->valuedouble : 0;
    if (!(pd >= 0 && pd <= 9e15) || !(cd >= 0 && cd <= 9e15))
        return 0; /* not counts any engine reports (negative, huge, NaN): left as they came */
    long prompt = (long)pd, completion = (long)cd;
    long moved = delivered < prompt ? delivered : prompt; /* the continuation's prompt held what was delivered */
    delete_all(usage, "prompt_tokens");
    delete_all(usage, "completion_tokens");
    delete_all(usage, "total_tokens");
    cJSON_AddNumberToObject(usage, "prompt_tokens", (double)(prompt - moved));
    cJSON_AddNumberToObject(usage, "completion_tokens", (double)(completion + moved));
    cJSON_AddNumberToObject(usage, "total_tokens", (double)(prompt + completion));
    return 1;
}

char *rw_kv_release_body(const struct rw_src *client, const char *kv_params, size_t *len)
{
    const struct rw_edit ed[] = {
        {"kv_transfer_params", kv_params, 0}, {"stream_options", NULL, 0}, {"stream", "false", 0},
        {"max_tokens", "1", 0},               {"max_completion_tokens", "1", 1},
    };
    return emit(client, ed, 5, len);
}

int rw_absorb_prefill(const char *json, size_t len, struct rw_prefill_answer *out)
{
    memset(out, 0, sizeof *out);
    out->prompt_tokens = -1;
    out->cached_tokens = -1;
    cJSON *j = cJSON_ParseWithLength(json, len);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return -1;
    }
    const cJSON *kv = cJSON_GetObjectItemCaseSensitive(j, "kv_transfer_params");
    if (cJSON_IsObject(kv))
        out->kv_params = XPYD_XALLOC(cJSON_PrintUnformatted(kv));
    const cJSON *usage = cJSON_GetObjectItemCaseSensitive(j, "usage");
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens");
    if (is_int_value(pt, 0, 1e12))
        out->prompt_tokens = (int64_t)pt->valuedouble; /* exact, replaces the estimate */
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens_details"),
                                                       "cached_tokens");
    if (is_int_value(ct, 0, 1e12))
        out->cached_tokens = (long)ct->valuedouble;
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "id");
    if (cJSON_IsString(id))
        out->id = XPYD_XALLOC(strdup(id->valuestring));
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(ch, "text");
    if (!cJSON_IsString(text))
        text = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(ch, "message"), "content");
    if (cJSON_IsString(text))
        out->first_text = XPYD_XALLOC(strdup(text->valuestring));
    cJSON_Delete(j);
    return 0;
}

void rw_prefill_answer_free(struct rw_prefill_answer *a)
{
    free(a->kv_params);
    free(a->id);
    free(a->first_text);
    memset(a, 0, sizeof *a);
}

/* Removes every member named k: an engine's JSON may repeat a key, and the client must not see a stale copy
 * next to the patched one. Returns how many went. */
static int delete_all(cJSON *o, const char *k)
{
    int n = 0;
    while (cJSON_GetObjectItemCaseSensitive(o, k)) {
        cJSON_DeleteItemFromObjectCaseSensitive(o, k);
        n++;
    }
    return n;
}

int rw_patch_usage(cJSON *o, long cached_tokens)
{
    cJSON *usage = cJSON_GetObjectItemCaseSensitive(o, "usage");
    if (!cJSON_IsObject(usage))
        return 0;
    if (cached_tokens < 0) {
        /* The decode counts the transferred KV as cached, which is wrong, and the prefill did not say: the
         * truth is unknown, so the field goes rather than a wrong number. */
        return delete_all(usage, "prompt_tokens_details") > 0;
    }
    cJSON *d = cJSON_DetachItemFromObjectCaseSensitive(usage, "prompt_tokens_details");
    delete_all(usage, "prompt_tokens_details");
    if (!cJSON_IsObject(d)) {
        cJSON_Delete(d);
        d = cJSON_CreateObject();
    }
    cJSON_AddItemToObject(usage, "prompt_tokens_details", d);
    delete_all(d, "cached_tokens");
    cJSON_AddNumberToObject(d, "cached_tokens", (double)cached_tokens);
    return 1;
}

const char *rw_event_text(const cJSON *o)
{
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(ch, "text");
    if (!cJSON_IsString(t))
        t = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(ch, "delta"), "content");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}
