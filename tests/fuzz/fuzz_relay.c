/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_relay.c - libFuzzer harness: the router's relay decision for each decode SSE event (router/relay.c),
 * the real code stream.c calls, fed with events the real SSE splitter (common/xpyd_sse.c) cuts from the
 * input. The first two bytes choose the request's settings (first token from prefill or decode, prefill
 * answered, cached tokens, role chunk already sent, ids). Checks what the client would see: [DONE] is
 * always forwarded; a rewritten event is a JSON object; in prefill mode the role chunk never goes twice, the
 * decode's first content event never carries text, and every JSON event sent carries the response id; a
 * patched usage shows the prefill's cached tokens; nothing leaks. relay_scan's one pass finds what substring
 * searches find. */
#include "relay.h"
#include "rewrite.h"
#include "xpyd_sse.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct ctx {
    struct relay_state st;
};

static int sent_id_ok(const cJSON *o, const char *resp_id)
{
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "id");
    return !resp_id || !cJSON_IsString(id) || strcmp(id->valuestring, resp_id) == 0;
}

/* The substring searches relay_scan stands for. */
static void check_scan(const char *data, size_t len)
{
    if (memchr(data, 0, len))
        return;
    struct relay_keys k;
    relay_scan(data, len, &k);
    int usage = 0;
    for (const char *p = strstr(data, "\"usage\""); p; p = strstr(p + 1, "\"usage\"")) { /* overlapping too */
        const char *q = p + 7;
        while (*q && (unsigned char)*q <= ' ')
            q++;
        if (*q++ != ':')
            continue;
        while (*q && (unsigned char)*q <= ' ')
            q++;
        usage |= *q == '{';
    }
    if (k.choices != strstr(data, "\"choices\"") ||
        k.empty_choices != (strstr(data, "\"choices\":[]") || strstr(data, "\"choices\": []")) ||
        k.usage_object != usage || k.recomputed != (strstr(data, "\"recomputed\"") != NULL) ||
        k.role != (strstr(data, "\"role\"") != NULL) || k.text != (strstr(data, "\"text\"") != NULL))
        abort();
}

static int on_event(void *arg, const char *data, size_t len, const char *raw, size_t rawlen)
{
    struct ctx *c = arg;
    check_scan(data, len);
    int role_sent_before = c->st.role_sent, first_dropped_before = c->st.first_dropped;
    int preempted_before = c->st.preempted;
    struct relay_out out;
    relay_event(&c->st, data, len, &out);
    if (c->st.track_text && !c->st.prefill_mode && !c->st.continuation && !preempted_before &&
        out.action == RELAY_FORWARD && !memchr(data, 0, len)) {
        /* the text kept for a migration is the text a parse finds, and the id the first id a parse finds (the
         * scans in relay.c, or the parse itself); an event that does not parse may give its id by the scan */
        cJSON *p = cJSON_ParseWithLength(data, len);
        const char *want = p && out.content ? rw_event_text(p) : NULL;
        int same = want && *want ? out.text && out.text_len == strlen(want) && memcmp(out.text, want, out.text_len) == 0
                                 : out.text == NULL;
        if (p && !same)
            abort();
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(p, "id");
        if (p && c->st.resp_id == NULL && cJSON_IsObject(p) &&
            (cJSON_IsString(id) ? !out.id || strcmp(out.id, id->valuestring) != 0 : out.id != NULL))
            abort();
        cJSON_Delete(p);
    }
    if (preempted_before && out.action != RELAY_DROP)
        abort(); /* nothing of a preempted leg reaches the client */
    if (out.preempt && out.action != RELAY_DROP)
        abort();
    if ((out.text || out.id) && !c->st.track_text)
        abort();
    if (out.text && (out.text_len == 0 || (out.text_buf && out.text != out.text_buf) ||
                     (!out.text_buf && (out.text < data || out.text + out.text_len > data + len))))
        abort(); /* only text the client gets: a span of the event or the caller's own copy */
    free(out.text_buf);
    free(out.id);
    if (preempted_before)
        return 0;
    if (strcmp(data, "[DONE]") == 0) {
        if (!out.done || out.action != RELAY_FORWARD || !c->st.done_seen)
            abort();
        return 0;
    }
    if (out.action == RELAY_REWRITE) {
        if (!cJSON_IsObject(out.json))
            abort();
        char *s = cJSON_PrintUnformatted(out.json);
        cJSON *back = s ? cJSON_Parse(s) : NULL;
        if (!back)
            abort(); /* what the client gets parses */
        cJSON_Delete(back);
        free(s);
    }
    if (out.action != RELAY_REWRITE && out.json)
        abort();
    const cJSON *sent = out.action == RELAY_REWRITE ? out.json : NULL;
    cJSON *parsed = NULL;
    if (out.action == RELAY_FORWARD && !memchr(data, 0, len)) { /* with a raw NUL it is not JSON: passed on as is */
        parsed = cJSON_ParseWithLength(data, len);
        sent = parsed;
    }
    if (sent && c->st.continuation && role_sent_before && out.action != RELAY_DROP && cJSON_IsObject(sent)) {
        const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(sent, "choices"), 0);
        const cJSON *delta = cJSON_GetObjectItemCaseSensitive(ch, "delta");
        const char *text = rw_event_text(sent);
        if (cJSON_GetObjectItemCaseSensitive(delta, "role") && (!text || !*text) &&
            strstr(data, "\"choices\":[]") == NULL && strstr(data, "\"choices\": []") == NULL)
            abort(); /* a continuation never repeats the role chunk */
    }
    if (sent && c->st.prefill_mode) {
        if (!sent_id_ok(sent, c->st.resp_id) && out.action == RELAY_REWRITE)
            abort(); /* a rewritten event always carries the response id */
        const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(sent, "choices"), 0);
        const cJSON *delta = cJSON_GetObjectItemCaseSensitive(ch, "delta");
        const char *text = rw_event_text(sent);
        if (role_sent_before && cJSON_GetObjectItemCaseSensitive(delta, "role") && (!text || !*text) &&
            out.action != RELAY_DROP && cJSON_IsObject(sent) && strstr(data, "\"choices\":[]") == NULL &&
            strstr(data, "\"choices\": []") == NULL)
            abort(); /* the role chunk went to the client twice */
        if (!first_dropped_before && c->st.first_dropped && text && *text)
            abort(); /* the decode's first token went out although the prefill's stands in for it */
    }
    if (out.action == RELAY_REWRITE && c->st.prefill_answered && c->st.cached_tokens >= 0) {
        const cJSON *u = cJSON_GetObjectItemCaseSensitive(out.json, "usage");
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens_details"),
                                                           "cached_tokens");
        if (cJSON_IsObject(u) && (!cJSON_IsNumber(ct) || ct->valuedouble != (double)c->st.cached_tokens))
            abort(); /* the usage the client sees shows the prefill's cached tokens */
    }
    cJSON_Delete(parsed);
    cJSON_Delete(out.json);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    struct ctx c;
    memset(&c, 0, sizeof c);
    c.st.prefill_mode = data[0] & 1;
    c.st.prefill_answered = (data[0] >> 1) & 1;
    c.st.role_sent = (data[0] >> 2) & 1;
    c.st.first_text = (data[0] >> 3) & 1 ? " x" : NULL;
    c.st.resp_id = (data[0] >> 4) & 1 ? "cmpl-prefill" : NULL;
    c.st.cached_tokens = (long)data[1] - 1;
    c.st.track_text = (data[0] >> 5) & 1;
    c.st.continuation = (data[0] >> 6) & 1;
    c.st.delivered = (data[0] >> 7) & 1 ? 3 : 0;
    struct xpyd_sse_parser p;
    memset(&p, 0, sizeof p);
    p.max_event = 1 << 16;
    size_t i = 2;
    while (i < size) { /* in input-chosen pieces, as bytes arrive from a socket */
        size_t n = 1 + (data[i] % 64);
        i++;
        if (n > size - i)
            n = size - i;
        if (xpyd_sse_feed(&p, (const char *)data + i, n, on_event, &c) < 0)
            break;
        i += n;
    }
    xpyd_sse_reset(&p);
    return 0;
}
