/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_bench.c - a C load generator with vLLM benchmark_serving.py's workflow, flags, metrics and result
 * table: random prompts, Poisson/gamma arrivals, a concurrency cap, TTFT/TPOT/ITL/E2EL percentiles.
 *
 * Metrics follow benchmark_serving: TTFT = first SSE event carrying choices; ITL = gaps between such
 * events; output length = the usage event's completion_tokens (else the number of content events);
 * TPOT = (E2EL - TTFT) / (output tokens - 1). Failed requests are counted with their error. */
#include "bench.h"

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

struct opts O;
static struct event_base *base;
static struct up_thread *up;
struct req *reqs;
static int next_to_send, in_flight, finished;
uint64_t rng, t0, t_end;
static struct event *arrival_ev;

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
                           "X-Request-Id: bench-%d-%llu\r\nContent-Length: %zu\r\n\r\n",
                        r->i, (unsigned long long)t0, strlen(body));
    evbuffer_add(b, body, strlen(body)); /* not through printf's "%s": a byte at a time, most of our CPU */
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
    char *body = bench_make_body(r, 0, cJSON_GetObjectItemCaseSensitive(j, "kv_transfer_params"));
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
    bench_make_prompt(r);
    r->t_start = xpyd_now_us();
    in_flight++;
    if (O.direct_prefill[0]) {
        char *body = bench_make_body(r, 1, NULL);
        r->pbody = XPYD_XALLOC(evbuffer_new());
        static const struct up_leg_cbs pcbs = {pre_head, pre_body, pre_done, NULL, NULL, NULL};
        send_leg(r, 1, body, &pcbs);
        free(body);
        return;
    }
    char *body = bench_make_body(r, 0, NULL);
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
            due += (uint64_t)(bench_gamma(O.burstiness, 1.0 / (O.rate * O.burstiness)) * 1e6);
        } else {
            send_one();
        }
    }
    if (O.rate > 0 && next_to_send < O.num_prompts) { /* capped by concurrency: look again shortly */
        struct timeval tv = {0, 1000};
        event_add(arrival_ev, &tv);
    }
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
          "                               engine, or prefix-repetition's prefix + suffix lengths; completions\n"
          "                               backends only). Default: words that are one token\n"
          "                               each in cl100k/o200k-family vocabularies (and on xpyd_sim)\n"
          "  --goodput KEY:MS ...         SLOs (ttft, tpot, e2el in ms) for request_goodput, as benchmark_serving\n"
          "  --dataset-name random|prefix-repetition   prefix-repetition (vLLM's): --prefix-repetition-prefix-len N\n"
          "                               (256) --prefix-repetition-suffix-len N (256) --prefix-repetition-num-prefixes\n"
          "                               N (10) --prefix-repetition-output-len N (128); each request is one of the\n"
          "                               shared prefixes (each used equally often, shuffled) + a random suffix;\n"
          "                               --prefix-repetition-prefix-seed N: the prefixes from their own seed (two\n"
          "                               clients with other --seed values then share tenants, not their order)\n"
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
        {"prefix-repetition-prefix-seed", 1, 0, 33},
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
        case 33: bad = xpyd_parse_long(a, 1, 0x7fffffffffffffffL, &v); O.pr_prefix_seed = (uint64_t)v; break;
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
    if ((O.prefix_rep || O.multi_turn) && O.direct_prefill[0]) {
        fprintf(stderr, "xpyd_bench: prefix-repetition and --multi-turn send their prompts through one endpoint (not "
                        "with --direct-prefill)\n");
        return -1;
    }
    if (O.multi_turn && O.token_ids) {
        fprintf(stderr, "xpyd_bench: --multi-turn sends text conversations (not with --tokenizer-free)\n");
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
        reqs[i].in_len = bench_rand_len(O.input_len);
        reqs[i].out_len = O.prefix_rep ? O.pr_output_len : bench_rand_len(O.output_len);
        reqs[i].cached_tokens = -1;
        reqs[i].ttft = -1;
        reqs[i].out_tokens = -1;
        reqs[i].in_tokens = -1;
        reqs[i].text = XPYD_XALLOC(evbuffer_new());
        reqs[i].sse.max_event = 1 << 20;
        reqs[i].errbody = evbuffer_new();
    }
    if (O.prefix_rep)
        bench_prefix_init();
    arrival_ev = event_new(base, -1, 0, on_arrival, NULL);
    printf("Starting benchmark: %d prompts, input %d, output %d, rate %s, max concurrency %d\n", O.num_prompts,
           O.input_len, O.output_len, O.rate > 0 ? "finite" : "inf", O.max_concurrency);
    fflush(stdout);
    t0 = xpyd_now_us();
    schedule_arrivals();
    event_base_dispatch(base);
    bench_report();
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
