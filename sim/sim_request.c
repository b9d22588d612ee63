/* SPDX-License-Identifier: Apache-2.0 */
/* sim_request.c - vLLM-compatible request validation for xpyd_sim. */
#include "sim_request.h"

#include "xpyd_util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(char **err, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char **err, int status, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    *err = XPYD_XALLOC(strdup(buf));
    return status;
}

/* An integral JSON number that fits a long long (checked before the cast: converting an out-of-range double
 * is undefined behaviour; found by fuzz_sim_request). */
static int is_int(const cJSON *v)
{
    return cJSON_IsNumber(v) && v->valuedouble > -9.2e18 && v->valuedouble < 9.2e18 &&
           v->valuedouble == (double)(long long)v->valuedouble;
}

/* A bootstrap_room: any integer in [0, 2^63) (the router draws 63 random bits; SGLang takes any Python int).
 * As a double, the largest ones round to 2^63 itself, which is accepted too (a room is only compared, never
 * cast to a signed type). */
static int is_room(const cJSON *v)
{
    return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble <= 9223372036854775808.0 &&
           v->valuedouble == (double)(uint64_t)v->valuedouble; /* in range: the cast is defined */
}

static int is_port(const cJSON *v)
{
    return is_int(v) && v->valuedouble >= 1 && v->valuedouble <= 65535;
}

/* Role token: one per chat message, an id outside the word range is not needed; hash the role tag. */
static int add_role(struct sim_prompt *p, const char *role)
{
    char tag[64];
    snprintf(tag, sizeof tag, "<|%s|>", role);
    return sim_prompt_add_text(p, tag, strlen(tag));
}

/* What adding text to a prompt returned, as a status: 0, 400 for text the tokenizer refuses, 500. */
static int text_status(int rc, char **err)
{
    return !rc ? 0 : rc == -EINVAL ? fail(err, 400, "the prompt is not valid UTF-8") : 500;
}

/* special: the body's add_special_tokens (vLLM: true unless it says false) */
static int prompt_from_completion(const cJSON *prompt, int special, struct sim_prompt *p, char **err)
{
    if (cJSON_IsString(prompt))
        return text_status(sim_prompt_add_prompt(p, prompt->valuestring, strlen(prompt->valuestring), special), err);
    if (!cJSON_IsArray(prompt) || cJSON_GetArraySize(prompt) == 0)
        return fail(err, 400, "prompt must be a string, an array of token ids, or an array of one of these");
    const cJSON *first = cJSON_GetArrayItem(prompt, 0);
    if (cJSON_GetArraySize(prompt) == 1 && (cJSON_IsString(first) || cJSON_IsArray(first)))
        return prompt_from_completion(first, special, p, err);
    if (!is_int(first))
        return fail(err, 400, "batched prompts (arrays of several prompts) are not supported by xpyd_sim");
    const cJSON *it;
    cJSON_ArrayForEach(it, prompt)
    {
        if (!is_int(it) || it->valuedouble < 0 || it->valuedouble >= 4294967296.0)
            return fail(err, 400, "prompt token ids must be non-negative integers");
        if (sim_prompt_add_id(p, (uint32_t)it->valuedouble))
            return 500;
    }
    return 0;
}

/* continue_final: vLLM's `continue_final_message`: the last message, an assistant's, is continued, so it gets
 * no role token (its words extend the context as if generated). */
static int prompt_from_messages(const cJSON *msgs, int continue_final, struct sim_prompt *p, char **err)
{
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
        return fail(err, 400, "messages must be a non-empty array");
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs)
    {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role))
            return fail(err, 400, "each message must be an object with a string 'role'");
        int continued = continue_final && !m->next;
        if (continued && strcmp(role->valuestring, "assistant") != 0)
            return fail(err, 400, "continue_final_message needs the last message to be the assistant's");
        if (!continued && add_role(p, role->valuestring))
            return 500;
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (cJSON_IsString(content)) {
            int rc = text_status(sim_prompt_add_text(p, content->valuestring, strlen(content->valuestring)), err);
            if (rc)
                return rc;
        } else if (cJSON_IsArray(content)) {
            const cJSON *part;
            cJSON_ArrayForEach(part, content)
            {
                const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
                const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
                if (!cJSON_IsObject(part) || !cJSON_IsString(type))
                    return fail(err, 400, "message content parts must be objects with a string 'type'");
                if (strcmp(type->valuestring, "text") == 0) {
                    if (!cJSON_IsString(text))
                        return fail(err, 400, "a 'text' content part needs a string 'text'");
                    int rc = text_status(sim_prompt_add_text(p, text->valuestring, strlen(text->valuestring)), err);
                    if (rc)
                        return rc;
                }
            }
        } else if (content && !cJSON_IsNull(content)) {
            return fail(err, 400, "message content must be a string, an array of parts, or null");
        }
    }
    return 0;
}

static char *dup_str(const cJSON *v)
{
    return cJSON_IsString(v) ? XPYD_XALLOC(strdup(v->valuestring)) : NULL;
}

/* "http://host:port[/]" or "http://[v6]:port[/]" into host and port; 0 or -1. */
static int parse_http_addr(const char *s, char **host, int *port)
{
    if (strncmp(s, "http://", 7) != 0)
        return -1;
    s += 7;
    const char *h = s, *he, *colon;
    if (*s == '[') {
        h = s + 1;
        he = strchr(h, ']');
        if (!he || he[1] != ':')
            return -1;
        colon = he + 1;
    } else {
        colon = strchr(s, ':');
        he = colon;
        if (!colon || memchr(s, '/', (size_t)(colon - s)))
            return -1;
    }
    char *end = NULL;
    long p = strtol(colon + 1, &end, 10);
    if (he == h || end == colon + 1 || p < 1 || p > 65535 || (*end && strcmp(end, "/") != 0))
        return -1;
    *host = XPYD_XALLOC(strndup(h, (size_t)(he - h)));
    *port = (int)p;
    return 0;
}

/* vLLM's MooncakeConnector fields: a prefill keeps its KV for transfer_id; a decode claims it. */
static int parse_transfer(const cJSON *kv, const cJSON *xfer, struct sim_handoff_in *h, char **err)
{
    if (!cJSON_IsString(xfer) || !xfer->valuestring[0] || strlen(xfer->valuestring) > 200)
        return fail(err, 400, "kv_transfer_params.transfer_id must be a non-empty string (at most 200 bytes)");
    if (h->do_remote_decode == h->do_remote_prefill)
        return fail(err, 400, "kv_transfer_params with transfer_id needs exactly one of do_remote_decode and "
                              "do_remote_prefill");
    h->transfer_id = dup_str(xfer);
    if (h->do_remote_decode)
        return 0;
    const cJSON *addr = cJSON_GetObjectItemCaseSensitive(kv, "remote_bootstrap_addr");
    h->remote_engine_id = dup_str(cJSON_GetObjectItemCaseSensitive(kv, "remote_engine_id"));
    if (!cJSON_IsString(addr) || !h->remote_engine_id ||
        parse_http_addr(addr->valuestring, &h->remote_host, &h->remote_port) != 0)
        return fail(err, 400, "kv_transfer_params with do_remote_prefill and transfer_id needs remote_engine_id and "
                              "remote_bootstrap_addr (\"http://<host>:<port>\")");
    return 0;
}

static int parse_kv_params(const cJSON *kv, struct sim_handoff_in *h, char **err)
{
    if (!kv || cJSON_IsNull(kv))
        return 0;
    if (!cJSON_IsObject(kv))
        return fail(err, 400, "kv_transfer_params must be an object");
    h->do_remote_decode = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(kv, "do_remote_decode"));
    h->do_remote_prefill = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(kv, "do_remote_prefill"));
    const cJSON *xfer = cJSON_GetObjectItemCaseSensitive(kv, "transfer_id");
    if (xfer && !cJSON_IsNull(xfer))
        return parse_transfer(kv, xfer, h, err);
    if (!h->do_remote_prefill)
        return 0;
    h->remote_engine_id = dup_str(cJSON_GetObjectItemCaseSensitive(kv, "remote_engine_id"));
    h->remote_request_id = dup_str(cJSON_GetObjectItemCaseSensitive(kv, "remote_request_id"));
    h->remote_host = dup_str(cJSON_GetObjectItemCaseSensitive(kv, "remote_host"));
    const cJSON *port = cJSON_GetObjectItemCaseSensitive(kv, "remote_port");
    const cJSON *blocks = cJSON_GetObjectItemCaseSensitive(kv, "remote_block_ids");
    if (!h->remote_engine_id || !h->remote_request_id || !h->remote_host || !is_port(port) ||
        !cJSON_IsArray(blocks))
        return fail(err, 400,
                    "kv_transfer_params with do_remote_prefill needs remote_engine_id, remote_request_id, "
                    "remote_host, remote_port and remote_block_ids");
    h->remote_port = (int)port->valuedouble;
    uint64_t sig = XPYD_FNV_INIT;
    const cJSON *b;
    cJSON_ArrayForEach(b, blocks)
    {
        if (!is_int(b))
            return fail(err, 400, "remote_block_ids must be integers");
        long long id = (long long)b->valuedouble;
        sig = xpyd_fnv64(sig, &id, sizeof id);
    }
    h->block_sig = sig;
    h->has_blocks = 1;
    const cJSON *xs = cJSON_GetObjectItemCaseSensitive(kv, "xpyd_segment");
    if (xs) {
        const cJSON *xa = cJSON_GetObjectItemCaseSensitive(kv, "xpyd_addr");
        const cJSON *xl = cJSON_GetObjectItemCaseSensitive(kv, "xpyd_len");
        const cJSON *xk = cJSON_GetObjectItemCaseSensitive(kv, "xpyd_key");
        char *end = NULL;
        unsigned long long addr = cJSON_IsString(xa) ? strtoull(xa->valuestring, &end, 10) : 0;
        if (!cJSON_IsString(xs) || !cJSON_IsString(xk) || !end || *end || !is_int(xl) || xl->valuedouble < 0 ||
            xl->valuedouble > 1e12)
            return fail(err, 400, "xpyd kv_transfer_params need xpyd_segment, xpyd_addr (decimal string), "
                                  "xpyd_len and xpyd_key");
        h->xpyd_segment = dup_str(xs);
        h->xpyd_key = dup_str(xk);
        h->xpyd_addr = addr;
        h->xpyd_len = (uint64_t)xl->valuedouble;
        h->has_xpyd = 1;
    }
    return 0;
}

static int parse_bootstrap(const cJSON *root, struct sim_handoff_in *h, char **err)
{
    const cJSON *room = cJSON_GetObjectItemCaseSensitive(root, "bootstrap_room");
    const cJSON *dpr = cJSON_GetObjectItemCaseSensitive(root, "data_parallel_rank");
    h->dp_rank = -1;
    if (dpr && !cJSON_IsNull(dpr)) {
        if (!is_int(dpr) || dpr->valuedouble < 0 || dpr->valuedouble > 1e6)
            return fail(err, 400, "data_parallel_rank must be a non-negative integer");
        h->dp_rank = (long)dpr->valuedouble;
    }
    if (!room || cJSON_IsNull(room))
        return 0;
    const cJSON *host = cJSON_GetObjectItemCaseSensitive(root, "bootstrap_host");
    const cJSON *port = cJSON_GetObjectItemCaseSensitive(root, "bootstrap_port");
    if (!is_room(room) || !cJSON_IsString(host) || !is_port(port))
        return fail(err, 400, "bootstrap_room (integer), bootstrap_host (string) and bootstrap_port (integer) "
                              "must be given together");
    h->has_bootstrap = 1;
    h->bootstrap_room = (uint64_t)room->valuedouble;
    h->bootstrap_host = XPYD_XALLOC(strdup(host->valuestring));
    h->bootstrap_port = (int)port->valuedouble;
    return 0;
}

/* Optional field of a given JSON kind; 0 when absent or well-typed, else an error status. */
static int check_bool(const cJSON *root, const char *name, int *out, char **err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsBool(v))
        return fail(err, 400, "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(v);
    return 0;
}

static int check_int(const cJSON *root, const char *name, long *out, int *present, char **err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!is_int(v))
        return fail(err, 400, "'%s' must be an integer", name);
    *out = (long)v->valuedouble;
    *present = 1;
    return 0;
}

int sim_lora_next(const char **list, struct sim_lora *out)
{
    for (const char *p = *list ? *list : ""; *p;) {
        size_t k = strcspn(p, ","), nk = strcspn(p, ",="); /* NAME, then =PATH up to the next comma */
        *out = (struct sim_lora){p, nk, nk < k ? p + nk + 1 : p, nk < k ? k - nk - 1 : nk};
        p += k;
        p += *p == ',';
        *list = p;
        if (nk)
            return 1;
    }
    return 0;
}

int sim_lora_served(const char *loras, const char *name)
{
    struct sim_lora a;
    size_t n = strlen(name);
    while (sim_lora_next(&loras, &a))
        if (a.nname == n && !memcmp(a.name, name, n))
            return 1;
    return 0;
}

static int parse_fields(const cJSON *root, int chat, const struct sim_limits *lim, struct sim_params *out,
                        char **err)
{
    int rc;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model && !cJSON_IsNull(model)) {
        if (!cJSON_IsString(model))
            return fail(err, 400, "'model' must be a string");
        if (strcmp(model->valuestring, lim->model) != 0 && !sim_lora_served(lim->loras, model->valuestring))
            return fail(err, 404, "The model `%.200s` does not exist.", model->valuestring);
    }
    char terr[400];
    if (chat && (rc = sim_prompt_add_chat(&out->prompt, root, terr, sizeof terr)) != -ENOSYS)
        rc = !rc ? 0 : rc == -EINVAL ? fail(err, 400, "%s", terr) : 500; /* the model's template, as vLLM */
    else if (chat)
        rc = prompt_from_messages(cJSON_GetObjectItemCaseSensitive(root, "messages"),
                                  cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "continue_final_message")),
                                  &out->prompt, err);
    else {
        const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(root, "prompt");
        rc = prompt ? prompt_from_completion(
                          prompt, !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(root, "add_special_tokens")),
                          &out->prompt, err)
                    : fail(err, 400, "'prompt' is required");
    }
    if (rc)
        return rc;
    /* vLLM's truncate_prompt_tokens (_validate_truncation_size): -1 is max_model_len, more than it a 400; the
     * prompt then keeps its last k tokens (the tokenizer's special tokens around them, where it added some) */
    long trunc = 0;
    int has_trunc = 0;
    if ((rc = check_int(root, "truncate_prompt_tokens", &trunc, &has_trunc, err)))
        return rc;
    if (has_trunc) {
        if (trunc < -1)
            return fail(err, 400, "truncate_prompt_tokens must be greater than or equal to -1, got %ld.", trunc);
        if (trunc == -1)
            trunc = lim->max_model_len;
        if (trunc > lim->max_model_len)
            return fail(err, 400,
                        "truncate_prompt_tokens value (%ld) is greater than max_model_len (%ld). Please, select a "
                        "smaller truncation size.", trunc, lim->max_model_len);
        const cJSON *pr = cJSON_GetObjectItemCaseSensitive(root, "prompt"), *as = cJSON_GetObjectItemCaseSensitive(
                                                                                   root, "add_special_tokens");
        int text = cJSON_IsString(pr) || (cJSON_GetArraySize(pr) == 1 && cJSON_IsString(cJSON_GetArrayItem(pr, 0)));
        sim_prompt_truncate(&out->prompt, (size_t)trunc, chat ? cJSON_IsTrue(as) : text && !cJSON_IsFalse(as));
    }
    if (out->prompt.n == 0)
        return fail(err, 400, "The prompt cannot be empty.");
    sim_prompt_finish(&out->prompt);

    if ((rc = check_bool(root, "stream", &out->stream, err)) || (rc = check_bool(root, "ignore_eos", &out->ignore_eos, err)))
        return rc;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so))
            return fail(err, 400, "'stream_options' must be an object");
        if (!out->stream)
            return fail(err, 400, "Stream options can only be defined when `stream=True`.");
        if ((rc = check_bool(so, "include_usage", &out->include_usage, err)))
            return rc;
    }
    long n = 1;
    int has_n = 0;
    if ((rc = check_int(root, "n", &n, &has_n, err)))
        return rc;
    if (n != 1)
        return fail(err, 400, "n must be 1 (xpyd_sim generates one choice per request), got %ld.", n);

    long max_tokens = 0, mct = 0, min_tokens = 0;
    int has_mt = 0, has_mct = 0, has_min = 0;
    if ((rc = check_int(root, "max_tokens", &max_tokens, &has_mt, err)) ||
        (rc = check_int(root, "max_completion_tokens", &mct, &has_mct, err)) ||
        (rc = check_int(root, "min_tokens", &min_tokens, &has_min, err)))
        return rc;
    if (has_mct) { /* vLLM gives max_completion_tokens precedence */
        max_tokens = mct;
        has_mt = 1;
    }
    long plen = (long)out->prompt.n;
    if (has_mt && max_tokens < 1)
        return fail(err, 400, "max_tokens must be at least 1, got %ld.", max_tokens);
    if (!has_mt) /* vLLM: a completion's default is 16; a chat's, or an explicit null, is what the context leaves */
        max_tokens = chat || cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(root, "max_tokens"))
                         ? lim->max_model_len - plen
                         : 16;
    if (plen + (max_tokens > 0 ? max_tokens : 0) > lim->max_model_len || max_tokens < 1)
        return fail(err, 400,
                    "This model's maximum context length is %ld tokens. However, you requested %ld tokens (%ld "
                    "in the messages, %ld in the completion). Please reduce the length of the messages or "
                    "completion.",
                    lim->max_model_len, plen + (has_mt ? max_tokens : 0), plen, has_mt ? max_tokens : 0);
    if (has_min && min_tokens < 0)
        return fail(err, 400, "min_tokens must be greater than or equal to 0, got %ld.", min_tokens);
    if (min_tokens > max_tokens)
        return fail(err, 400, "min_tokens must be less than or equal to max_tokens=%ld, got %ld.", max_tokens,
                    min_tokens);
    out->max_tokens = max_tokens;
    out->min_tokens = min_tokens;
    out->chat = chat;
    out->rid = dup_str(cJSON_GetObjectItemCaseSensitive(root, "rid"));
    const cJSON *salt = cJSON_GetObjectItemCaseSensitive(root, "cache_salt");
    if (salt && !cJSON_IsNull(salt)) {
        if (!cJSON_IsString(salt) || !salt->valuestring[0])
            return fail(err, 400, "Parameter 'cache_salt' must be a non-empty string if provided.");
        out->cache_salt = dup_str(salt);
    }
    if ((rc = parse_kv_params(cJSON_GetObjectItemCaseSensitive(root, "kv_transfer_params"), &out->h, err)))
        return rc;
    return parse_bootstrap(root, &out->h, err);
}

int sim_params_parse(const char *body, size_t len, int chat, const struct sim_limits *lim,
                     struct sim_params *out, char **err)
{
    memset(out, 0, sizeof *out);
    out->h.dp_rank = -1;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!root)
        return fail(err, 400, "malformed JSON body: parse error near byte %ld",
                    end ? (long)(end - body) : 0L);
    if (chat)
        sim_tokens_literals(root, body, len);
    int rc = cJSON_IsObject(root) ? parse_fields(root, chat, lim, out, err)
                                  : fail(err, 400, "request body must be a JSON object");
    cJSON_Delete(root);
    if (rc == 500)
        rc = fail(err, 500, "out of memory");
    if (rc)
        sim_params_free(out);
    return rc;
}

int sim_tokenize_parse(const char *body, size_t len, struct sim_prompt *out, char **err)
{
    memset(out, 0, sizeof *out);
    cJSON *root = cJSON_ParseWithLength(body, len);
    sim_tokens_literals(root, body, len);
    int rc;
    if (!root || !cJSON_IsObject(root))
        rc = fail(err, 400, "malformed JSON body");
    else if (cJSON_GetObjectItemCaseSensitive(root, "messages"))
        rc = prompt_from_messages(cJSON_GetObjectItemCaseSensitive(root, "messages"),
                                  cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "continue_final_message")), out, err);
    else if (cJSON_GetObjectItemCaseSensitive(root, "prompt"))
        rc = prompt_from_completion(cJSON_GetObjectItemCaseSensitive(root, "prompt"),
                                    !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(root, "add_special_tokens")), out, err);
    else
        rc = fail(err, 400, "'prompt' or 'messages' is required");
    cJSON_Delete(root);
    if (rc) {
        sim_prompt_free(out);
        return rc == 500 ? fail(err, 500, "out of memory") : rc;
    }
    sim_prompt_finish(out);
    return 0;
}

void sim_params_free(struct sim_params *p)
{
    sim_prompt_free(&p->prompt);
    free(p->h.remote_engine_id);
    free(p->h.remote_request_id);
    free(p->h.remote_host);
    free(p->h.bootstrap_host);
    free(p->h.transfer_id);
    free(p->h.xpyd_segment);
    free(p->h.xpyd_key);
    free(p->rid);
    free(p->cache_salt);
    memset(p, 0, sizeof *p);
    p->h.dp_rank = -1;
}
