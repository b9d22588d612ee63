/* SPDX-License-Identifier: Apache-2.0 */
/* prefix_lookup.c - micro-benchmark of cache-aware placement's per-request cost: hashing an 8k-token prompt
 * into chained blocks, and one `cache` pick of it against 64 ranks whose prefix indexes are full of other
 * prompts' blocks (and, for some ranks, of this prompt's prefix, so the binary searches go deep).
 *   xpyd_prefix_lookup [iterations=20000]
 * Prints the mean time per operation in microseconds (CLOCK_MONOTONIC around the whole loop). */
#include "micro.h"
#include "xb.h"
#include "xb_prefix.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define RANKS 64
#define TOKENS 8192
#define BLOCK 16


int main(int argc, char **argv)
{
    long iters = argc > 1 ? atol(argv[1]) : 20000;
    if (iters < 1)
        iters = 1;
    static int64_t ids[TOKENS];
    static char text[TOKENS * 4];
    for (int i = 0; i < TOKENS; i++)
        ids[i] = (int64_t)(micro_rnd() % 128000);
    for (size_t i = 0; i < sizeof text; i++)
        text[i] = (char)('a' + micro_rnd() % 26);
    uint64_t h[TOKENS / BLOCK];
    size_t nb = 0;

    double t = micro_now_us();
    for (long k = 0; k < iters; k++)
        nb += xb_hash_tokens(ids, TOKENS, BLOCK, h, TOKENS / BLOCK);
    double hash_ids = (micro_now_us() - t) / (double)iters;
    t = micro_now_us();
    for (long k = 0; k < iters; k++)
        nb += xb_hash_bytes(text, sizeof text, BLOCK * 4, h, TOKENS / BLOCK);
    double hash_text = (micro_now_us() - t) / (double)iters;

    struct xb_pool *p = xb_pool_new(XB_POLICY_CACHE, 1);
    for (int i = 0; i < RANKS; i++) {
        struct xb_instance_cfg c = {1, 1, 0, 0, (uint64_t)i + 1};
        xb_pool_add(p, &c);
    }
    xb_prefix_enable(p, 8192, (size_t)64 << 20, 0, 2.0);
    /* every rank full of other prompts (8,192 blocks each: 524,288 entries, ~24 MiB); ranks 0..15 also hold a
     * part of this prompt's prefix (1/16 .. the whole), so their binary searches go deep */
    uint64_t other[512];
    for (int r = 0; r < RANKS; r++) {
        for (int k = 0; k < 16; k++) {
            for (int j = 0; j < 512; j++)
                other[j] = micro_rnd();
            struct xb_query q = {.tokens = TOKENS, .blocks = other, .nblocks = 512, .block_tokens = BLOCK};
            int idx;
            int excl[RANKS], ne = 0;
            for (int i = 0; i < RANKS; i++)
                if (i != r)
                    excl[ne++] = i;
            q.exclude = excl;
            q.nexclude = ne;
            idx = xb_pick_q(p, &q);
            xb_release(p, idx, q.charged);
        }
    }
    xb_hash_tokens(ids, TOKENS, BLOCK, h, TOKENS / BLOCK);
    for (int r = 0; r < 16; r++) {
        int excl[RANKS], ne = 0;
        for (int i = 0; i < RANKS; i++)
            if (i != r)
                excl[ne++] = i;
        struct xb_query q = {.tokens = TOKENS, .blocks = h, .nblocks = (size_t)(r + 1) * 32, .block_tokens = BLOCK,
                             .exclude = excl, .nexclude = ne};
        int idx = xb_pick_q(p, &q);
        xb_release(p, idx, q.charged);
    }
    int64_t cached = 0;
    t = micro_now_us();
    for (long k = 0; k < iters; k++) {
        struct xb_query q = {.tokens = TOKENS, .blocks = h, .nblocks = TOKENS / BLOCK, .block_tokens = BLOCK,
                             .peek = 1};
        xb_pick_q(p, &q);
        cached += q.cached;
    }
    double pick = (micro_now_us() - t) / (double)iters;
    printf("prompt %d tokens (%d blocks of %d), %d ranks, index %.1f MiB\n", TOKENS, TOKENS / BLOCK, BLOCK, RANKS,
           (double)xb_prefix_memory(p) / 1048576.0);
    printf("hash token ids: %.2f us   hash text (%zu bytes): %.2f us   cache pick (64 ranks): %.2f us   "
           "(best rank holds %lld cached tokens; %zu)\n",
           hash_ids, sizeof text, hash_text, pick, (long long)(cached / iters), nb % 2);
    xb_pool_free(p);
    return 0;
}
