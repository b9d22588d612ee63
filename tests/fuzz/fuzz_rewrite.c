/* fuzz_rewrite.c - libFuzzer harness: the router's request JSON rewrite and what it reads from engine
 * answers (router/rewrite.c). The first byte picks chat/completions and the handoff; the rest is a body.
 * Beyond "no crash, no UB, no leak" it checks the rewrite's promises: every body it writes is a strict JSON
 * object, a body with nothing to change reaches the engine byte for byte, the prefill body asks for one
 * unstreamed token, the bootstrap body carries the room exactly, no duplicate key survives. */
#include "rewrite.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cJSON *reparse(char *s, size_t len)
{
    cJSON *o = cJSON_ParseWithLength(s, len);
    if (!cJSON_IsObject(o) || strlen(s) != len)
        abort(); /* the router wrote something that is not a JSON object */
    free(s);
    return o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int chat = data[0] & 1, kv = (data[0] >> 1) & 1;
    const char *json = (const char *)data + 1;
    size_t n = size - 1;

    /* as an engine's answer */
    struct rw_prefill_answer a;
    if (rw_absorb_prefill(json, n, &a) == 0) {
        if (a.prompt_tokens < -1 || a.cached_tokens < -1)
            abort();
    }

    cJSON *ev = cJSON_ParseWithLength(json, n);
    if (ev) {
        long cached = (long)(data[0] >> 2) - 1;
        rw_patch_usage(ev, cached);
        const cJSON *u = cJSON_GetObjectItemCaseSensitive(ev, "usage");
        if (cJSON_IsObject(u)) { /* one prompt_tokens_details at most, holding exactly the cached tokens given */
            int n = 0, m = 0;
            const cJSON *d = NULL;
            for (const cJSON *x = u->child; x; x = x->next)
                if (x->string && !strcmp(x->string, "prompt_tokens_details"))
                    n++, d = x;
            for (const cJSON *x = d ? d->child : NULL; x; x = x->next)
                if (x->string && !strcmp(x->string, "cached_tokens"))
                    m++;
            if (cached < 0 ? n != 0 : (n != 1 || !cJSON_IsObject(d) || m != 1 ||
                                       cJSON_GetObjectItemCaseSensitive(d, "cached_tokens")->valuedouble != (double)cached))
                abort();
        }
        (void)rw_event_text(ev);
        cJSON_Delete(ev);
    }
    cJSON *body = NULL;
    const char *why = NULL;
    size_t err_at = 0;
    struct rw_src *src = rw_src_parse(json, n, &body, &why, &err_at);
    if (!src && (!why || err_at > n))
        abort(); /* a refusal says why and where */
    if (src && rw_json_check(json, n, NULL) != 0)
        abort(); /* the body reader and the strict checker agree */
    for (const cJSON *x = body ? body->child : NULL; x; x = x->next)
        for (const cJSON *y = x->next; y; y = y->next)
            if (x->string && y->string && !strcmp(x->string, y->string))
                abort(); /* a duplicate survived */
    for (size_t i = 0; src && i < src->n; i++) { /* a member is a dup exactly when a later one has its key */
        int later = 0;
        for (size_t k = i + 1; k < src->n && !later; k++)
            later = !strcmp(src->m[i].key, src->m[k].key);
        if (later != src->m[i].dup || (later && !src->has_dup))
            abort();
    }
    int stream;
    int64_t max_tokens;
    if (body && !rw_validate(body, chat, &stream, &max_tokens)) {
        if (max_tokens < 1 || rw_estimate_prompt(body, chat, 4.0) < 0)
            abort();
        /* prefix blocks of whatever the client sent: bounded by its size, the same twice (deterministic) */
        uint64_t *b1, *b2;
        size_t n1 = rw_prefix_blocks(body, chat, 4, 1.0, &b1), n2 = rw_prefix_blocks(body, chat, 4, 1.0, &b2);
        if (n1 != n2 || (n1 && memcmp(b1, b2, n1 * sizeof *b1) != 0) || n1 > n + 16) /* 4-byte blocks */
            abort();
        free(b1);
        free(b2);
        size_t len;
        char *pb = rw_prefill_body(src, kv, &len);
        if (rw_json_check(pb, len, NULL) != 0)
            abort(); /* every body the router writes is strict JSON */
        cJSON *p = reparse(pb, len);
        const cJSON *mt = cJSON_GetObjectItemCaseSensitive(p, "max_tokens");
        if (!cJSON_IsNumber(mt) || mt->valuedouble != 1 || !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(p, "stream")) ||
            cJSON_GetObjectItemCaseSensitive(p, "stream_options"))
            abort();
        if (kv && !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(p, "kv_transfer_params"),
                                                                 "do_remote_decode")))
            abort();
        cJSON_Delete(p);
        char *db = rw_decode_body(src, NULL, 0, &len);
        if (!src->has_dup && (len != n || memcmp(db, json, n) != 0))
            abort(); /* nothing to change: the engine gets the client's bytes */
        cJSON_Delete(reparse(db, len));
        cJSON_Delete(reparse(rw_decode_body(src, a.kv_params, kv, &len), len));
        uint64_t room = 0x7fffffffffffffffULL - size;
        char *bs = rw_bootstrap_body(src, "h", 8998, room, "rid-1", &len);
        char want[48];
        snprintf(want, sizeof want, "\"bootstrap_room\":%" PRIu64, room);
        if (!strstr(bs, want))
            abort(); /* the room must be written exactly (a double would round it) */
        cJSON *b = reparse(bs, len);
        if (strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(b, "rid")), "rid-1") != 0)
            abort();
        cJSON_Delete(b);
        if (a.kv_params)
            cJSON_Delete(reparse(rw_kv_release_body(src, a.kv_params, &len), len));
    }
    rw_src_free(src);
    cJSON_Delete(body);
    rw_prefill_answer_free(&a);
    return 0;
}
