/* SPDX-License-Identifier: Apache-2.0 */
/* sim_output.c - what a simulated engine writes: vLLM's non-streamed answer, its SSE chunks (the chat role
 * chunk, token chunks, the usage chunk, [DONE]) and the X-KV-Transfer report. Builders only: sending and
 * ending the request is sim_engine.c's. */
#include "sim_internal.h"

#include "xpyd_sse.h"
#include "xpyd_util.h"

#include <cjson/cJSON.h>
#include <event2/buffer.h>
#include <evhtp/evhtp.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void add_usage(cJSON *parent, const struct sreq *r)
{
    cJSON *u = cJSON_AddObjectToObject(parent, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)r->p.prompt.n);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(r->p.prompt.n + r->pos));
    cJSON_AddNumberToObject(u, "completion_tokens", (double)r->pos);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", (double)r->cached_tokens);
}

void sim_usage_json(const struct sreq *r, char *out, size_t cap)
{
    snprintf(out, cap,
             "{\"prompt_tokens\":%zu,\"total_tokens\":%zu,\"completion_tokens\":%zu,"
             "\"prompt_tokens_details\":{\"cached_tokens\":%ld}}",
             r->p.prompt.n, r->p.prompt.n + r->pos, r->pos, r->cached_tokens);
}

/* The finished non-streamed answer, vLLM's shape (with kv_transfer_params on a prefill); the caller frees it. */
char *sim_final_json(struct sreq *r)
{
    const struct sim *s = r->sim;
    cJSON *o = XPYD_XALLOC(cJSON_CreateObject());
    char *text = XPYD_XALLOC(malloc(evbuffer_get_length(r->text) + 1));
    size_t tl = evbuffer_get_length(r->text);
    evbuffer_copyout(r->text, text, tl);
    text[tl] = '\0';
    cJSON_AddStringToObject(o, "id", r->id_json);
    cJSON_AddStringToObject(o, "object", r->p.chat ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)r->created);
    cJSON_AddStringToObject(o, "model", s->cfg.model);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (r->p.chat) {
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddStringToObject(m, "content", text);
        cJSON_AddArrayToObject(m, "tool_calls");
    } else {
        cJSON_AddStringToObject(c, "text", text);
    }
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddStringToObject(c, "finish_reason", r->finish_reason);
    if (r->stop_reason)
        cJSON_AddStringToObject(c, "stop_reason", r->stop_reason);
    else
        cJSON_AddNullToObject(c, "stop_reason");
    if (!r->p.chat)
        cJSON_AddNullToObject(c, "prompt_logprobs");
    add_usage(o, r);
    if (r->kv_out) {
        cJSON_AddItemToObject(o, "kv_transfer_params", r->kv_out);
        r->kv_out = NULL;
    } else {
        cJSON_AddNullToObject(o, "kv_transfer_params");
    }
    char *body = XPYD_XALLOC(cJSON_PrintUnformatted(o));
    cJSON_Delete(o);
    free(text);
    return body;
}

void sim_kv_transfer_header(struct sreq *r)
{
    if (!r->kv_xfer_bytes || !r->ereq)
        return;
    char v[96];
    snprintf(v, sizeof v, "bytes=%" PRIu64 "; us=%" PRIu64, r->kv_xfer_bytes, r->kv_xfer_us);
    sim_add_header(r->ereq, "X-KV-Transfer", v);
}

void sim_stream_begin(struct sreq *r)
{
    sim_kv_transfer_header(r);
    sim_add_header(r->ereq, "Content-Type", "text/event-stream");
    sim_add_header(r->ereq, "Cache-Control", "no-cache");
    evhtp_send_reply_chunk_start(r->ereq, EVHTP_RES_OK);
    r->stream_started = 1;
    if (r->p.chat) { /* vLLM's first chat chunk carries the role and empty content */
        char buf[640];
        int n = snprintf(buf, sizeof buf,
                         "{\"id\":\"%s\",\"object\":\"chat.completion.chunk\",\"created\":%lld,\"model\":\"%s\","
                         "\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
                         "\"logprobs\":null,\"finish_reason\":null}]}",
                         r->id_json, (long long)r->created, r->sim->model_json);
        struct evbuffer *b = evbuffer_new();
        xpyd_sse_write(b, buf, (size_t)n);
        evhtp_send_reply_chunk(r->ereq, b);
        evbuffer_free(b);
    }
}

/* The SSE bytes of token `tok` (and, if last, the usage chunk and [DONE]); the caller sends and frees them. */
struct evbuffer *sim_token_event(struct sreq *r, const char *tok, int last)
{
    char buf[1024];
    char fr[64];
    snprintf(fr, sizeof fr, last ? "\"%s\"" : "null", r->finish_reason ? r->finish_reason : "length");
    if (last && r->stop_reason) /* chat and completions chunks both carry it then */
        snprintf(fr + strlen(fr), sizeof fr - strlen(fr), ",\"stop_reason\":\"%s\"", r->stop_reason);
    int n;
    if (r->p.chat)
        n = snprintf(buf, sizeof buf,
                     "{\"id\":\"%s\",\"object\":\"chat.completion.chunk\",\"created\":%lld,\"model\":\"%s\","
                     "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%s\"},\"logprobs\":null,"
                     "\"finish_reason\":%s}]}",
                     r->id_json, (long long)r->created, r->sim->model_json, tok, fr);
    else
        n = snprintf(buf, sizeof buf,
                     "{\"id\":\"%s\",\"object\":\"text_completion\",\"created\":%lld,\"model\":\"%s\","
                     "\"choices\":[{\"index\":0,\"text\":\"%s\",\"logprobs\":null,\"finish_reason\":%s%s}],"
                     "\"usage\":null}",
                     r->id_json, (long long)r->created, r->sim->model_json, tok, fr,
                     last && r->stop_reason ? "" : ",\"stop_reason\":null");
    struct evbuffer *b = evbuffer_new();
    xpyd_sse_write(b, buf, (size_t)n);
    if (last) {
        if (r->p.include_usage) {
            char u[256];
            sim_usage_json(r, u, sizeof u);
            n = snprintf(buf, sizeof buf,
                         "{\"id\":\"%s\",\"object\":\"%s\",\"created\":%lld,\"model\":\"%s\",\"choices\":[],"
                         "\"usage\":%s}",
                         r->id_json, r->p.chat ? "chat.completion.chunk" : "text_completion",
                         (long long)r->created, r->sim->model_json, u);
            xpyd_sse_write(b, buf, (size_t)n);
        }
        xpyd_sse_write_done(b);
    }
    return b;
}
