/* rewrite.c - request and response JSON rewriting (see rewrite.h). */
#include "rewrite.h"

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

static char *print_free(cJSON *b, size_t *len)
{
    char *s = rw_print(b, len);
    cJSON_Delete(b);
    return s;
}

/* Every occurrence: a body with a duplicate key must not keep a second one the engine would read. */
static void del_all(cJSON *b, const char *k)
{
    while (cJSON_GetObjectItemCaseSensitive(b, k))
        cJSON_DeleteItemFromObjectCaseSensitive(b, k);
}

static void set_item(cJSON *b, const char *k, cJSON *v)
{
    del_all(b, k);
    cJSON_AddItemToObject(b, k, XPYD_XALLOC(v));
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

char *rw_prefill_body(const cJSON *client, int kv_params, size_t *len)
{
    cJSON *b = XPYD_XALLOC(cJSON_Duplicate(client, 1));
    del_all(b, "stream_options");
    del_all(b, "min_tokens");
    del_all(b, "min_completion_tokens");
    set_item(b, "stream", cJSON_CreateFalse());
    set_item(b, "max_tokens", cJSON_CreateNumber(1));
    if (cJSON_GetObjectItemCaseSensitive(b, "max_completion_tokens"))
        set_item(b, "max_completion_tokens", cJSON_CreateNumber(1));
    if (kv_params) {
        cJSON *kv = XPYD_XALLOC(cJSON_CreateObject());
        cJSON_AddTrueToObject(kv, "do_remote_decode");
        cJSON_AddFalseToObject(kv, "do_remote_prefill");
        cJSON_AddNullToObject(kv, "remote_engine_id");
        cJSON_AddNullToObject(kv, "remote_block_ids");
        cJSON_AddNullToObject(kv, "remote_host");
        cJSON_AddNullToObject(kv, "remote_port");
        set_item(b, "kv_transfer_params", kv);
    }
    return print_free(b, len);
}

char *rw_decode_body(const cJSON *client, const cJSON *kv_params, int kv_mode, size_t *len)
{
    if (!kv_mode)
        return rw_print(client, len);
    cJSON *b = XPYD_XALLOC(cJSON_Duplicate(client, 1));
    del_all(b, "kv_transfer_params");
    if (kv_params)
        cJSON_AddItemToObject(b, "kv_transfer_params", XPYD_XALLOC(cJSON_Duplicate(kv_params, 1)));
    return print_free(b, len);
}

char *rw_bootstrap_body(const cJSON *client, const char *host, int port, uint64_t room, const char *rid, size_t *len)
{
    char roomtxt[32];
    snprintf(roomtxt, sizeof roomtxt, "%" PRIu64, room);
    cJSON *b = XPYD_XALLOC(cJSON_Duplicate(client, 1));
    set_item(b, "bootstrap_host", cJSON_CreateString(host));
    set_item(b, "bootstrap_port", cJSON_CreateNumber(port));
    set_item(b, "bootstrap_room", cJSON_CreateRaw(roomtxt)); /* exact 63-bit integer */
    set_item(b, "rid", cJSON_CreateString(rid));
    return print_free(b, len);
}

char *rw_kv_release_body(const cJSON *client, const cJSON *kv_params, size_t *len)
{
    cJSON *b = XPYD_XALLOC(cJSON_Duplicate(client, 1));
    set_item(b, "kv_transfer_params", cJSON_Duplicate(kv_params, 1));
    del_all(b, "stream_options");
    set_item(b, "stream", cJSON_CreateFalse());
    set_item(b, "max_tokens", cJSON_CreateNumber(1));
    if (cJSON_GetObjectItemCaseSensitive(b, "max_completion_tokens"))
        set_item(b, "max_completion_tokens", cJSON_CreateNumber(1));
    return print_free(b, len);
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
        out->kv_params = XPYD_XALLOC(cJSON_Duplicate(kv, 1));
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
    cJSON_Delete(a->kv_params);
    free(a->id);
    free(a->first_text);
    memset(a, 0, sizeof *a);
}

int rw_patch_usage(cJSON *o, long cached_tokens)
{
    cJSON *usage = cJSON_GetObjectItemCaseSensitive(o, "usage");
    if (!cJSON_IsObject(usage))
        return 0;
    if (cached_tokens < 0) {
        /* The decode counts the transferred KV as cached, which is wrong, and the prefill did not say: the
         * truth is unknown, so the field goes rather than a wrong number. */
        if (!cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens_details"))
            return 0;
        cJSON_DeleteItemFromObjectCaseSensitive(usage, "prompt_tokens_details");
        return 1;
    }
    cJSON *d = cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens_details");
    if (!cJSON_IsObject(d)) {
        cJSON_DeleteItemFromObjectCaseSensitive(usage, "prompt_tokens_details");
        d = cJSON_AddObjectToObject(usage, "prompt_tokens_details");
    }
    cJSON_DeleteItemFromObjectCaseSensitive(d, "cached_tokens");
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
