/* SPDX-License-Identifier: Apache-2.0 */
/* bench_workload.c - what xpyd_bench sends: lengths (uniform within --random-range-ratio, or Pareto), arrivals
 * (Poisson or gamma with --burstiness), prompts of real words or token ids, prefix repetition, multi-turn
 * history, and each request's body (see bench.h). */
#include "bench.h"

#include "xpyd_util.h"

#include <event2/buffer.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

double bench_urand(void)
{
    rng = xpyd_mix64(rng);
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* Gamma(shape, scale) by Marsaglia-Tsang; shape 1 is the exponential (Poisson arrivals). */
double bench_gamma(double shape, double scale)
{
    if (shape < 1)
        return bench_gamma(shape + 1, scale) * pow(bench_urand(), 1.0 / shape);
    double d = shape - 1.0 / 3, c = 1 / sqrt(9 * d);
    for (;;) {
        double x, v;
        do {
            double u1 = bench_urand(), u2 = bench_urand();
            x = sqrt(-2 * log(u1 + 1e-300)) * cos(2 * M_PI * u2);
            v = 1 + c * x;
        } while (v <= 0);
        v = v * v * v;
        double u = bench_urand();
        if (log(u + 1e-300) < 0.5 * x * x + d - d * v + d * log(v))
            return d * v * scale;
    }
}

int bench_rand_len(int mean)
{
    if (O.pareto) {
        const double alpha = 1.5;
        double xm = mean * (alpha - 1) / alpha, v = xm / pow(1 - bench_urand(), 1 / alpha);
        if (v > 10.0 * mean)
            v = 10.0 * mean;
        return v < 1 ? 1 : (int)v;
    }
    int lo = (int)(mean * (1 - O.range_ratio)), hi = (int)(mean * (1 + O.range_ratio));
    if (lo < 1)
        lo = 1;
    if (hi < lo)
        hi = lo;
    return lo + (int)(bench_urand() * (hi - lo + 1));
}

/* Common English words that are one token each, with or without the leading space, in the BPE vocabularies
 * real models use (OpenAI cl100k_base and o200k_base, hence Llama 3 and Qwen, whose vocabularies extend
 * them): a prompt of N of them joined by spaces is N tokens there, as it is on xpyd_sim (checked against
 * both encodings by tests/blackbox/test_bench.py when the tokenizer package is installed). */
static const char *const prompt_words[] = {
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at", "from", "his", "an",
    "be", "this", "are", "or", "but", "not", "had", "were", "they", "which", "have", "one", "you", "all", "we",
    "can", "her", "has", "there", "been", "if", "more", "when", "will", "would", "who", "so", "no", "out", "up",
    "into", "do", "than", "its", "only", "other", "new", "some", "could", "time", "these", "two", "may", "first",
    "then", "any", "like", "my", "now", "over", "such", "our", "man", "me", "even", "most", "made", "after", "also",
    "did", "many", "before", "must", "through", "back", "years", "where", "much", "your", "way", "well", "down",
    "should", "because", "each", "just", "those", "people", "how", "too", "little", "state", "good", "very", "make",
    "world", "still", "own", "see", "men", "work", "long", "get", "here", "between", "both", "life", "being",
    "under", "never", "day", "same", "another", "know", "while", "last", "might", "us", "great", "old", "year",
    "off", "come", "since", "against", "go", "came", "right", "used", "take", "three", "house", "place", "water",
    "small", "found", "part", "city", "home", "light", "hand", "high", "school", "every", "end", "few", "game",
    "line", "name", "side", "point", "form", "child", "head", "group", "fact", "night", "word", "river", "music",
    "story", "money", "table", "field", "power", "order", "paper", "market", "plan", "color", "stone", "window",
    "letter", "summer", "winter", "spring", "doctor", "teacher", "mother", "father", "family", "friend", "number",
    "system", "program", "question", "government", "company", "problem", "service", "area", "country", "week",
    "case",
};
#define N_PROMPT_WORDS (sizeof prompt_words / sizeof prompt_words[0])

/* a C string into an evbuffer (evbuffer_add_printf("%s") of a 20 KB prompt was most of the load generator's CPU) */
static void add_str(struct evbuffer *b, const char *s)
{
    evbuffer_add(b, s, strlen(s));
}

static void add_words(struct evbuffer *p, int n, int lead_space)
{
    for (int k = 0; k < n; k++)
        evbuffer_add_printf(p, "%s%s", k || lead_space ? " " : "", prompt_words[(size_t)(bench_urand() * N_PROMPT_WORDS) % N_PROMPT_WORDS]);
}

/* --dataset-name prefix-repetition (vLLM's PrefixRepetitionRandomDataset): num_prefixes shared prefixes of
 * prefix_len tokens, each request one of them (in a shuffled order, each used equally often) plus a random
 * suffix of suffix_len tokens. */
static char **pr_prefixes;
static int *pr_order;

void bench_prefix_init(void)
{
    pr_prefixes = XPYD_XALLOC(calloc((size_t)O.pr_num_prefixes, sizeof *pr_prefixes));
    uint64_t saved = rng;
    if (O.pr_prefix_seed)
        rng = xpyd_mix64(O.pr_prefix_seed);
    for (int i = 0; i < O.pr_num_prefixes; i++) {
        struct evbuffer *p = evbuffer_new();
        if (O.token_ids) /* --tokenizer-free: the prefix as ids, "a,b,c" */
            for (int k = 0; k < O.pr_prefix_len; k++)
                evbuffer_add_printf(p, "%s%d", k ? "," : "", 1000 + (int)(bench_urand() * 29000));
        else
            add_words(p, O.pr_prefix_len, 0);
        size_t n = evbuffer_get_length(p);
        pr_prefixes[i] = XPYD_XALLOC(malloc(n + 1));
        evbuffer_remove(p, pr_prefixes[i], n);
        pr_prefixes[i][n] = 0;
        evbuffer_free(p);
    }
    if (O.pr_prefix_seed)
        rng = saved; /* the order and the suffixes from --seed */
    pr_order = XPYD_XALLOC(calloc((size_t)O.num_prompts, sizeof *pr_order));
    for (int i = 0; i < O.num_prompts; i++)
        pr_order[i] = i % O.pr_num_prefixes;
    for (int i = O.num_prompts - 1; i > 0; i--) { /* Fisher-Yates */
        int j = (int)(bench_urand() * (i + 1)) % (i + 1), t = pr_order[i];
        pr_order[i] = pr_order[j];
        pr_order[j] = t;
    }
}

void bench_make_prompt(struct req *r)
{
    struct evbuffer *p = evbuffer_new();
    if (O.prefix_rep && O.token_ids) {
        evbuffer_add(p, "[", 1);
        add_str(p, pr_prefixes[pr_order[r->i]]);
        for (int k = 0; k < O.pr_suffix_len; k++)
            evbuffer_add_printf(p, "%s%d", k || O.pr_prefix_len > 0 ? "," : "", 1000 + (int)(bench_urand() * 29000));
        evbuffer_add(p, "]", 1);
    } else if (O.prefix_rep) {
        add_str(p, pr_prefixes[pr_order[r->i]]);
        add_words(p, O.pr_suffix_len, O.pr_prefix_len > 0);
    } else if (O.token_ids) { /* --tokenizer-free: token ids, exactly in_len tokens on any engine */
        evbuffer_add(p, "[", 1);
        for (int k = 0; k < r->in_len; k++)
            evbuffer_add_printf(p, "%s%d", k ? "," : "", 1000 + (int)(bench_urand() * 29000));
        evbuffer_add(p, "]", 1);
    } else {
        for (int k = 0; k < r->in_len; k++)
            evbuffer_add_printf(p, "%s%s", k ? " " : "", prompt_words[(size_t)(bench_urand() * N_PROMPT_WORDS) % N_PROMPT_WORDS]);
    }
    size_t n = evbuffer_get_length(p);
    r->prompt = XPYD_XALLOC(malloc(n + 1));
    evbuffer_remove(p, r->prompt, n);
    r->prompt[n] = '\0';
    evbuffer_free(p);
}

/* The request body; prefill=1 builds the kv-params prefill leg of the direct baseline, kv (may be NULL)
 * is the prefill's kv_transfer_params for the decode leg. */
static void add_message(cJSON *msgs, const char *role, const char *content)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", content);
    cJSON_AddItemToArray(msgs, m);
}

/* A request's text: with --multi-turn, its conversation's earlier turns (prompt, then the answer received)
 * come first, as a chat client re-sends its history. */
static char *history_text(const struct req *r)
{
    struct evbuffer *b = evbuffer_new();
    for (int k = r->i - r->i % (O.multi_turn ? O.multi_turn : 1); k < r->i; k++) {
        add_str(b, reqs[k].prompt);
        evbuffer_add_buffer_reference(b, reqs[k].text); /* generated texts start with a space */
        evbuffer_add(b, " ", 1);
    }
    add_str(b, r->prompt);
    size_t n = evbuffer_get_length(b);
    char *s = XPYD_XALLOC(malloc(n + 1));
    evbuffer_remove(b, s, n);
    s[n] = 0;
    evbuffer_free(b);
    return s;
}

char *bench_make_body(struct req *r, int prefill, const cJSON *kv)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", O.model);
    if (O.chat) {
        cJSON *msgs = cJSON_AddArrayToObject(o, "messages");
        for (int k = O.multi_turn ? r->i - r->i % O.multi_turn : r->i; k < r->i; k++) {
            add_message(msgs, "user", reqs[k].prompt);
            size_t tl = evbuffer_get_length(reqs[k].text);
            char *tx = XPYD_XALLOC(malloc(tl + 1));
            evbuffer_copyout(reqs[k].text, tx, tl);
            tx[tl] = 0;
            add_message(msgs, "assistant", tx);
            free(tx);
        }
        add_message(msgs, "user", r->prompt);
        cJSON_AddNumberToObject(o, "max_completion_tokens", prefill ? 1 : r->out_len);
    } else {
        if (O.token_ids) /* our own "[a,b,...]": spliced as is (a parse and print of every id cost the load
                          * generator ~40 % of its CPU with 4,000-id prompts, sprintf/sscanf per number) */
            XPYD_XALLOC(cJSON_AddRawToObject(o, "prompt", r->prompt));
        else if (O.multi_turn) {
            char *h = history_text(r);
            cJSON_AddStringToObject(o, "prompt", h);
            free(h);
        } else
            cJSON_AddStringToObject(o, "prompt", r->prompt);
        cJSON_AddNumberToObject(o, "max_tokens", prefill ? 1 : r->out_len);
    }
    if (prefill) {
        cJSON_AddFalseToObject(o, "stream");
        cJSON_AddItemToObject(o, "kv_transfer_params", cJSON_Parse("{\"do_remote_decode\":true,"
                                                                   "\"do_remote_prefill\":false}"));
    } else {
        cJSON_AddTrueToObject(o, "stream");
        cJSON_AddItemToObject(o, "stream_options", cJSON_Parse("{\"include_usage\":true}"));
        if (kv)
            cJSON_AddItemToObject(o, "kv_transfer_params", cJSON_Duplicate(kv, 1));
    }
    if (O.multi_turn) { /* OpenAI's end-user id: one per conversation (what --session-key body:user keys on) */
        char u[32];
        snprintf(u, sizeof u, "conv-%d", r->i / O.multi_turn);
        cJSON_AddStringToObject(o, "user", u);
    }
    cJSON_AddNumberToObject(o, "temperature", 0);
    if (O.ignore_eos)
        cJSON_AddTrueToObject(o, "ignore_eos");
    char *s = XPYD_XALLOC(cJSON_PrintUnformatted(o));
    cJSON_Delete(o);
    return s;
}
