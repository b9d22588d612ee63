/* SPDX-License-Identifier: Apache-2.0 */
/* sim_tokens.c - token model of xpyd_sim (see sim_tokens.h for the rule). */
#include "sim_tokens.h"

#include "xpyd_util.h"

#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

int sim_prompt_add_id(struct sim_prompt *p, uint32_t id)
{
    if (p->n == p->cap) {
        size_t nc = p->cap ? p->cap * 2 : 64;
        uint32_t *ni = realloc(p->ids, nc * sizeof *ni);
        if (!ni)
            return -ENOMEM;
        p->ids = ni;
        p->cap = nc;
    }
    p->ids[p->n++] = id;
    return 0;
}

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static sim_encoder_fn encoder;
static void *encoder_arg;
static sim_chat_fn chat_render;

/* ids (malloc'ed, freed here) appended to the prompt */
static int add_ids(struct sim_prompt *p, uint32_t *ids, size_t n)
{
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++)
        rc = sim_prompt_add_id(p, ids[i]);
    free(ids);
    return rc;
}
static void *chat_arg;

void sim_tokens_set_chat(sim_chat_fn render, void *arg)
{
    chat_render = render;
    chat_arg = arg;
}

static sim_truncate_fn truncater;
static void *truncater_arg;

void sim_tokens_set_truncate(sim_truncate_fn fn, void *arg)
{
    truncater = fn;
    truncater_arg = arg;
}

void sim_prompt_truncate(struct sim_prompt *p, size_t k, int special)
{
    if (p->n <= k)
        return;
    if (truncater) {
        p->n = truncater(truncater_arg, p->ids, p->n, k, special);
        return;
    }
    memmove(p->ids, p->ids + (p->n - k), k * sizeof *p->ids);
    p->n = k;
}

static sim_literals_fn literals;

void sim_tokens_set_literals(sim_literals_fn fn)
{
    literals = fn;
}

void sim_tokens_literals(struct cJSON *root, const char *body, size_t len)
{
    if (literals)
        literals(root, body, len);
}

int sim_prompt_add_chat(struct sim_prompt *p, const struct cJSON *root, char *err, size_t cap)
{
    uint32_t *ids;
    size_t n;
    if (!chat_render)
        return -ENOSYS;
    if (chat_render(chat_arg, root, &ids, &n, err, cap))
        return -EINVAL;
    return add_ids(p, ids, n);
}

void sim_tokens_set_encoder(sim_encoder_fn encode, void *arg)
{
    encoder = encode;
    encoder_arg = arg;
}

static int add_encoded(struct sim_prompt *p, const char *text, size_t len, int special)
{
    uint32_t *ids;
    size_t n;
    if (encoder(encoder_arg, text, len, special, &ids, &n))
        return -EINVAL;
    return add_ids(p, ids, n);
}

int sim_prompt_add_prompt(struct sim_prompt *p, const char *text, size_t len, int special)
{
    return encoder ? add_encoded(p, text, len, special) : sim_prompt_add_text(p, text, len);
}

int sim_prompt_add_text(struct sim_prompt *p, const char *text, size_t len)
{
    if (encoder)
        return add_encoded(p, text, len, 0);
    size_t i = 0;
    while (i < len) {
        while (i < len && is_space(text[i]))
            i++;
        size_t start = i;
        while (i < len && !is_space(text[i]))
            i++;
        if (i > start) {
            uint32_t id = (uint32_t)(xpyd_fnv64(XPYD_FNV_INIT, text + start, i - start) % SIM_VOCAB);
            if (sim_prompt_add_id(p, id))
                return -ENOMEM;
        }
    }
    return 0;
}

void sim_prompt_finish(struct sim_prompt *p)
{
    p->hash = xpyd_fnv64(XPYD_FNV_INIT, p->ids, p->n * sizeof *p->ids);
}

void sim_prompt_free(struct sim_prompt *p)
{
    free(p->ids);
    memset(p, 0, sizeof *p);
}

uint32_t sim_gen_token(uint64_t ctx, uint64_t seed)
{
    return (uint32_t)(xpyd_mix64(ctx ^ xpyd_mix64(seed + 0x5151u)) % SIM_VOCAB);
}

uint64_t sim_ctx_extend(uint64_t ctx, uint32_t id)
{
    char text[32];
    size_t n = sim_token_text(id, text, sizeof text);
    /* the id the generated word gets when it is read back as prompt text (" word": the word) */
    uint32_t wid = (uint32_t)(xpyd_fnv64(XPYD_FNV_INIT, text + 1, n - 1) % SIM_VOCAB);
    return xpyd_fnv64(ctx, &wid, sizeof wid);
}

int sim_gen_eos(uint64_t ctx, uint64_t seed, double eos_prob)
{
    if (eos_prob <= 0)
        return 0;
    uint64_t r = xpyd_mix64(ctx ^ xpyd_mix64(seed + 0xe05u) ^ 1);
    return (double)(r >> 11) / 9007199254740992.0 < eos_prob;
}

size_t sim_token_text(uint32_t id, char *out, size_t cap)
{
    static const char cons[] = "bcdfghjklmnprstvwz";
    static const char vow[] = "aeiou";
    size_t n = 0;
    out[n++] = ' ';
    uint32_t v = id;
    int syll = 1 + (int)(v % 3);
    v /= 3;
    for (int s = 0; s < syll && n + 3 < cap; s++) {
        out[n++] = cons[v % 18];
        v /= 18;
        out[n++] = vow[v % 5];
        v /= 5;
        if (v == 0)
            v = id * 2654435761u;
    }
    out[n] = '\0';
    return n;
}

void sim_kv_fill(const struct sim_prompt *p, size_t bytes_per_token, unsigned char *out)
{
    /* token j's word k (eight bytes, little-endian): mix64 of (id << 32 ^ j) + k x SplitMix's step, so the
     * words of a token are independent (a chain of mix64, a byte at a time, was a tenth of a busy prefill's CPU
     * at 4,000-token prompts) */
    for (size_t j = 0; j < p->n; j++) {
        uint64_t s = ((uint64_t)p->ids[j] << 32) ^ j;
        unsigned char *o = out + j * bytes_per_token;
        for (size_t b = 0; b < bytes_per_token; b += 8) {
            uint64_t x = xpyd_mix64(s + (b / 8) * 0x9e3779b97f4a7c15ULL);
            uint64_t w = htole64(x); /* not bytes into an array read back as a word: a store-forwarding stall */
            if (bytes_per_token - b >= 8)
                memcpy(o + b, &w, 8); /* one store */
            else
                memcpy(o + b, &w, bytes_per_token - b);
        }
    }
}
