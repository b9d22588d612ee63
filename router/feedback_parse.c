/* feedback_parse.c - reads vLLM's load series out of a Prometheus page (declared in probe.h). */
#include "probe.h"

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

int probe_parse_engine_metrics(const char *page, size_t len, int engine, struct engine_load *out)
{
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

