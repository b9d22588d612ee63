/* SPDX-License-Identifier: Apache-2.0 */
/* rewrite.c - what the router reads from and patches in engines' JSON answers (see rewrite.h). */
#include "rewrite.h"

#include "json_view.h"
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

/* A count an engine reports: an integer in [0, hi] (range first: converting an out-of-range double to an
 * integer is undefined behaviour), else -1. */
static int64_t count_of(struct jv v, double hi)
{
    double d;
    if (jv_double(v, &d) != 0 || !(d >= 0 && d <= hi) || d != (double)(long long)d)
        return -1;
    return (int64_t)d;
}

int rw_absorb_prefill(const char *json, size_t len, struct rw_prefill_answer *out)
{
    memset(out, 0, sizeof *out);
    out->prompt_tokens = -1;
    out->cached_tokens = -1;
    /* read in place (json_view.h): the answer's size grows with the prompt (remote_block_ids), and a tree and its
     * reprinting cost a node and a printf per number */
    if (jv_check(json, len, NULL, NULL) != 0)
        return -1;
    struct jv o = jv_at(json, json + len);
    if (jv_type(o) != JV_OBJECT)
        return -1;
    /* one pass over the members (the last of a repeated key wins): the big one, remote_block_ids inside
     * kv_transfer_params, is skipped once */
    struct jv kv = {0}, usage = {0}, id = {0}, choices = {0}, k, v;
    struct jv_iter mi;
    jv_iter_init(&mi, o);
    while (jv_next(&mi, &k, &v)) {
        if (jv_str_eq(k, "kv_transfer_params", 18))
            kv = v;
        else if (jv_str_eq(k, "usage", 5))
            usage = v;
        else if (jv_str_eq(k, "id", 2))
            id = v;
        else if (jv_str_eq(k, "choices", 7))
            choices = v;
    }
    if (jv_type(kv) == JV_OBJECT) { /* its bytes as the engine wrote them: what the decode receives */
        out->kv_params = XPYD_XALLOC(malloc(kv.n + 1));
        memcpy(out->kv_params, kv.p, kv.n);
        out->kv_params[kv.n] = 0;
    }
    out->prompt_tokens = count_of(jv_get(usage, "prompt_tokens"), 1e12); /* exact, replaces the estimate */
    out->cached_tokens = (long)count_of(jv_get(jv_get(usage, "prompt_tokens_details"), "cached_tokens"), 1e12);
    out->id = jv_str_dup(id);
    struct jv_iter it;
    struct jv ch = {0};
    jv_iter_init(&it, choices);
    if (jv_type(choices) == JV_ARRAY)
        jv_next(&it, NULL, &ch);
    struct jv text = jv_get(ch, "text");
    if (jv_type(text) != JV_STRING)
        text = jv_get(jv_get(ch, "message"), "content");
    out->first_text = jv_str_dup(text);
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
