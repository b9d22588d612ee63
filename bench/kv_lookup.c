/* SPDX-License-Identifier: Apache-2.0 */
/* kv_lookup.c - micro-benchmark of precise placement's per-request cost (issue 40): "how many leading blocks of
 * this prompt does each rank hold" for an 8k-token prompt (512 blocks of 16) over 64 ranks, against an index
 * that KV events filled: every rank holds 16,000 blocks of other content, and rank r also holds the prompt's
 * first 8r blocks (so the walk goes the whole prompt: ranks drop out one by one). In the same run, the baseline:
 * the router's own guess answering the same question for one rank (xb_prefix_match, a binary search).
 *   xpyd_kv_lookup [iterations=20000]
 * Prints the mean time per lookup in microseconds (CLOCK_MONOTONIC around the whole loop). */
#include "kv_index.h"
#include "micro.h"
#include "xb_prefix.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RANKS 64
#define TOKENS 8192
#define BLOCK 16
#define NB (TOKENS / BLOCK)
#define OTHER 16000

static uint32_t rnd(void) /* a token id */
{
    return (uint32_t)(micro_rnd() % 128000);
}

/* one BlockStored of n blocks of tokens, engine hashes from *eh on, parent or none */
static void store(struct kvi *x, int rank, const uint32_t *tokens, size_t n, uint64_t *eh, int has_parent)
{
    uint64_t *h = malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++)
        h[i] = (*eh)++;
    struct kv_event e = {.type = KVE_STORED, .hashes = h, .nhashes = n, .has_parent = has_parent,
                         .parent = has_parent ? h[0] - 1 : 0, .tokens = (uint32_t *)tokens, .ntokens = n * BLOCK,
                         .block_size = BLOCK, .lora_id = -1, .group_idx = -1, .full_attention = 1};
    if (kvi_apply(x, rank, &e, BLOCK) != KVI_OK) {
        fprintf(stderr, "xpyd_kv_lookup: the index refused a block\n");
        exit(1);
    }
    free(h);
}

int main(int argc, char **argv)
{
    long iters = argc > 1 ? atol(argv[1]) : 20000;
    if (iters < 1)
        iters = 1;
    static uint32_t prompt[TOKENS], other[OTHER * BLOCK];
    static int64_t wide[TOKENS];
    for (int i = 0; i < TOKENS; i++)
        wide[i] = prompt[i] = rnd();
    struct kvi *x = kvi_new(RANKS, (size_t)RANKS * (OTHER + NB) + 1);
    struct xb_prefix *guess = xb_prefix_new(OTHER + NB, (size_t)2 << 30, 0);
    uint64_t eh = 1;
    for (int r = 0; r < RANKS; r++) {
        for (int i = 0; i < OTHER * BLOCK; i++)
            other[i] = rnd();
        for (int c = 0; c < OTHER / 250; c++) /* other prompts: chains of 250 blocks */
            store(x, r, other + (size_t)c * 250 * BLOCK, 250, &eh, 0);
        if (r)
            store(x, r, prompt, (size_t)(8 * r > NB ? NB : 8 * r), &eh, 0);
    }
    uint64_t keys[NB];
    size_t n = xb_hash_tokens(wide, TOKENS, BLOCK, keys, NB);
    for (int r = 0; r < RANKS; r++) { /* the guess, filled alike for its baseline */
        uint64_t ok[OTHER / 250 * 250];
        for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
            ok[i] = ((uint64_t)rnd() << 32) ^ rnd();
        xb_prefix_insert(guess, r, ok, sizeof ok / sizeof ok[0], 0);
        if (r)
            xb_prefix_insert(guess, r, keys, (size_t)(8 * r > NB ? NB : 8 * r), 0);
    }
    uint32_t out[RANKS];
    size_t sink = 0;
    double t = micro_now_us();
    for (long k = 0; k < iters; k++) {
        kvi_match(x, keys, n, 0, out);
        sink += out[RANKS - 1];
    }
    double precise = (micro_now_us() - t) / (double)iters;
    t = micro_now_us();
    for (long k = 0; k < iters; k++)
        for (int r = 0; r < RANKS; r++)
            sink += xb_prefix_match(guess, r, keys, n, 0);
    double approx = (micro_now_us() - t) / (double)iters;
    if (out[1] != 8 || out[RANKS - 1] != 8 * (RANKS - 1) || out[0] != 0) {
        fprintf(stderr, "xpyd_kv_lookup: wrong answer (%u %u %u)\n", out[0], out[1], out[RANKS - 1]);
        return 1;
    }
    printf("{\"prompt_tokens\":%d,\"blocks\":%zu,\"ranks\":%d,\"pairs\":%zu,\"index_bytes\":%zu,"
           "\"precise_lookup_us\":%.2f,\"approximate_lookup_us\":%.2f,\"sink\":%zu}\n",
           TOKENS, n, RANKS, (size_t)RANKS * (OTHER + NB), kvi_bytes(x), precise, approx, sink % 10);
    kvi_free(x);
    xb_prefix_free(guess);
    return 0;
}
