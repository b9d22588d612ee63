/* SPDX-License-Identifier: Apache-2.0 */
/* rewrite.c - what the router reads from and patches in engines' JSON answers (see rewrite.h). */
#include "rewrite.h"

#include "xpyd_util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int delete_all(cJSON *o, const char *k);

char *rw_print(const cJSON *o, size_t *len)
{
    char *s = XPYD_XALLOC(cJSON_PrintUnformatted(o));
    *len = strlen(s);
    return s;
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

/* range first: converting an out-of-range double to an integer is undefined behaviour */
static int is_int_value(const cJSON *v, double lo, double hi)
{
    return cJSON_IsNumber(v) && v->valuedouble >= lo && v->valuedouble <= hi &&
           v->valuedouble == (double)(long long)v->valuedouble;
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
