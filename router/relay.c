/* SPDX-License-Identifier: Apache-2.0 */
/* relay.c - the decision for each decode SSE event (see relay.h). Events that need no change are forwarded
 * byte for byte (the fast path parses nothing); JSON is parsed only when usage must be patched or the
 * first-token-from-prefill splice is on. */
#include "relay.h"

#include "rewrite.h"
#include "xpyd_util.h"

#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* After a "usage" key: a usage object (: { with any JSON whitespace around the colon)? "usage":null does not
 * count, so the usual events stay on the fast path. Whitespace is what cJSON, which parses the event, skips. */
static int usage_object_follows(const char *q)
{
    while (*q && (unsigned char)*q <= ' ') /* whitespace as cJSON skips it (any control byte) */
        q++;
    if (*q++ != ':')
        return 0;
    while (*q && (unsigned char)*q <= ' ')
        q++;
    return *q == '{';
}

static int at(const char *p, const char *end, const char *key, size_t n)
{
    return (size_t)(end - p) >= n && memcmp(p, key, n) == 0;
}

/* What the quote at p starts, when it starts a key the relay looks for. */
static void key_at(const char *p, const char *end, struct relay_keys *k)
{
    switch (p[1]) { /* data is NUL-terminated: p[1] is readable */
    case 'c':
        if (at(p, end, "\"choices\"", 9)) {
            if (!k->choices)
                k->choices = p;
            if (at(p + 9, end, ":[]", 3) || at(p + 9, end, ": []", 4))
                k->empty_choices = 1;
        }
        break;
    case 'u':
        if (at(p, end, "\"usage\"", 7) && usage_object_follows(p + 7))
            k->usage_object = 1;
        break;
    case 'r':
        if (at(p, end, "\"role\"", 6))
            k->role = 1;
        else if (at(p, end, "\"recomputed\"", 12))
            k->recomputed = 1;
        break;
    case 't':
        if (at(p, end, "\"text\"", 6))
            k->text = 1;
        break;
    default:
        break;
    }
}

/* The relay's substring checks in one pass: every key it looks for begins with a quote, so looking at each
 * quote, in order, finds every occurrence a substring search would (six strstr scans of the event were the
 * relay's largest cost). The quotes are found sixteen bytes at a time where SSE2 is there (every x86-64):
 * a memchr per quote, an event having forty of them, cost more than the rest of the relay's decision. */
void relay_scan(const char *data, size_t len, struct relay_keys *k)
{
    memset(k, 0, sizeof *k);
    const char *p = data, *end = data + len;
#ifdef __SSE2__
    const __m128i quote = _mm_set1_epi8('"');
    for (; end - p >= 16; p += 16) {
        __m128i block = _mm_loadu_si128((const __m128i *)(const void *)p);
        unsigned m = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(block, quote));
        for (; m; m &= m - 1)
            key_at(p + __builtin_ctz(m), end, k);
    }
#endif
    for (; p < end; p++)
        if (*p == '"')
            key_at(p, end, k);
}

/* Decode migration keeps the text the client received. Parsing every event for it (cJSON: a tree of a dozen
 * nodes, allocations, number printing) was the relay's largest cost with migration on (the default), so the
 * usual event is read by a scan instead, when it has exactly the compact shape vLLM and xpyd_sim print:
 * a top-level "choices" (no '{' or '}' before it but the event's own '{') opening with {"index":0,"text":"..." or
 * {"index":0,"delta":{"content":"..." (and then no "text" key anywhere, which would win). Returns 1 with the
 * text in out (none for null or ""): a span of data when it has no escape (the usual token: nothing is
 * allocated), else unescaped into out->text_buf; or 0 when the event is anything else (other spacing, another
 * order, a \u escape): the caller parses it. A key inside a string cannot match: its quotes are escaped there.
 * tests/fuzz/fuzz_relay.c checks the scan against the parse. */
static int quick_text(const char *data, const struct relay_keys *k, struct relay_out *out)
{
    static const char comp[] = "\"choices\":[{\"index\":0,\"text\":", chat[] = "\"choices\":[{\"index\":0,\"delta\":{\"content\":";
    const char *ch = k->choices;
    if (!ch || data[0] != '{' || memchr(data + 1, '{', (size_t)(ch - data - 1)) ||
        memchr(data + 1, '}', (size_t)(ch - data - 1)))
        return 0; /* a '{' or '}' before it: "choices" may be nested, or after the event's end */
    const char *v;
    if (strncmp(ch, comp, sizeof comp - 1) == 0)
        v = ch + sizeof comp - 1;
    else if (strncmp(ch, chat, sizeof chat - 1) == 0 && !k->text)
        v = ch + sizeof chat - 1;
    else
        return 0;
    if (strncmp(v, "null", 4) == 0)
        return 1;
    if (*v++ != '"')
        return 0;
    const char *end = v;
    int escaped = 0;
    while (*end && *end != '"') {
        escaped |= *end == '\\';
        end += *end == '\\' && end[1] ? 2 : 1;
    }
    if (*end != '"')
        return 0;
    if (!escaped) {
        if (end > v) {
            out->text = v;
            out->text_len = (size_t)(end - v);
        }
        return 1;
    }
    char *o = malloc((size_t)(end - v) + 1), *w = o;
    if (!o)
        return 0;
    for (const char *p = v; p < end; p++) {
        if (*p != '\\') {
            *w++ = *p;
            continue;
        }
        switch (*++p) {
        case '"': case '\\': case '/': *w++ = *p; break;
        case 'n': *w++ = '\n'; break;
        case 't': *w++ = '\t'; break;
        case 'r': *w++ = '\r'; break;
        case 'b': *w++ = '\b'; break;
        case 'f': *w++ = '\f'; break;
        default: free(o); return 0; /* \uXXXX and anything else: the parser decides */
        }
    }
    out->text = out->text_buf = o; /* not empty: an escape writes a byte */
    out->text_len = (size_t)(w - o);
    return 1;
}

/* The event's id when it is the event's first key, as engines print it ({"id":"cmpl-..." with no escape):
 * a copy, or NULL (the caller parses). The first "id" key is the one a parse finds. */
static char *quick_id(const char *data)
{
    static const char key[] = "{\"id\":\"";
    if (strncmp(data, key, sizeof key - 1) != 0)
        return NULL;
    const char *v = data + sizeof key - 1, *end = v;
    while (*end && *end != '"' && *end != '\\')
        end++;
    return *end == '"' ? strndup(v, (size_t)(end - v)) : NULL;
}

void relay_event(struct relay_state *st, const char *data, size_t len, struct relay_out *out)
{
    memset(out, 0, sizeof *out);
    if (st->preempted) { /* the rest of a preempted leg (its usage, its [DONE]) is not the client's */
        out->action = RELAY_DROP;
        return;
    }
    if (strcmp(data, "[DONE]") == 0) {
        st->done_seen = 1;
        out->done = 1;
        return;
    }
    if (memchr(data, 0, len)) /* a raw NUL: not JSON (and the string checks below would stop at it) */
        return;
    struct relay_keys k;
    relay_scan(data, len, &k);
    int content = !k.empty_choices;
    int has_usage = k.usage_object;
    int maybe_preempt = k.recomputed;
    /* usage is patched after a prefill (its cached tokens) and in a continuation (counted as one engine) */
    int patch = has_usage && (st->prefill_answered || st->continuation);
    if (!st->prefill_mode && !patch && !st->track_text && !st->continuation && !maybe_preempt) {
        out->content = out->token_out = content; /* fast path: the bytes as they came */
        return;
    }
    char *qid = NULL;
    if (!st->prefill_mode && !patch && !st->continuation && !maybe_preempt && !k.role &&
        (st->resp_id || (qid = quick_id(data)) != NULL) && (!content || quick_text(data, &k, out))) {
        /* migration on, an ordinary event (or one without choices, e.g. the usage event): forwarded as it
         * came, its text kept, and the first id */
        out->id = qid;
        out->content = content;
        out->token_out = out->text != NULL;
        return;
    }
    free(qid);
    cJSON *o = cJSON_ParseWithLength(data, len);
    if (!o) /* not JSON: passed on untouched */
        return;
    if (maybe_preempt) {
        const cJSON *sr = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0), "stop_reason");
        if (cJSON_IsString(sr) && strcmp(sr->valuestring, "recomputed") == 0) {
            st->preempted = out->preempt = 1; /* the engine gave the request up: migrate, not forward */
            out->action = RELAY_DROP;
            cJSON_Delete(o);
            return;
        }
    }
    int changed = has_usage && st->prefill_answered ? rw_patch_usage(o, st->cached_tokens) : 0;
    if (has_usage && st->continuation)
        changed |= rw_patch_usage_continuation(o, st->delivered);
    const char *text = content ? rw_event_text(o) : NULL;
    cJSON *ch0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0);
    int has_role = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(ch0, "delta"), "role") != NULL;
    if ((st->prefill_mode || st->continuation) && content) {
        cJSON *ch = ch0;
        cJSON *delta = cJSON_GetObjectItemCaseSensitive(ch, "delta");
        int role_only = cJSON_GetObjectItemCaseSensitive(delta, "role") && (!text || !*text);
        if (role_only && st->role_sent) {
            cJSON_Delete(o);
            out->action = RELAY_DROP; /* the client already has the role chunk */
            return;
        }
        if (st->prefill_mode && !role_only && !st->first_dropped) {
            st->first_dropped = 1; /* the prefill's token stands in for it */
            out->mismatch = !st->first_text || !text || strcmp(text, st->first_text) != 0;
            if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(ch, "finish_reason"))) {
                cJSON_Delete(o);
                out->action = RELAY_DROP;
                return;
            }
            /* max_tokens 1: the dropped event also ended the choice; keep its finish_reason, no text */
            if (cJSON_GetObjectItemCaseSensitive(ch, "text"))
                cJSON_ReplaceItemInObjectCaseSensitive(ch, "text", cJSON_CreateString(""));
            else if (cJSON_GetObjectItemCaseSensitive(delta, "content")) /* cJSON leaks the new item on a miss */
                cJSON_ReplaceItemInObjectCaseSensitive(delta, "content", cJSON_CreateString(""));
            if (st->role_sent && cJSON_IsObject(delta)) /* an engine that puts the role in its first token */
                cJSON_DeleteItemFromObjectCaseSensitive(delta, "role");
            text = NULL; /* replaced (freed): the client got the prefill's text for it */
            changed = 1;
        } else if (!role_only) {
            out->token_out = 1;
        }
    } else if (content && text && *text) {
        out->token_out = 1;
    }
    out->content = content;
    if (content && has_role)
        st->role_sent = 1; /* (parsed events only: what a continuation must not repeat) */
    /* one id across every event the client receives */
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "id");
    if (st->track_text) {
        if (text && *text) {
            out->text = out->text_buf = XPYD_XALLOC(strdup(text));
            out->text_len = strlen(text);
        }
        if (!st->resp_id && cJSON_IsString(id))
            out->id = strdup(id->valuestring);
    }
    if ((st->prefill_mode || st->continuation) && st->resp_id && cJSON_IsString(id) &&
        strcmp(id->valuestring, st->resp_id) != 0) {
        cJSON_ReplaceItemInObjectCaseSensitive(o, "id", cJSON_CreateString(st->resp_id));
        changed = 1;
    }
    if (changed) {
        out->action = RELAY_REWRITE;
        out->json = o;
    } else {
        cJSON_Delete(o);
    }
}
