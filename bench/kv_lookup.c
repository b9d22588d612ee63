/* SPDX-License-Identifier: Apache-2.0 */
/* kv_lookup.c - micro-benchmark of precise placement's per-request cost (issue 40): "how many leading blocks of
 * this prompt does each rank hold" for an 8k-token prompt (512 blocks of 16) over 64 ranks, against an index
 * that KV events filled: every rank holds 16,000 blocks of other content, and rank r also holds the prompt's
 * first 8r blocks (so the walk goes the whole prompt: ranks drop out one by one). In the same run, the baseline:
 * the router's own guess answering the same question for one rank (xb_prefix_match, a binary search).
 *   xpyd_kv_lookup [iterations=20000]
 * Then what taking in the events costs, per 8k-token prompt stored then removed (an empty index of one rank,
 * the prompt matched whole in between): as vLLM publishes it (one BlockStored of 512 blocks of 16, one
 * BlockRemoved), with vLLM --block-size 64 (128 blocks, each kept as 4 of the router's) and as SGLang publishes it
 * with its default --page-size 1 (a BlockStored and a BlockRemoved per token, kept as pieces until a router block
 * is whole).
 * Prints the mean time per lookup and per prompt taken in, in microseconds (CLOCK_MONOTONIC around each loop). */
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

/* stores the prompt in engine blocks of b tokens, `per` blocks an event, each after the last; checks it matches
 * whole; removes it block by block, last first (as engines evict) */
static void ingest(const uint32_t *prompt, const uint64_t *keys, size_t b, size_t per)
{
    static struct kvi *x;
    static uint64_t h[TOKENS];
    if (!x)
        x = kvi_new(1, 4 * TOKENS);
    size_t nb = TOKENS / b;
    for (size_t i = 0; i < nb; i++)
        h[i] = 0x5eed0000u + i;
    for (size_t i = 0; i < nb; i += per) {
        struct kv_event e = {.type = KVE_STORED, .hashes = h + i, .nhashes = per, .has_parent = i > 0,
                             .parent = i ? h[i - 1] : 0, .tokens = (uint32_t *)prompt + i * b, .ntokens = per * b,
                             .block_size = (long)b, .lora_id = -1, .group_idx = -1, .full_attention = 1};
        if (kvi_apply(x, 0, &e, BLOCK) != KVI_OK) {
            fprintf(stderr, "xpyd_kv_lookup: the index refused an event\n");
            exit(1);
        }
    }
    uint32_t out[1];
    kvi_match(x, keys, NB, 0, out);
    if (out[0] != NB) {
        fprintf(stderr, "xpyd_kv_lookup: %u of %d blocks held after storing in blocks of %zu\n", out[0], NB, b);
        exit(1);
    }
    for (size_t i = nb; i > 0; i -= per) {
        struct kv_event e = {.type = KVE_REMOVED, .hashes = h + i - per, .nhashes = per, .lora_id = -1,
                             .group_idx = -1, .full_attention = 1};
        kvi_apply(x, 0, &e, BLOCK);
    }
    if (kvi_blocks(x, 0)) {
        fprintf(stderr, "xpyd_kv_lookup: blocks left after removing them all\n");
        exit(1);
    }
}

static double ingest_us(const uint32_t *prompt, const uint64_t *keys, size_t b, size_t per, long reps)
{
    double t = micro_now_us();
    for (long k = 0; k < reps; k++)
        ingest(prompt, keys, b, per);
    return (micro_now_us() - t) / (double)reps;
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
    long reps = iters / 100 > 10 ? iters / 100 : 10;
    double vllm = ingest_us(prompt, keys, BLOCK, NB, reps), vllm64 = ingest_us(prompt, keys, 4 * BLOCK, NB / 4, reps);
    double sglang = ingest_us(prompt, keys, 1, 1, reps);
    printf("{\"prompt_tokens\":%d,\"blocks\":%zu,\"ranks\":%d,\"pairs\":%zu,\"index_bytes\":%zu,"
           "\"precise_lookup_us\":%.2f,\"approximate_lookup_us\":%.2f,\"ingest_vllm_us\":%.1f,"
           "\"ingest_vllm_block64_us\":%.1f,\"ingest_sglang_page1_us\":%.1f,\"sink\":%zu}\n",
           TOKENS, n, RANKS, (size_t)RANKS * (OTHER + NB), kvi_bytes(x), precise, approx, vllm, vllm64, sglang,
           sink % 10);
    kvi_free(x);
    xb_prefix_free(guess);
    return 0;
}
