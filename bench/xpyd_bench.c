/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_bench.c - a C load generator with vLLM benchmark_serving.py's workflow, flags, metrics and result
 * table: random prompts, Poisson/gamma arrivals, a concurrency cap, TTFT/TPOT/ITL/E2EL percentiles.
 *
 * Metrics follow benchmark_serving: TTFT = first SSE event carrying choices; ITL = gaps between such
 * events; output length = the usage event's completion_tokens (else the number of content events);
 * TPOT = (E2EL - TTFT) / (output tokens - 1). Failed requests are counted with their error. */
#include "xpyd_http_client.h"
#include "xpyd_tls.h"
#include "xpyd_sse.h"
#include "xpyd_util.h"
#include "xpyd_version.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct opts {
    char host[256];
    int port;
    char endpoint[256];
    int chat;
    char model[256];
    int num_prompts;
    int input_len, output_len;
    double range_ratio;
    double rate; /* requests/s, 0 = inf */
    double burstiness;
    int max_concurrency; /* 0 = unlimited */
    int ignore_eos;
    uint64_t seed;
    char percentile_metrics[128];
    char metric_percentiles[128];
    int save_result;
    char result_filename[512];
    int disable_tqdm;
    long timeout_ms;
    int pareto;               /* --length-dist pareto: heavy-tailed lengths (shape 1.5, mean kept, cap 10x) */
    int token_ids;            /* --tokenizer-free: prompts as token-id arrays (completions only) */
    double slo_ttft_ms, slo_tpot_ms, slo_e2el_ms; /* --goodput: 0 = not part of the SLO */
    int goodput;
    char direct_prefill[300]; /* HOST:PORT: do the kv-params P->D sequence from the client (baseline) */
    int prefix_rep;           /* --dataset-name prefix-repetition */
    int pr_prefix_len, pr_suffix_len, pr_num_prefixes, pr_output_len;
    int multi_turn;           /* --multi-turn N: conversations of N turns, each re-sending its history */
    int tls;                  /* --base-url https://...: TLS to the server */
    char tls_ca[512];         /* --tls-ca FILE: the CA the server's certificate is checked against ("" system) */
    char dp_host[256];
    int dp_port;
};

struct req {
    int i;
    int in_len, out_len;
    uint64_t t_start, t_last;
    double ttft;         /* s, <0 until the first token */
    double *itl;         /* s, owned */
    size_t n_itl, cap_itl;
    long out_tokens;     /* from usage, else counted */
    long in_tokens;      /* the server's usage.prompt_tokens, -1 when it sent none */
    struct evbuffer *text; /* generated text (result file: generated_texts) */
    long counted;
    int status;
    int done_seen;
    int ok;
    double e2el;
    char err[200];
    struct xpyd_sse_parser sse;
    struct evbuffer *errbody;
    struct up_leg *leg;
    char *prompt;        /* owned: the text (or token ids) of this request's new user turn */
    struct evbuffer *pbody; /* direct mode: the prefill's answer */
    long cached_tokens;  /* usage.prompt_tokens_details.cached_tokens, -1 when the server sent none */
    int sent;
};

static struct opts O;
static struct event_base *base;
static struct up_thread *up;
static struct req *reqs;
static int next_to_send, in_flight, finished;
static uint64_t rng, t0, t_end;
static struct event *arrival_ev;

static double urand(void)
{
    rng = xpyd_mix64(rng);
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* Gamma(shape, scale) by Marsaglia-Tsang; shape 1 is the exponential (Poisson arrivals). */
static double gamma_sample(double shape, double scale)
{
    if (shape < 1)
        return gamma_sample(shape + 1, scale) * pow(urand(), 1.0 / shape);
    double d = shape - 1.0 / 3, c = 1 / sqrt(9 * d);
    for (;;) {
        double x, v;
        do {
            double u1 = urand(), u2 = urand();
            x = sqrt(-2 * log(u1 + 1e-300)) * cos(2 * M_PI * u2);
            v = 1 + c * x;
        } while (v <= 0);
        v = v * v * v;
        double u = urand();
        if (log(u + 1e-300) < 0.5 * x * x + d - d * v + d * log(v))
            return d * v * scale;
    }
}

static int rand_len(int mean)
{
    if (O.pareto) {
        const double alpha = 1.5;
        double xm = mean * (alpha - 1) / alpha, v = xm / pow(1 - urand(), 1 / alpha);
        if (v > 10.0 * mean)
            v = 10.0 * mean;
        return v < 1 ? 1 : (int)v;
    }
    int lo = (int)(mean * (1 - O.range_ratio)), hi = (int)(mean * (1 + O.range_ratio));
    if (lo < 1)
        lo = 1;
    if (hi < lo)
        hi = lo;
    return lo + (int)(urand() * (hi - lo + 1));
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

static void add_words(struct evbuffer *p, int n, int lead_space)
{
    for (int k = 0; k < n; k++)
        evbuffer_add_printf(p, "%s%s", k || lead_space ? " " : "", prompt_words[(size_t)(urand() * N_PROMPT_WORDS) % N_PROMPT_WORDS]);
}

/* --dataset-name prefix-repetition (vLLM's PrefixRepetitionRandomDataset): num_prefixes shared prefixes of
 * prefix_len tokens, each request one of them (in a shuffled order, each used equally often) plus a random
 * suffix of suffix_len tokens. */
static char **pr_prefixes;
static int *pr_order;

static void prefix_rep_init(void)
{
    pr_prefixes = XPYD_XALLOC(calloc((size_t)O.pr_num_prefixes, sizeof *pr_prefixes));
    for (int i = 0; i < O.pr_num_prefixes; i++) {
        struct evbuffer *p = evbuffer_new();
        add_words(p, O.pr_prefix_len, 0);
        size_t n = evbuffer_get_length(p);
        pr_prefixes[i] = XPYD_XALLOC(malloc(n + 1));
        evbuffer_remove(p, pr_prefixes[i], n);
        pr_prefixes[i][n] = 0;
        evbuffer_free(p);
    }
    pr_order = XPYD_XALLOC(calloc((size_t)O.num_prompts, sizeof *pr_order));
    for (int i = 0; i < O.num_prompts; i++)
        pr_order[i] = i % O.pr_num_prefixes;
    for (int i = O.num_prompts - 1; i > 0; i--) { /* Fisher-Yates */
        int j = (int)(urand() * (i + 1)) % (i + 1), t = pr_order[i];
        pr_order[i] = pr_order[j];
        pr_order[j] = t;
    }
}

static void make_prompt(struct req *r)
{
    struct evbuffer *p = evbuffer_new();
    if (O.prefix_rep) {
        evbuffer_add_printf(p, "%s", pr_prefixes[pr_order[r->i]]);
        add_words(p, O.pr_suffix_len, O.pr_prefix_len > 0);
    } else if (O.token_ids) { /* --tokenizer-free: token ids, exactly in_len tokens on any engine */
        evbuffer_add(p, "[", 1);
        for (int k = 0; k < r->in_len; k++)
            evbuffer_add_printf(p, "%s%d", k ? "," : "", 1000 + (int)(urand() * 29000));
        evbuffer_add(p, "]", 1);
    } else {
        for (int k = 0; k < r->in_len; k++)
            evbuffer_add_printf(p, "%s%s", k ? " " : "", prompt_words[(size_t)(urand() * N_PROMPT_WORDS) % N_PROMPT_WORDS]);
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
        evbuffer_add_printf(b, "%s", reqs[k].prompt);
        evbuffer_add_buffer_reference(b, reqs[k].text); /* generated texts start with a space */
        evbuffer_add(b, " ", 1);
    }
    evbuffer_add_printf(b, "%s", r->prompt);
    size_t n = evbuffer_get_length(b);
    char *s = XPYD_XALLOC(malloc(n + 1));
    evbuffer_remove(b, s, n);
    s[n] = 0;
    evbuffer_free(b);
    return s;
}

static char *make_body(struct req *r, int prefill, const cJSON *kv)
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
        if (O.token_ids)
            cJSON_AddItemToObject(o, "prompt", XPYD_XALLOC(cJSON_Parse(r->prompt)));
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

static int on_event(void *arg, const char *data, size_t len, const char *raw, size_t rawlen)
{
    struct req *r = arg;
    if (strcmp(data, "[DONE]") == 0) {
        r->done_seen = 1;
        return 0;
    }
    cJSON *o = cJSON_ParseWithLength(data, len);
    if (!o)
        return 0;
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(o, "error");
    if (cJSON_IsObject(err)) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(err, "message");
        snprintf(r->err, sizeof r->err, "stream error: %.170s", cJSON_IsString(m) ? m->valuestring : "?");
    }
    /* PROTOCOLS.md §3, as benchmark_serving: TTFT at the first event carrying choices (a chat role chunk
     * counts), ITL between such events; the output length comes from the usage event. */
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0);
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(ch, "text");
    if (!cJSON_IsString(text))
        text = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(ch, "delta"), "content");
    if (ch) {
        uint64_t now = xpyd_now_us();
        if (r->ttft < 0)
            r->ttft = (double)(now - r->t_start) / 1e6;
        else {
            if (r->n_itl == r->cap_itl) {
                r->cap_itl = r->cap_itl ? r->cap_itl * 2 : 64;
                r->itl = XPYD_XALLOC(realloc(r->itl, r->cap_itl * sizeof *r->itl));
            }
            r->itl[r->n_itl++] = (double)(now - r->t_last) / 1e6;
        }
        r->t_last = now;
        if (cJSON_IsString(text) && text->valuestring[0])
            r->counted++; /* fallback output length when no usage event came */
    }
    if (cJSON_IsString(text) && text->valuestring[0] && r->text && evbuffer_get_length(r->text) < (1u << 20))
        evbuffer_add(r->text, text->valuestring, strlen(text->valuestring));
    const cJSON *usage = cJSON_GetObjectItemCaseSensitive(o, "usage");
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(usage, "completion_tokens");
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens");
    if (cJSON_IsNumber(ct))
        r->out_tokens = (long)ct->valuedouble;
    if (cJSON_IsNumber(pt))
        r->in_tokens = (long)pt->valuedouble; /* what the server counted, not what was asked for */
    const cJSON *cached = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens_details"), "cached_tokens");
    if (cJSON_IsNumber(cached))
        r->cached_tokens = (long)cached->valuedouble; /* the engine's prefix-cache hit */
    cJSON_Delete(o);
    return 0;
}

static void schedule_arrivals(void);

static void on_head(struct up_leg *leg, int status, void *arg)
{
    ((struct req *)arg)->status = status;
}

static void on_body(struct up_leg *leg, const char *data, size_t len, void *arg)
{
    struct req *r = arg;
    if (r->status == 200)
        xpyd_sse_feed(&r->sse, data, len, on_event, r);
    else if (evbuffer_get_length(r->errbody) < 4096)
        evbuffer_add(r->errbody, data, len);
}

static void progress(void)
{
    if (O.disable_tqdm || !isatty(2))
        return;
    int w = 40, f = O.num_prompts ? finished * w / O.num_prompts : w;
    fprintf(stderr, "\r[%.*s%*s] %d/%d", f, "########################################", w - f, "", finished,
            O.num_prompts);
    if (finished == O.num_prompts)
        fputc('\n', stderr);
}

static void on_done(struct up_leg *leg, int err, void *arg)
{
    struct req *r = arg;
    r->leg = NULL;
    r->e2el = (double)(xpyd_now_us() - r->t_start) / 1e6;
    if (err)
        snprintf(r->err, sizeof r->err, "connection error: %s", strerror(-err));
    else if (r->status != 200) {
        size_t n = evbuffer_get_length(r->errbody);
        snprintf(r->err, sizeof r->err, "HTTP %d: %.*s", r->status, (int)(n > 150 ? 150 : n),
                 n ? (const char *)evbuffer_pullup(r->errbody, -1) : "");
    } else if (!r->done_seen && !r->err[0])
        snprintf(r->err, sizeof r->err, "stream ended without [DONE]");
    else if (r->ttft < 0 && !r->err[0])
        snprintf(r->err, sizeof r->err, "no token received");
    r->ok = !r->err[0];
    if (r->out_tokens < 0)
        r->out_tokens = r->counted;
    xpyd_sse_reset(&r->sse);
    in_flight--;
    finished++;
    progress();
    if (finished == O.num_prompts) {
        t_end = xpyd_now_us();
        event_base_loopexit(base, NULL);
        return;
    }
    if (O.rate <= 0 || O.multi_turn) /* a finished turn may free its conversation's next one */
        schedule_arrivals();
}

static struct up_endpoint endpoints[2]; /* [0] --host/--port, [1] --direct-prefill */

static void send_leg(struct req *r, int ep, const char *body, const struct up_leg_cbs *cbs)
{
    struct evbuffer *b = evbuffer_new();
    up_request_line(b, &endpoints[ep], "POST", O.endpoint);
    evbuffer_add_printf(b, "Content-Type: application/json\r\nAuthorization: Bearer xpyd-bench\r\n"
                           "X-Request-Id: bench-%d-%llu\r\nContent-Length: %zu\r\n\r\n%s",
                        r->i, (unsigned long long)t0, strlen(body), body);
    struct up_timeouts to = {O.timeout_ms, O.timeout_ms, O.timeout_ms};
    r->leg = up_leg_start(up, ep, b, &to, cbs, r);
    evbuffer_free(b);
}

static void pre_head(struct up_leg *leg, int status, void *arg)
{
    ((struct req *)arg)->status = status;
}

static void pre_body(struct up_leg *leg, const char *data, size_t len, void *arg)
{
    struct req *r = arg;
    if (evbuffer_get_length(r->pbody) < (16u << 20))
        evbuffer_add(r->pbody, data, len);
}

/* Direct baseline: the prefill answered; send the decode leg with its kv_transfer_params. */
static void pre_done(struct up_leg *leg, int err, void *arg)
{
    struct req *r = arg;
    r->leg = NULL;
    if (err || r->status != 200) {
        evbuffer_add_buffer(r->errbody, r->pbody);
        on_done(NULL, err, r);
        return;
    }
    size_t n = evbuffer_get_length(r->pbody);
    cJSON *j = cJSON_ParseWithLength((const char *)evbuffer_pullup(r->pbody, -1), n);
    char *body = make_body(r, 0, cJSON_GetObjectItemCaseSensitive(j, "kv_transfer_params"));
    cJSON_Delete(j);
    r->status = 0;
    static const struct up_leg_cbs cbs = {on_head, on_body, on_done, NULL, NULL, NULL};
    send_leg(r, 0, body, &cbs);
    free(body);
}

/* The next request that may go now: in order, except that with --multi-turn a turn waits for its
 * conversation's previous one to finish (its answer is part of the history). NULL: none may go yet. */
static struct req *next_ready(void)
{
    if (!O.multi_turn)
        return next_to_send < O.num_prompts ? &reqs[next_to_send] : NULL;
    for (int i = 0; i < O.num_prompts; i++) {
        struct req *r = &reqs[i];
        if (r->sent)
            continue;
        if (r->i % O.multi_turn == 0 || reqs[r->i - 1].e2el > 0)
            return r;
        i += O.multi_turn - 1 - r->i % O.multi_turn; /* this conversation waits: skip its other turns */
    }
    return NULL;
}

static void send_one(void)
{
    struct req *r = next_ready();
    next_to_send++;
    r->sent = 1;
    make_prompt(r);
    r->t_start = xpyd_now_us();
    in_flight++;
    if (O.direct_prefill[0]) {
        char *body = make_body(r, 1, NULL);
        r->pbody = XPYD_XALLOC(evbuffer_new());
        static const struct up_leg_cbs pcbs = {pre_head, pre_body, pre_done, NULL, NULL, NULL};
        send_leg(r, 1, body, &pcbs);
        free(body);
        return;
    }
    char *body = make_body(r, 0, NULL);
    static const struct up_leg_cbs cbs = {on_head, on_body, on_done, NULL, NULL, NULL};
    send_leg(r, 0, body, &cbs);
    free(body);
}

static void on_arrival(evutil_socket_t fd, short ev, void *arg)
{
    schedule_arrivals();
}

/* Sends what the rate and the concurrency cap allow now, and arms the timer for the next arrival. */
static void schedule_arrivals(void)
{
    while (next_to_send < O.num_prompts && (O.max_concurrency <= 0 || in_flight < O.max_concurrency) && next_ready()) {
        if (O.rate > 0) {
            static uint64_t due;
            if (!due)
                due = xpyd_now_us();
            uint64_t now = xpyd_now_us();
            if (now < due) {
                struct timeval tv = {(time_t)((due - now) / 1000000), (suseconds_t)((due - now) % 1000000)};
                event_add(arrival_ev, &tv);
                return;
            }
            send_one();
            due += (uint64_t)(gamma_sample(O.burstiness, 1.0 / (O.rate * O.burstiness)) * 1e6);
        } else {
            send_one();
        }
    }
    if (O.rate > 0 && next_to_send < O.num_prompts) { /* capped by concurrency: look again shortly */
        struct timeval tv = {0, 1000};
        event_add(arrival_ev, &tv);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p)
{
    if (!n)
        return 0;
    double k = (double)(n - 1) * p / 100.0; /* linear interpolation, as numpy.percentile */
    size_t f = (size_t)k;
    size_t c = f + 1 < n ? f + 1 : f;
    return v[f] + (v[c] - v[f]) * (k - (double)f);
}

static void usage(FILE *f)
{
    fputs("usage: xpyd_bench [options]   (the flags of vLLM's benchmark_serving.py)\n"
          "  --host H (127.0.0.1) --port N (8000) --base-url http://H:P --endpoint PATH (/v1/completions)\n"
          "  --backend openai|openai-chat|vllm (openai) --model NAME (sim-model)\n"
          "  --num-prompts N (100) --random-input-len N (128) --random-output-len N (128) --random-range-ratio R (0)\n"
          "  --request-rate R (inf) --burstiness B (1.0 = Poisson) --max-concurrency N (unlimited) --ignore-eos\n"
          "  --seed N (0) --percentile-metrics ttft,tpot,itl,e2el (ttft,tpot,itl) --metric-percentiles 50,90,99 (99)\n"
          "  --save-result --result-filename F --disable-tqdm --timeout-ms N (600000, per request)\n"
          "  --length-dist uniform|pareto (uniform: range ratio; pareto: heavy tail, shape 1.5, same mean, cap 10x)\n"
          "  --tokenizer-free             prompts as token-id arrays (exactly --random-input-len tokens on any\n"
          "                               engine; completions backends only). Default: words that are one token\n"
          "                               each in cl100k/o200k-family vocabularies (and on xpyd_sim)\n"
          "  --goodput KEY:MS ...         SLOs (ttft, tpot, e2el in ms) for request_goodput, as benchmark_serving\n"
          "  --dataset-name random|prefix-repetition   prefix-repetition (vLLM's): --prefix-repetition-prefix-len N\n"
          "                               (256) --prefix-repetition-suffix-len N (256) --prefix-repetition-num-prefixes\n"
          "                               N (10) --prefix-repetition-output-len N (128); each request is one of the\n"
          "                               shared prefixes (each used equally often, shuffled) + a random suffix\n"
          "  --multi-turn N               conversations of N turns: turn t re-sends the conversation's earlier\n"
          "                               prompts and the answers received (chat: as messages), and goes once turn\n"
          "                               t-1 finished; --num-prompts counts turns. Both report the prefix-cache\n"
          "                               hit rate from usage.prompt_tokens_details.cached_tokens\n"
          "  --base-url https://H:P       HTTPS (keep-alive connections, sessions resumed); --tls-ca FILE: the CA the\n"
          "                               server's certificate is checked against (default: the system store)\n"
          "  --direct-prefill HOST:PORT   baseline without a router: the client sends the kv-params prefill leg there,\n"
          "                               then the decode leg (with the returned kv_transfer_params) to --host/--port\n"
          "  -h, --help                   this text\n"
          "  --version                    version and git revision\n",
          f);
}

/* One --goodput value: KEY:MS (ttft, tpot, e2el), several separated by commas. 0 or 1 (bad). */
static int goodput_arg(const char *a)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", a);
    for (char *sp = NULL, *t = strtok_r(buf, ",", &sp); t; t = strtok_r(NULL, ",", &sp)) {
        char *c = strchr(t, ':');
        double ms;
        if (!c || xpyd_parse_double(c + 1, 0, 1e9, &ms) != 0)
            return 1;
        *c = 0;
        if (!strcmp(t, "ttft"))
            O.slo_ttft_ms = ms;
        else if (!strcmp(t, "tpot"))
            O.slo_tpot_ms = ms;
        else if (!strcmp(t, "e2el"))
            O.slo_e2el_ms = ms;
        else
            return 1;
        O.goodput = 1;
    }
    return 0;
}

static int parse(int argc, char **argv)
{
    snprintf(O.host, sizeof O.host, "127.0.0.1");
    O.port = 8000;
    snprintf(O.endpoint, sizeof O.endpoint, "/v1/completions");
    snprintf(O.model, sizeof O.model, "sim-model");
    O.num_prompts = 100;
    O.input_len = O.output_len = 128;
    O.pr_prefix_len = O.pr_suffix_len = 256;
    O.pr_num_prefixes = 10;
    O.pr_output_len = 128;
    O.burstiness = 1.0;
    O.timeout_ms = 600000;
    snprintf(O.percentile_metrics, sizeof O.percentile_metrics, "ttft,tpot,itl");
    snprintf(O.metric_percentiles, sizeof O.metric_percentiles, "99");
    static const struct option lo[] = {
        {"host", 1, 0, 1}, {"port", 1, 0, 2}, {"base-url", 1, 0, 3}, {"endpoint", 1, 0, 4}, {"backend", 1, 0, 5},
        {"model", 1, 0, 6}, {"num-prompts", 1, 0, 7}, {"random-input-len", 1, 0, 8}, {"random-output-len", 1, 0, 9},
        {"random-range-ratio", 1, 0, 10}, {"request-rate", 1, 0, 11}, {"burstiness", 1, 0, 12},
        {"max-concurrency", 1, 0, 13}, {"ignore-eos", 0, 0, 14}, {"seed", 1, 0, 15},
        {"percentile-metrics", 1, 0, 16}, {"metric-percentiles", 1, 0, 17}, {"save-result", 0, 0, 18},
        {"result-filename", 1, 0, 19}, {"disable-tqdm", 0, 0, 20}, {"timeout-ms", 1, 0, 21},
        {"dataset-name", 1, 0, 22}, {"direct-prefill", 1, 0, 23}, {"length-dist", 1, 0, 24},
        {"tokenizer-free", 0, 0, 25}, {"goodput", 1, 0, 26}, {"prefix-repetition-prefix-len", 1, 0, 27},
        {"prefix-repetition-suffix-len", 1, 0, 28}, {"prefix-repetition-num-prefixes", 1, 0, 29},
        {"prefix-repetition-output-len", 1, 0, 30}, {"multi-turn", 1, 0, 31}, {"tls-ca", 1, 0, 32},
        {"help", 0, 0, 'h'}, {"version", 0, 0, 'V'}, {0, 0, 0, 0}};
    int o;
    long v;
    while ((o = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        const char *a = optarg;
        int bad = 0;
        switch (o) {
        case 1: snprintf(O.host, sizeof O.host, "%s", a); break;
        case 2: bad = xpyd_parse_long(a, 1, 65535, &v); O.port = (int)v; break;
        case 3: {
            O.tls = !strncmp(a, "https://", 8);
            const char *h = strstr(a, "://");
            h = h ? h + 3 : a;
            char hp[300];
            snprintf(hp, sizeof hp, "%s", h);
            char *slash = strchr(hp, '/');
            if (slash)
                *slash = '\0';
            bad = xpyd_parse_hostport(hp, O.host, sizeof O.host, &O.port);
            break;
        }
        case 4: snprintf(O.endpoint, sizeof O.endpoint, "%s", a); break;
        case 5:
            if (!strcmp(a, "openai-chat"))
                O.chat = 1;
            else if (strcmp(a, "openai") && strcmp(a, "vllm"))
                bad = 1;
            break;
        case 6: snprintf(O.model, sizeof O.model, "%s", a); break;
        case 7: bad = xpyd_parse_long(a, 1, 10000000, &v); O.num_prompts = (int)v; break;
        case 8: bad = xpyd_parse_long(a, 1, 1000000, &v); O.input_len = (int)v; break;
        case 9: bad = xpyd_parse_long(a, 1, 1000000, &v); O.output_len = (int)v; break;
        case 10: bad = xpyd_parse_double(a, 0, 1, &O.range_ratio); break;
        case 11: O.rate = !strcmp(a, "inf") ? 0 : (bad = xpyd_parse_double(a, 1e-6, 1e9, &O.rate), O.rate); break;
        case 12: bad = xpyd_parse_double(a, 1e-3, 1e3, &O.burstiness); break;
        case 13: bad = xpyd_parse_long(a, 1, 10000000, &v); O.max_concurrency = (int)v; break;
        case 14: O.ignore_eos = 1; break;
        case 15: bad = xpyd_parse_long(a, 0, 0x7fffffffffffffffL, &v); O.seed = (uint64_t)v; break;
        case 16: snprintf(O.percentile_metrics, sizeof O.percentile_metrics, "%s", a); break;
        case 17: snprintf(O.metric_percentiles, sizeof O.metric_percentiles, "%s", a); break;
        case 18: O.save_result = 1; break;
        case 19: snprintf(O.result_filename, sizeof O.result_filename, "%s", a); break;
        case 20: O.disable_tqdm = 1; break;
        case 21: bad = xpyd_parse_long(a, 1, 86400000, &O.timeout_ms); break;
        case 22:
            O.prefix_rep = !strcmp(a, "prefix-repetition");
            bad = !O.prefix_rep && strcmp(a, "random") != 0;
            break;
        case 27: bad = xpyd_parse_long(a, 0, 1000000, &v); O.pr_prefix_len = (int)v; break;
        case 28: bad = xpyd_parse_long(a, 0, 1000000, &v); O.pr_suffix_len = (int)v; break;
        case 29: bad = xpyd_parse_long(a, 1, 100000, &v); O.pr_num_prefixes = (int)v; break;
        case 30: bad = xpyd_parse_long(a, 1, 1000000, &v); O.pr_output_len = (int)v; break;
        case 31: bad = xpyd_parse_long(a, 1, 10000, &v); O.multi_turn = (int)v; break;
        case 32: snprintf(O.tls_ca, sizeof O.tls_ca, "%s", a); break;
        case 23:
            snprintf(O.direct_prefill, sizeof O.direct_prefill, "%s", a);
            bad = xpyd_parse_hostport(a, O.dp_host, sizeof O.dp_host, &O.dp_port) != 0 || !O.dp_port;
            break;
        case 24:
            O.pareto = !strcmp(a, "pareto");
            bad = !O.pareto && strcmp(a, "uniform") != 0;
            break;
        case 25: O.token_ids = 1; break;
        case 26: bad = goodput_arg(a); break;
        case 'h': usage(stdout); exit(0);
        case 'V': xpyd_print_version("xpyd_bench"); exit(0);
        default: usage(stderr); return -1;
        }
        if (bad) {
            fprintf(stderr, "xpyd_bench: invalid value '%s'\n", a ? a : "");
            return -1;
        }
    }
    for (int k = optind; k < argc; k++) { /* benchmark_serving takes --goodput K:V K:V (several after one flag) */
        if (!O.goodput || goodput_arg(argv[k]) != 0) {
            fprintf(stderr, "xpyd_bench: unexpected argument '%s' (see --help)\n", argv[k]);
            return -1;
        }
    }
    if ((O.prefix_rep || O.multi_turn) && (O.token_ids || O.direct_prefill[0])) {
        fprintf(stderr, "xpyd_bench: prefix-repetition and --multi-turn send text prompts through one endpoint (not "
                        "with --tokenizer-free or --direct-prefill)\n");
        return -1;
    }
    if (O.prefix_rep && O.multi_turn) {
        fprintf(stderr, "xpyd_bench: choose one of --dataset-name prefix-repetition and --multi-turn\n");
        return -1;
    }
    if (O.chat && !strcmp(O.endpoint, "/v1/completions"))
        snprintf(O.endpoint, sizeof O.endpoint, "/v1/chat/completions");
    if (O.chat && O.token_ids) {
        fprintf(stderr, "xpyd_bench: --tokenizer-free sends token-id prompts, which only completions take (not "
                        "--backend openai-chat)\n");
        return -1;
    }
    return 0;
}

static void print_metric(const char *title, const char *key, const char *label, double *v, size_t n, const double *pcts, int np,
                         int show, cJSON *out)
{
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    qsort(v, n, sizeof *v, cmp_double);
    double mean = n ? sum / (double)n : 0, var = 0;
    for (size_t i = 0; i < n; i++)
        var += (v[i] - mean) * (v[i] - mean);
    char k[80];
    snprintf(k, sizeof k, "mean_%s_ms", key);
    cJSON_AddNumberToObject(out, k, mean * 1000);
    snprintf(k, sizeof k, "median_%s_ms", key);
    cJSON_AddNumberToObject(out, k, pct(v, n, 50) * 1000);
    snprintf(k, sizeof k, "std_%s_ms", key);
    cJSON_AddNumberToObject(out, k, n ? sqrt(var / (double)n) * 1000 : 0);
    if (show) {
        char lab[80];
        printf("%s\n", title);
        snprintf(lab, sizeof lab, "Mean %s (ms):", label);
        printf("%-40s%-10.2f\n", lab, mean * 1000);
        snprintf(lab, sizeof lab, "Median %s (ms):", label);
        printf("%-40s%-10.2f\n", lab, pct(v, n, 50) * 1000);
    }
    for (int i = 0; i < np; i++) {
        snprintf(k, sizeof k, "p%g_%s_ms", pcts[i], key);
        cJSON_AddNumberToObject(out, k, pct(v, n, pcts[i]) * 1000);
        if (show) {
            char lab[80];
            snprintf(lab, sizeof lab, "P%g %s (ms):", pcts[i], label);
            printf("%-40s%-10.2f\n", lab, pct(v, n, pcts[i]) * 1000);
        }
    }
}

static void report(void)
{
    double dur = (double)(t_end - t0) / 1e6;
    int ok = 0;
    long in_total = 0, out_total = 0;
    size_t n_itl = 0;
    int good = 0, in_from_server = 0, cached_reported = 0;
    long cached_total = 0, in_with_cached = 0;
    for (int i = 0; i < O.num_prompts; i++) {
        struct req *r = &reqs[i];
        if (r->ok) {
            ok++;
            /* the server's count when it sent usage (benchmark_serving's tokenizer count stands for it) */
            in_total += r->in_tokens >= 0 ? r->in_tokens : r->in_len;
            in_from_server += r->in_tokens >= 0;
            out_total += r->out_tokens;
            n_itl += r->n_itl;
            if (r->cached_tokens >= 0 && r->in_tokens >= 0) {
                cached_reported++;
                cached_total += r->cached_tokens;
                in_with_cached += r->in_tokens;
            }
            double tpot_ms = r->out_tokens > 1 ? (r->e2el - r->ttft) / (double)(r->out_tokens - 1) * 1e3 : 0;
            good += (!O.slo_ttft_ms || r->ttft * 1e3 <= O.slo_ttft_ms) && (!O.slo_tpot_ms || tpot_ms <= O.slo_tpot_ms) &&
                    (!O.slo_e2el_ms || r->e2el * 1e3 <= O.slo_e2el_ms);
        }
    }
    double *ttft = XPYD_XALLOC(calloc((size_t)ok + 1, sizeof(double)));
    double *tpot = XPYD_XALLOC(calloc((size_t)ok + 1, sizeof(double)));
    double *e2el = XPYD_XALLOC(calloc((size_t)ok + 1, sizeof(double)));
    double *itl = XPYD_XALLOC(calloc(n_itl + 1, sizeof(double)));
    size_t k = 0, nt = 0, ni = 0;
    cJSON *out = cJSON_CreateObject();
    cJSON *a_ttft = cJSON_CreateArray(), *a_itl = cJSON_CreateArray(), *a_err = cJSON_CreateArray();
    cJSON *a_in = cJSON_CreateArray(), *a_out = cJSON_CreateArray(), *a_txt = cJSON_CreateArray();
    for (int i = 0; i < O.num_prompts; i++) {
        struct req *r = &reqs[i];
        cJSON_AddItemToArray(a_ttft, cJSON_CreateNumber(r->ok ? r->ttft : 0));
        cJSON_AddItemToArray(a_err, cJSON_CreateString(r->err));
        cJSON_AddItemToArray(a_in, cJSON_CreateNumber(r->in_tokens >= 0 ? r->in_tokens : r->in_len));
        size_t tl = evbuffer_get_length(r->text);
        char *tx = XPYD_XALLOC(malloc(tl + 1));
        evbuffer_copyout(r->text, tx, tl);
        tx[tl] = 0;
        cJSON_AddItemToArray(a_txt, cJSON_CreateString(r->ok ? tx : ""));
        free(tx);
        cJSON_AddItemToArray(a_out, cJSON_CreateNumber(r->ok ? (double)r->out_tokens : 0));
        cJSON *ri = cJSON_CreateArray();
        for (size_t j = 0; j < r->n_itl; j++)
            cJSON_AddItemToArray(ri, cJSON_CreateNumber(r->itl[j]));
        cJSON_AddItemToArray(a_itl, ri);
        if (!r->ok)
            continue;
        ttft[k] = r->ttft;
        e2el[k++] = r->e2el;
        if (r->out_tokens > 1)
            tpot[nt++] = (r->e2el - r->ttft) / (double)(r->out_tokens - 1);
        for (size_t j = 0; j < r->n_itl; j++)
            itl[ni++] = r->itl[j];
    }
    printf("============ Serving Benchmark Result ============\n");
    printf("%-40s%-10d\n", "Successful requests:", ok);
    printf("%-40s%-10d\n", "Failed requests:", O.num_prompts - ok);
    printf("%-40s%-10.2f\n", "Benchmark duration (s):", dur);
    printf("%-40s%-10ld\n", "Total input tokens:", in_total);
    if (in_from_server < ok)
        printf("  (%d of %d requests without a usage prompt_tokens: their requested length counted)\n", ok - in_from_server, ok);
    printf("%-40s%-10ld\n", "Total generated tokens:", out_total);
    if (cached_reported) {
        printf("%-40s%-10ld\n", "Cached input tokens (engine):", cached_total);
        printf("%-40s%-10.4f\n", "Prefix cache hit rate (engine):",
               in_with_cached ? (double)cached_total / (double)in_with_cached : 0);
    }
    printf("%-40s%-10.2f\n", "Request throughput (req/s):", ok / dur);
    if (O.goodput)
        printf("%-40s%-10.2f\n", "Request goodput (req/s):", good / dur);
    printf("%-40s%-10.2f\n", "Output token throughput (tok/s):", (double)out_total / dur);
    printf("%-40s%-10.2f\n", "Total Token throughput (tok/s):", (double)(in_total + out_total) / dur);
    char date[32];
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(date, sizeof date, "%Y%m%d-%H%M%S", &tm); /* benchmark_serving's format */
    cJSON_AddStringToObject(out, "date", date);
    cJSON_AddStringToObject(out, "backend", O.chat ? "openai-chat" : "openai");
    cJSON_AddStringToObject(out, "model_id", O.model);
    cJSON_AddStringToObject(out, "tokenizer_id", O.model); /* no tokenizer: lengths come from the server */
    cJSON_AddNumberToObject(out, "num_prompts", O.num_prompts);
    cJSON_AddNumberToObject(out, "duration", dur);
    cJSON_AddNumberToObject(out, "completed", ok);
    cJSON_AddNumberToObject(out, "failed", O.num_prompts - ok);
    cJSON_AddNumberToObject(out, "total_input_tokens", (double)in_total);
    cJSON_AddNumberToObject(out, "total_output_tokens", (double)out_total);
    cJSON_AddNumberToObject(out, "total_cached_tokens", (double)cached_total);
    if (cached_reported)
        cJSON_AddNumberToObject(out, "cache_hit_rate", in_with_cached ? (double)cached_total / (double)in_with_cached : 0);
    else
        cJSON_AddNullToObject(out, "cache_hit_rate");
    cJSON_AddNumberToObject(out, "request_throughput", ok / dur);
    if (O.goodput)
        cJSON_AddNumberToObject(out, "request_goodput", good / dur);
    else
        cJSON_AddNullToObject(out, "request_goodput");
    cJSON_AddNumberToObject(out, "output_throughput", (double)out_total / dur);
    cJSON_AddNumberToObject(out, "total_token_throughput", (double)(in_total + out_total) / dur);
    if (O.rate > 0)
        cJSON_AddNumberToObject(out, "request_rate", O.rate);
    else
        cJSON_AddStringToObject(out, "request_rate", "inf");
    cJSON_AddNumberToObject(out, "burstiness", O.burstiness);
    if (O.max_concurrency)
        cJSON_AddNumberToObject(out, "max_concurrency", O.max_concurrency);
    else
        cJSON_AddNullToObject(out, "max_concurrency");
    double pcts[16];
    int np = 0;
    char buf[128];
    snprintf(buf, sizeof buf, "%s", O.metric_percentiles);
    for (char *s = strtok(buf, ","); s && np < 16; s = strtok(NULL, ","))
        pcts[np++] = atof(s);
    print_metric("---------------Time to First Token----------------", "ttft", "TTFT", ttft, k, pcts, np,
                 strstr(O.percentile_metrics, "ttft") != NULL, out);
    print_metric("-----Time per Output Token (excl. 1st token)------", "tpot", "TPOT", tpot, nt, pcts, np,
                 strstr(O.percentile_metrics, "tpot") != NULL, out);
    print_metric("---------------Inter-token Latency----------------", "itl", "ITL", itl, ni, pcts, np,
                 strstr(O.percentile_metrics, "itl") != NULL, out);
    print_metric("----------------End-to-end Latency----------------", "e2el", "E2EL", e2el, k, pcts, np,
                 strstr(O.percentile_metrics, "e2el") != NULL, out);
    printf("==================================================\n");
    for (int i = 0, shown = 0; i < O.num_prompts && shown < 5; i++)
        if (!reqs[i].ok) {
            printf("failed request %d: %s\n", i, reqs[i].err);
            shown++;
        }
    cJSON_AddItemToObject(out, "input_lens", a_in);
    cJSON_AddItemToObject(out, "output_lens", a_out);
    cJSON_AddItemToObject(out, "ttfts", a_ttft);
    cJSON_AddItemToObject(out, "itls", a_itl);
    cJSON_AddItemToObject(out, "generated_texts", a_txt);
    cJSON_AddItemToObject(out, "errors", a_err);
    if (O.save_result) {
        char fn[600];
        if (O.result_filename[0])
            snprintf(fn, sizeof fn, "%s", O.result_filename);
        else
            snprintf(fn, sizeof fn, "xpyd-bench-%lld.json", (long long)xpyd_wall_s());
        char *s = cJSON_PrintUnformatted(out);
        FILE *f = fopen(fn, "w");
        if (!f || fputs(s, f) < 0 || fclose(f) != 0)
            fprintf(stderr, "xpyd_bench: cannot write %s\n", fn);
        free(s);
    }
    cJSON_Delete(out);
    free(ttft);
    free(tpot);
    free(e2el);
    free(itl);
}

int main(int argc, char **argv)
{
    if (parse(argc, argv) != 0)
        return 2;
    xpyd_raise_nofile();
    rng = xpyd_mix64(O.seed + 1);
    base = event_base_new();
    struct up_endpoint *ep = endpoints;
    if (up_endpoint_resolve(&ep[0], O.host, O.port) != 0 ||
        (O.direct_prefill[0] && up_endpoint_resolve(&ep[1], O.dp_host, O.dp_port) != 0)) {
        fprintf(stderr, "xpyd_bench: cannot resolve %s\n", O.direct_prefill[0] ? O.direct_prefill : O.host);
        return 2;
    }
    ep[0].tls = O.tls;
    up = up_thread_new(base, ep, O.direct_prefill[0] ? 2 : 1, 100000);
    SSL_CTX *tls = NULL;
    if (O.tls) {
        char err[600];
        struct xpyd_tls_client_opts co = {O.tls_ca, NULL, NULL, TLS1_2_VERSION};
        if (!(tls = xpyd_tls_client_new(&co, err, sizeof err))) {
            fprintf(stderr, "xpyd_bench: TLS: %s\n", err);
            return 2;
        }
        up_thread_set_tls(up, tls);
    }
    reqs = XPYD_XALLOC(calloc((size_t)O.num_prompts, sizeof *reqs));
    for (int i = 0; i < O.num_prompts; i++) {
        reqs[i].i = i;
        reqs[i].in_len = rand_len(O.input_len);
        reqs[i].out_len = O.prefix_rep ? O.pr_output_len : rand_len(O.output_len);
        reqs[i].cached_tokens = -1;
        reqs[i].ttft = -1;
        reqs[i].out_tokens = -1;
        reqs[i].in_tokens = -1;
        reqs[i].text = XPYD_XALLOC(evbuffer_new());
        reqs[i].sse.max_event = 1 << 20;
        reqs[i].errbody = evbuffer_new();
    }
    if (O.prefix_rep)
        prefix_rep_init();
    arrival_ev = event_new(base, -1, 0, on_arrival, NULL);
    printf("Starting benchmark: %d prompts, input %d, output %d, rate %s, max concurrency %d\n", O.num_prompts,
           O.input_len, O.output_len, O.rate > 0 ? "finite" : "inf", O.max_concurrency);
    fflush(stdout);
    t0 = xpyd_now_us();
    schedule_arrivals();
    event_base_dispatch(base);
    report();
    int failed = 0;
    for (int i = 0; i < O.num_prompts; i++) {
        failed += !reqs[i].ok;
        free(reqs[i].itl);
        free(reqs[i].prompt);
        if (reqs[i].pbody)
            evbuffer_free(reqs[i].pbody);
        evbuffer_free(reqs[i].errbody);
        evbuffer_free(reqs[i].text);
    }
    free(reqs);
    event_free(arrival_ev);
    up_thread_free(up);
    SSL_CTX_free(tls);
    event_base_free(base);
    return failed ? 1 : 0;
}
