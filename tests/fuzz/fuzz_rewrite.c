/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_rewrite.c - libFuzzer harness: what the router reads of a client's body and the bodies it writes for the
 * engines (router/body_src.c, prompt.c: read in place, no tree), and what it reads from engine answers
 * (router/rewrite.c). The first byte picks chat/completions and the handoff; the rest is a body. Beyond "no
 * crash, no UB, no leak" it checks the promises: every body it writes is a strict JSON object, a body with
 * nothing to change reaches the engine byte for byte, the prefill body asks for one unstreamed token, the
 * bootstrap body carries the room exactly, no duplicate key survives, a continuation holds the prompt and the
 * text; and what the in-place reading finds (the checks, the token estimate, the model, whether a prompt is
 * token ids and its longest prompt, a text or token-id prompt's blocks) equals what a reference reading of an
 * independent parser's tree (cJSON, a repeated key reading as its last value, as Python's json) finds. */
#include "body_src.h"
#include "prompt.h"
#include "rewrite.h"
#include "xb_prefix.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A body the router wrote: strict JSON (its own checker), an object; read back by cJSON unless it holds a
 * surrogate escape (cJSON refuses lone ones, which the client's body may hold and the router keeps as sent):
 * then a dummy object stands in, so the field checks below only run where cJSON can judge. */
static int comparable_text(const char *s, size_t n)
{
    return !memmem(s, n, "\\u0000", 6) && !memmem(s, n, "\\ud", 3) && !memmem(s, n, "\\uD", 3);
}

static cJSON *reparse(char *s, size_t len)
{
    if (jv_check(s, len, NULL, NULL) != 0 || strlen(s) != len || *(s + strspn(s, " \t\r\n")) != '{')
        abort(); /* the router wrote something that is not a JSON object */
    cJSON *o = comparable_text(s, len) ? cJSON_ParseWithLength(s, len) : NULL;
    if (comparable_text(s, len) && !cJSON_IsObject(o))
        abort(); /* valid to its own checker, refused by an independent parser */
    free(s);
    return o;
}

/* ---- the reference reading, on cJSON's tree ---- */

static const cJSON *get(const cJSON *o, const char *k) /* the last member named k */
{
    const cJSON *last = NULL;
    for (const cJSON *x = cJSON_IsObject(o) ? o->child : NULL; x; x = x->next)
        if (x->string && !strcmp(x->string, k))
            last = x;
    return last;
}

static int ref_int(const cJSON *v, double lo, double hi)
{
    return cJSON_IsNumber(v) && v->valuedouble >= lo && v->valuedouble <= hi &&
           v->valuedouble == (double)(long long)v->valuedouble;
}

static int ref_validate(const cJSON *b, int chat, int *stream, int64_t *max)
{
    if (chat ? !cJSON_IsArray(get(b, "messages")) || !get(b, "messages")->child
             : !cJSON_IsString(get(b, "prompt")) && !cJSON_IsArray(get(b, "prompt")))
        return -1;
    const cJSON *st = get(b, "stream"), *so = get(b, "stream_options");
    if ((st && !cJSON_IsNull(st) && !cJSON_IsBool(st)) || (so && !cJSON_IsNull(so) && !cJSON_IsObject(so)))
        return -1;
    *stream = cJSON_IsTrue(st);
    *max = -1;
    const char *names[] = {"max_completion_tokens", "max_tokens"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = get(b, names[i]);
        if (!v || cJSON_IsNull(v))
            continue;
        if (!ref_int(v, 1, (double)RW_MAX_TOKENS_LIMIT))
            return -1;
        if (*max < 0)
            *max = (int64_t)v->valuedouble;
    }
    if (*max < 0)
        *max = 16;
    return 0;
}

static int64_t ref_text(const cJSON *s)
{
    return (int64_t)((double)strlen(s->valuestring) / 4.0) + 1;
}

static int64_t ref_estimate(const cJSON *b, int chat)
{
    int64_t n = 0;
    const cJSON *it, *part;
    if (!chat) {
        const cJSON *p = get(b, "prompt");
        if (cJSON_IsString(p))
            return ref_text(p);
        for (it = cJSON_IsArray(p) ? p->child : NULL; it; it = it->next)
            n += cJSON_IsNumber(it) ? 1 : cJSON_IsString(it) ? ref_text(it) : cJSON_IsArray(it) ? cJSON_GetArraySize(it) : 0;
        return n;
    }
    cJSON_ArrayForEach(it, get(b, "messages"))
    {
        n += 4;
        const cJSON *c = get(it, "content");
        if (cJSON_IsString(c))
            n += ref_text(c);
        for (part = cJSON_IsArray(c) ? c->child : NULL; part; part = part->next)
            if (cJSON_IsString(get(part, "text")))
                n += ref_text(get(part, "text"));
    }
    return n;
}

/* Such a prompt's longest prompt: its numbers, or a batch's longest array. */
static int64_t ref_longest(const cJSON *b)
{
    const cJSON *it;
    int64_t flat = 0, longest = 0;
    cJSON_ArrayForEach(it, get(b, "prompt"))
    {
        if (cJSON_IsArray(it))
            longest = cJSON_GetArraySize(it) > longest ? cJSON_GetArraySize(it) : longest;
        else
            flat++;
    }
    return flat > longest ? flat : longest;
}

/* A completions prompt of token ids: a non-empty array of numbers or arrays. */
static int ref_is_ids(const cJSON *b)
{
    const cJSON *p = get(b, "prompt"), *it;
    if (!cJSON_IsArray(p) || !p->child)
        return 0;
    cJSON_ArrayForEach(it, p)
    {
        if (!cJSON_IsNumber(it) && !cJSON_IsArray(it))
            return 0;
    }
    return 1;
}

/* A completions prompt's blocks (text or token ids), 4 tokens of 1 byte per block; -1: not such a prompt. */
static long ref_blocks(const cJSON *b, uint64_t *out, size_t cap)
{
    const cJSON *p = get(b, "prompt");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && !cJSON_IsNumber(p->child))
        p = p->child;
    if (cJSON_IsString(p))
        return (long)xb_hash_bytes(p->valuestring, strlen(p->valuestring), 4, out, cap);
    if (!cJSON_IsArray(p))
        return -1;
    size_t k = 0, n = (size_t)cJSON_GetArraySize(p);
    int64_t *ids = malloc((n ? n : 1) * sizeof *ids);
    const cJSON *it;
    cJSON_ArrayForEach(it, p)
    {
        if (!cJSON_IsNumber(it))
            break;
        double v = it->valuedouble;
        int64_t id;
        if (v >= -9.2e18 && v <= 9.2e18)
            id = (int64_t)v;
        else
            memcpy(&id, &v, sizeof id);
        ids[k++] = id;
    }
    long nb = (long)xb_hash_tokens(ids, k, 4, out, cap);
    free(ids);
    return nb;
}

/* 1 when no object in v repeats a key */
static int keys_unique(const cJSON *v)
{
    for (const cJSON *x = v ? v->child : NULL; x; x = x->next) {
        for (const cJSON *y = x->next; cJSON_IsObject(v) && y; y = y->next)
            if (x->string && y->string && !strcmp(x->string, y->string))
                return 0;
        if (!keys_unique(x))
            return 0;
    }
    return 1;
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
        /* against an independent reader (cJSON) where keys are not repeated: the same kv_transfer_params
         * object (the bytes kept as they came), the same prompt token count */
        const char *end = NULL;
        char *z = malloc(n + 1);
        memcpy(z, json, n);
        z[n] = 0;
        cJSON *ref = cJSON_ParseWithOpts(z, &end, 1);
        const cJSON *rkv = cJSON_GetObjectItemCaseSensitive(ref, "kv_transfer_params");
        /* cJSON ends a key at \u0000, Python does not; and a repeated key (at any depth: "usage" too) has no one
         * reading to compare with (cJSON takes the first, Python the last) */
        int unique = !memmem(json, n, "\\u0000", 6) && keys_unique(ref);
        if (ref && unique && cJSON_IsObject(rkv)) {
            cJSON *mine = a.kv_params ? cJSON_Parse(a.kv_params) : NULL;
            if (!mine || !cJSON_Compare(mine, rkv, 1))
                abort();
            cJSON_Delete(mine);
        }
        const cJSON *rpt = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(ref, "usage"),
                                                            "prompt_tokens");
        if (ref && unique && cJSON_IsNumber(rpt) && rpt->valuedouble >= 0 && rpt->valuedouble <= 1e12 &&
            rpt->valuedouble == (double)(long long)rpt->valuedouble && a.prompt_tokens != (int64_t)rpt->valuedouble)
            abort();
        cJSON_Delete(ref);
        free(z);
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
    const char *why = NULL;
    size_t err_at = 0;
    struct rw_src *src = rw_src_parse(json, n, 1024, &why, &err_at);
    if (!src && (!why || err_at > n))
        abort(); /* a refusal says why and where */
    if (src && jv_check(json, n, NULL, NULL) != 0)
        abort(); /* the body reader and the strict checker agree */
    for (size_t i = 0; src && i < src->n; i++) { /* a member is a dup exactly when a later one has its key */
        int later = 0;
        for (size_t k = i + 1; k < src->n && !later; k++)
            later = !strcmp(src->m[i].key, src->m[k].key);
        if (later != src->m[i].dup || (later && !src->has_dup))
            abort();
    }
    /* the reference: cJSON's tree of the same bytes (it refuses lone surrogates, which Python accepts; it ends
     * strings at a NUL, which the estimate then counts differently) */
    int comparable = src && comparable_text(json, n);
    cJSON *tree = comparable ? cJSON_ParseWithLength(json, n) : NULL;
    if (comparable && !tree)
        abort(); /* accepted here, refused by an independent parser */
    int stream;
    int64_t max_tokens;
    const char *bad = src ? rw_validate(src, chat, &stream, &max_tokens) : "";
    int rstream = 0;
    int64_t rmax = 0;
    if (tree && (ref_validate(tree, chat, &rstream, &rmax) == 0) != !bad)
        abort();
    if (tree && !bad && (rstream != stream || rmax != max_tokens))
        abort();
    if (src && !bad) {
        if (max_tokens < 1 || rw_estimate_prompt(src, chat, 4.0) < 0)
            abort();
        if (tree && rw_estimate_prompt(src, chat, 4.0) != ref_estimate(tree, chat))
            abort();
        int64_t longest;
        if (tree && !chat && rw_prompt_is_ids(src, &longest) != ref_is_ids(tree))
            abort();
        if (tree && !chat && ref_is_ids(tree) && longest != ref_longest(tree))
            abort();
        char *model = rw_string_member(src, "model");
        const cJSON *rm = tree ? get(tree, "model") : NULL;
        if (tree && (cJSON_IsString(rm) ? !model || strcmp(model, rm->valuestring) : model != NULL))
            abort();
        free(model);
        /* prefix blocks of whatever the client sent: bounded by its size, the same twice (deterministic), and
         * for a completions prompt the reference's */
        uint64_t *b1, *b2;
        size_t n1 = rw_prefix_blocks(src, chat, 4, 1.0, NULL, &b1), n2 = rw_prefix_blocks(src, chat, 4, 1.0, NULL, &b2);
        if (n1 != n2 || (n1 && memcmp(b1, b2, n1 * sizeof *b1) != 0) || n1 > n + 16) /* 4-byte blocks */
            abort();
        if (tree && !chat) {
            uint64_t *rb = malloc((n + 16) * sizeof *rb);
            long rn = ref_blocks(tree, rb, n + 16);
            if (rn >= 0 && ((size_t)rn != n1 || (n1 && memcmp(rb, b1, n1 * sizeof *rb) != 0)))
                abort();
            free(rb);
        }
        free(b1);
        free(b2);
        /* a continuation: the prompt and then the text */
        size_t clen;
        char *cb = rw_continuation_body(src, chat, "T\"x\n", 2, &clen);
        if (cb) {
            if (jv_check(cb, clen, NULL, NULL) != 0)
                abort();
            cJSON *c = reparse(cb, clen);
            if (tree && c && !chat) {
                const char *was = get(tree, "prompt")->valuestring, *now = cJSON_GetStringValue(get(c, "prompt"));
                if (!now || strncmp(now, was, strlen(was)) || strcmp(now + strlen(was), "T\"x\n"))
                    abort();
            }
            if (tree && c && chat) {
                const cJSON *m = get(c, "messages");
                const cJSON *lastm = cJSON_GetArrayItem(m, cJSON_GetArraySize(m) - 1);
                if (cJSON_GetArraySize(m) != cJSON_GetArraySize(get(tree, "messages")) + 1 ||
                    strcmp(cJSON_GetStringValue(get(lastm, "content")), "T\"x\n") ||
                    strcmp(cJSON_GetStringValue(get(lastm, "role")), "assistant") ||
                    !cJSON_IsTrue(get(c, "continue_final_message")))
                    abort();
            }
            cJSON_Delete(c);
        }
        size_t len;
        char *pb = rw_prefill_body(src, kv, &len);
        if (jv_check(pb, len, NULL, NULL) != 0)
            abort(); /* every body the router writes is strict JSON */
        cJSON *p = reparse(pb, len);
        const cJSON *mt = cJSON_GetObjectItemCaseSensitive(p, "max_tokens");
        if (p && (!cJSON_IsNumber(mt) || mt->valuedouble != 1 || !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(p, "stream")) ||
            cJSON_GetObjectItemCaseSensitive(p, "stream_options")))
            abort();
        if (p && kv && !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(p, "kv_transfer_params"),
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
        if (b && strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(b, "rid")), "rid-1") != 0)
            abort();
        cJSON_Delete(b);
        if (a.kv_params)
            cJSON_Delete(reparse(rw_kv_release_body(src, a.kv_params, &len), len));
    }
    rw_src_free(src);
    cJSON_Delete(tree);
    rw_prefill_answer_free(&a);
    return 0;
}
