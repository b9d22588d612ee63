/* SPDX-License-Identifier: Apache-2.0 */
/* feedback_parse.c - reads vLLM's load series out of a Prometheus page, and an engine's context length out of
 * its model list (feedback_parse.h). */
#include "feedback_parse.h"

#include "json_view.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Counts a series value per engine label from one Prometheus line. */
static int parse_line(const char *l, const char *end, const char *name, int engine, double *sum, double *max)
{
    size_t nl = strlen(name);
    if ((size_t)(end - l) <= nl || memcmp(l, name, nl) != 0 || (l[nl] != '{' && l[nl] != ' '))
        return 0;
    const char *lab = l + nl, *val = end;
    while (val > lab && val[-1] != ' ')
        val--;
    if (engine >= 0) {
        char want[32];
        snprintf(want, sizeof want, "engine=\"%d\"", engine);
        const char *close = memchr(lab, '}', (size_t)(end - lab));
        if (!close || !memmem(lab, (size_t)(close - lab), want, strlen(want)))
            return 0;
    }
    char num[64];
    size_t vl = (size_t)(end - val) < sizeof num - 1 ? (size_t)(end - val) : sizeof num - 1;
    memcpy(num, val, vl);
    num[vl] = '\0';
    char *e;
    double v = strtod(num, &e);
    if (e == num || !isfinite(v) || v < 0 || v > 1e12)
        return 0; /* not a count an engine reports (NaN, inf, negative, absurd): ignored, never cast */
    *sum += v;
    if (v > *max)
        *max = v;
    return 1;
}

/* A numeric label of an info line (`name{..,key="123",..} 1`): its value, or 0. */
static long info_label(const char *l, const char *end, const char *name, const char *key)
{
    size_t nl = strlen(name), kl = strlen(key);
    if ((size_t)(end - l) <= nl || memcmp(l, name, nl) != 0 || l[nl] != '{')
        return 0;
    const char *close = memchr(l, '}', (size_t)(end - l));
    for (const char *k = l + nl; close && k + kl + 2 < close; k++) {
        if ((k[-1] == '{' || k[-1] == ',') && memcmp(k, key, kl) == 0 && k[kl] == '=' && k[kl + 1] == '"') {
            char *e;
            long v = strtol(k + kl + 2, &e, 10);
            return *e == '"' && v > 0 && v < (1L << 40) ? v : 0;
        }
    }
    return 0;
}

int probe_parse_engine_metrics(const char *page, size_t len, int engine, struct engine_load *out)
{
    out->num_gpu_blocks = out->block_size = 0;
    double w = 0, wmax = 0, run = 0, runmax = 0, kv = 0, kvmax = 0, gkv = 0, gkvmax = 0;
    int found = 0, kvfound = 0;
    const char *p = page, *end = page + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        if (le > p && *p != '#') {
            found += parse_line(p, le, "vllm:num_requests_waiting", engine, &w, &wmax);
            found += parse_line(p, le, "vllm:num_requests_running", engine, &run, &runmax);
            int k = parse_line(p, le, "vllm:kv_cache_usage_perc", engine, &kv, &kvmax);
            kvfound += k;
            found += k + parse_line(p, le, "vllm:gpu_cache_usage_perc", engine, &gkv, &gkvmax);
            long nb = info_label(p, le, "vllm:cache_config_info", "num_gpu_blocks");
            if (nb) { /* one per engine process (no engine label): every rank's cache has this size */
                out->num_gpu_blocks = nb;
                out->block_size = info_label(p, le, "vllm:cache_config_info", "block_size");
            }
        }
        p = le + 1;
    }
    out->waiting = w;
    out->running = run;
    out->kv_usage = kvfound ? kvmax : gkvmax; /* newer name first, the older one as fallback */
    if (out->kv_usage > 1)
        out->kv_usage = 1; /* a fraction */
    return found;
}


/* GET /v1/models: its model cards, iterated from it (0), or -1 when the body is not strict JSON with a "data" array */
static int models_cards(const char *body, size_t len, struct jv_iter *it)
{
    if (!body || jv_check(body, len, NULL, NULL) != 0)
        return -1;
    struct jv data = jv_get(jv_at(body, body + len), "data");
    if (jv_type(data) != JV_ARRAY)
        return -1;
    jv_iter_init(it, data);
    return 0;
}

size_t probe_parse_models_adapters(const char *body, size_t len, void (*fn)(void *arg, const char *id, size_t n),
                                   void *arg)
{
    struct jv_iter it;
    struct jv card;
    size_t found = 0;
    if (models_cards(body, len, &it))
        return 0;
    while (jv_next(&it, NULL, &card)) {
        struct jv id = jv_get(card, "id");
        if (jv_type(jv_get(card, "parent")) != JV_STRING || jv_type(id) != JV_STRING)
            continue;
        char *name = malloc(jv_str_len(id) + 1);
        if (!name)
            return found;
        size_t n = jv_str_decode(id, name);
        if (n) {
            fn(arg, name, n);
            found++;
        }
        free(name);
    }
    return found;
}

long probe_parse_models_max_len(const char *body, size_t len)
{
    struct jv_iter it;
    struct jv card;
    long most = 0;
    if (models_cards(body, len, &it))
        return 0;
    while (jv_next(&it, NULL, &card)) {
        double d;
        if (jv_double(jv_get(card, "max_model_len"), &d) == 0 && d >= 1 && d < (double)(1L << 40) && d == floor(d) &&
            (long)d > most)
            most = (long)d;
    }
    return most;
}
