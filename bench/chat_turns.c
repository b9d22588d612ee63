/* SPDX-License-Identifier: Apache-2.0 */
/* chat_turns.c - the multi-turn chat benchmark of issue 39: a conversation of TURNS turns, each adding about
 * GROWTH tokens (a user message and the assistant's answer, English and some Chinese, seeded), rendered by the
 * model's chat template and tokenized as a router does it for every request: the whole conversation so far,
 * through a tokenization cache that has seen the earlier turns (xtok_encode_cached). Against it, in the same
 * run: tokenizing only the text the turn added (no template, no cache) - the baseline - and the whole
 * conversation without a cache. Each repetition starts from a fresh cache that has seen the previous turn's
 * request (filled outside the timing): `warm` fills it just before (its entries still in this core's L2), `cold`
 * fills all the repetitions' caches first and as many again after them (each a conversation's worth, so a
 * repetition's entries have left L2, as a conversation's have in a router serving others between its turns).
 * CPU time of this thread, the best of REPS repetitions per measurement.
 *   xpyd_chat_turns MODEL_DIR [turns=20] [growth=2000] [reps=5] [warm|cold]
 * Prints one JSON line per turn and a summary line: the worst and the median turn's ratio cached / new text alone,
 * with the render and without it (the encoding alone, through the cache). Linked with the router's allocator. */
#include "micro.h"
#include "xpyd_tokenizer.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static unsigned rnd(unsigned n)
{
    return (unsigned)(micro_rnd() % n);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n ? (n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2) : 0;
}


/* about `tokens` tokens of text: words, digits, punctuation, now and then a Chinese clause */
static char *text_of(const struct xtok *t, size_t tokens)
{
    static const char *const words[] = {"the", "router", "places", "each", "request", "by", "its", "tokens", "and",
                                        "cache", "prefill", "decode", "latency", "throughput", "engine", "model",
                                        "a", "of", "to", "in", "which", "balance", "memory", "block", "turn"};
    static const char *const han[] = {"路由器", "按令牌", "放置请求", "缓存", "预填充", "解码", "延迟", "吞吐量"};
    size_t cap = tokens * 16 + 64, n = 0;
    char *s = malloc(cap);
    for (;;) {
        for (int k = 0; k < 64; k++) {
            const char *w = rnd(10) == 0 ? han[rnd(8)] : words[rnd(25)];
            n += (size_t)snprintf(s + n, cap - n, "%s%s", n ? " " : "", w);
            if (rnd(12) == 0)
                n += (size_t)snprintf(s + n, cap - n, "%s", rnd(2) ? "." : ", 42");
        }
        uint32_t *ids;
        size_t m;
        xtok_encode(t, s, n, 0, &ids, &m);
        free(ids);
        if (m >= tokens || n + 1024 > cap)
            return s;
    }
}

/* a new cache that has seen text (the previous turn's request; none at the first turn) */
static struct xtok_cache *filled(const struct xtok *t, const char *text, size_t len)
{
    struct xtok_cache *c = xtok_cache_new(64u << 20, 1);
    uint32_t *ids;
    size_t n;
    if (text && xtok_encode_cached(t, c, text, len, 0, &ids, &n) == 0)
        free(ids);
    return c;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: xpyd_chat_turns MODEL_DIR [turns=20] [growth=2000] [reps=5] [warm|cold]\n");
        return 2;
    }
    int turns = argc > 2 ? atoi(argv[2]) : 20, growth = argc > 3 ? atoi(argv[3]) : 2000;
    int reps = argc > 4 ? atoi(argv[4]) : 5, cold = argc > 5 && strcmp(argv[5], "cold") == 0;
    micro_rng = 88172645463325252ULL; /* the conversation's text, as before micro.h */
    char err[1024];
    struct xtok *t = xtok_load(argv[1], err, sizeof err);
    struct xtok_chat *chat = t ? xtok_chat_load(argv[1], NULL, err, sizeof err) : NULL;
    if (!chat) {
        fprintf(stderr, "xpyd_chat_turns: %s\n", err);
        return 1;
    }
    char *prev_prompt = NULL; /* the previous turn's rendered request: what the cache has seen */
    size_t prev_len = 0, hits = 0, misses = 0;
    cJSON *req = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(req, "messages");
    cJSON *sys = cJSON_CreateObject();
    cJSON_AddStringToObject(sys, "role", "system");
    cJSON_AddStringToObject(sys, "content", "You are a helpful assistant.");
    cJSON_AddItemToArray(msgs, sys);
    char *prev_answer = NULL;
    double worst = 0, worst_enc = 0; /* with the render, and the encoding alone */
    double *ratios = calloc((size_t)turns, sizeof *ratios), *encs = calloc((size_t)turns, sizeof *encs);
    int nr = 0;
    for (int turn = 1; turn <= turns; turn++) {
        char *user = text_of(t, (size_t)growth / 2), *answer = text_of(t, (size_t)growth / 2);
        cJSON *u = cJSON_CreateObject();
        cJSON_AddStringToObject(u, "role", "user");
        cJSON_AddStringToObject(u, "content", user);
        cJSON_AddItemToArray(msgs, u);
        /* the text this turn added: the previous answer (now history) and the new question */
        size_t nl = strlen(user) + (prev_answer ? strlen(prev_answer) : 0);
        char *added = malloc(nl + 2);
        snprintf(added, nl + 2, "%s%s", prev_answer ? prev_answer : "", user);
        double best_new = 1e9, best_cached = 1e9, best_full = 1e9, best_render = 1e9, best_enc = 1e9;
        size_t ntok = 0, prompt_bytes = 0;
        /* caches that have seen the conversation up to the previous turn (set up outside the timing); cold: all
         * of them first, the first `reps` used */
        struct xtok_cache **caches = calloc((size_t)(2 * reps), sizeof *caches);
        for (int r = 0; r < (cold ? 2 * reps : 0); r++)
            caches[r] = filled(t, prev_prompt, prev_len);
        for (int r = 0; r < reps; r++) {
            uint32_t *ids;
            size_t n;
            char *p;
            size_t pl;
            struct xtok_cache *cache = cold ? caches[r] : filled(t, prev_prompt, prev_len);
            double t0 = micro_cpu_s();
            xtok_encode(t, added, strlen(added), 0, &ids, &n); /* the baseline: the new text alone */
            double t1 = micro_cpu_s();
            free(ids);
            if (xtok_chat_render(chat, req, NULL, &p, &pl, err, sizeof err) != 0) {
                fprintf(stderr, "xpyd_chat_turns: %s\n", err);
                return 1;
            }
            double tr = micro_cpu_s();
            xtok_encode_cached(t, cache, p, pl, 0, &ids, &n); /* what the router does: render, then encode */
            double t2 = micro_cpu_s();
            best_render = tr - t1 < best_render ? tr - t1 : best_render;
            best_enc = t2 - tr < best_enc ? t2 - tr : best_enc;
            free(ids);
            free(p);
            xtok_chat_render(chat, req, NULL, &p, &pl, err, sizeof err);
            xtok_encode(t, p, pl, 0, &ids, &ntok); /* the same without a cache */
            double t3 = micro_cpu_s();
            free(ids);
            prompt_bytes = pl;
            if (r == reps - 1) {
                struct xtok_cache_stats st;
                xtok_cache_stats(cache, &st);
                hits += st.hits;
                misses += st.misses;
                free(prev_prompt);
                prev_prompt = p;
                prev_len = pl;
            } else {
                free(p);
            }
            if (!cold)
                xtok_cache_free(cache);
            best_new = t1 - t0 < best_new ? t1 - t0 : best_new;
            best_cached = t2 - t1 < best_cached ? t2 - t1 : best_cached;
            best_full = t3 - t2 < best_full ? t3 - t2 : best_full;
        }
        for (int r = 0; r < 2 * reps; r++)
            xtok_cache_free(caches[r]);
        free(caches);
        double ratio = best_cached / best_new, enc = best_enc / best_new;
        if (turn > 1 && ratio > worst)
            worst = ratio;
        if (turn > 1 && enc > worst_enc)
            worst_enc = enc;
        if (turn > 1) {
            ratios[nr] = ratio;
            encs[nr++] = enc;
        }
        printf("{\"turn\":%d,\"prompt_tokens\":%zu,\"prompt_bytes\":%zu,\"new_text_us\":%.1f,\"cached_us\":%.1f,"
               "\"render_us\":%.1f,\"uncached_us\":%.1f,\"cached_over_new\":%.3f,\"encode_over_new\":%.3f}\n",
               turn, ntok, prompt_bytes, best_new * 1e6, best_cached * 1e6, best_render * 1e6, best_full * 1e6, ratio,
               enc);
        /* the answer joins the conversation for the next turn (the cache saw this request's pieces) */
        cJSON *a = cJSON_CreateObject();
        cJSON_AddStringToObject(a, "role", "assistant");
        cJSON_AddStringToObject(a, "content", answer);
        cJSON_AddItemToArray(msgs, a);
        free(prev_answer);
        prev_answer = answer;
        free(user);
        free(added);
    }
    /* the last request's render and its encoding through a cache that holds all of it, each repeated (warm
     * caches: what the work costs without the rest of the turn around it), the best of 10 batches */
    double hot_render = 1e9, hot_enc = 1e9;
    struct xtok_cache *cache = xtok_cache_new(64u << 20, 1);
    uint32_t *ids;
    size_t n;
    xtok_encode_cached(t, cache, prev_prompt, prev_len, 0, &ids, &n);
    free(ids);
    for (int b = 0; b < 10; b++) {
        double t0 = micro_cpu_s();
        for (int i = 0; i < 100; i++) {
            char *p;
            size_t pl;
            xtok_chat_render(chat, req, NULL, &p, &pl, err, sizeof err);
            free(p);
        }
        double t1 = micro_cpu_s();
        for (int i = 0; i < 100; i++) {
            xtok_encode_cached(t, cache, prev_prompt, prev_len, 0, &ids, &n);
            free(ids);
        }
        double t2 = micro_cpu_s();
        hot_render = (t1 - t0) / 100 < hot_render ? (t1 - t0) / 100 : hot_render;
        hot_enc = (t2 - t1) / 100 < hot_enc ? (t2 - t1) / 100 : hot_enc;
    }
    xtok_cache_free(cache);
    printf("{\"summary\":true,\"caches\":\"%s\",\"turns\":%d,\"worst_cached_over_new\":%.3f,"
           "\"worst_encode_over_new\":%.3f,\"median_cached_over_new\":%.3f,\"median_encode_over_new\":%.3f,"
           "\"piece_hits\":%zu,\"piece_misses\":%zu,\"last_render_warm_us\":%.1f,"
           "\"last_cached_encode_warm_us\":%.1f}\n",
           cold ? "cold" : "warm", turns, worst, worst_enc, median(ratios, nr), median(encs, nr), hits, misses,
           hot_render * 1e6, hot_enc * 1e6);
    free(ratios);
    free(encs);
    free(prev_prompt);
    free(prev_answer);
    cJSON_Delete(req);
    xtok_chat_free(chat);
    xtok_free(t);
    return 0;
}
