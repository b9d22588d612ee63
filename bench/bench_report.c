/* SPDX-License-Identifier: Apache-2.0 */
/* bench_report.c - xpyd_bench's result: benchmark_serving's table (throughput, TTFT/TPOT/ITL/E2EL percentiles,
 * goodput) and, with --save-result, its JSON (see bench.h). */
#include "bench.h"

#include "xpyd_util.h"

#include <event2/buffer.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

void bench_report(void)
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
