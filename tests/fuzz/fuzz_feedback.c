/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_feedback.c - libFuzzer harness: an engine's /metrics page as the router's probe reads it for load
 * feedback (probe_parse_engine_metrics in router/feedback_parse.c), and the same bytes as its GET /v1/models
 * answer (probe_parse_models_max_len, probe_parse_models_adapters). The first byte picks the engine label (or all
 * engines). Checks: the counts read are finite and never negative, KV usage within [0, 1] when a series matched,
 * a length 0 or within [1, 2^40), each adapter's id non-empty and no longer than the page, as many calls as
 * adapters counted, and no byte outside the page is read (ASan). */
#include "feedback_parse.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static size_t calls, page_len;

static void adapter(void *arg, const char *id, size_t n)
{
    if (!n || n > page_len || !id)
        abort();
    calls++;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int engine = data[0] < 128 ? (int)(data[0] % 4) : -1;
    char *page = malloc(size); /* exactly the page's bytes: the parser must not read a NUL after it */
    memcpy(page, data + 1, size - 1);
    struct engine_load l;
    memset(&l, 0, sizeof l);
    int n = probe_parse_engine_metrics(page, size - 1, engine, &l);
    if (n < 0 || !isfinite(l.waiting) || !isfinite(l.running) || !isfinite(l.kv_usage) || l.waiting < 0 ||
        l.running < 0 || l.kv_usage < 0 || l.kv_usage > 1 || l.num_gpu_blocks < 0 || l.num_gpu_blocks >= (1L << 40) ||
        l.block_size < 0 || l.block_size >= (1L << 40))
        abort();
    long mml = probe_parse_models_max_len(page, size - 1);
    if (mml < 0 || mml >= (1L << 40))
        abort();
    calls = 0;
    page_len = size - 1;
    if (probe_parse_models_adapters(page, size - 1, adapter, NULL) != calls)
        abort();
    free(page);
    return 0;
}
