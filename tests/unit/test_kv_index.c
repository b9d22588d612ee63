/* SPDX-License-Identifier: Apache-2.0 */
/* test_kv_index.c - the index of what ranks report caching (router/kv_index.c): blocks keyed by content so a
 * prompt hashed as the router hashes it (xb_hash_tokens over the whole prompt) finds them, chains continued from a
 * parent, removals (a middle block ends the leading run), media, duplicates, LoRA key spaces (many adapters, and
 * past their bound), refusals by cause,
 * the bound, a rank dropped; and seeded random runs of stores and removals against a plain model of it, one small
 * and one where the tables grow, deletions wrap and hashes come to name other content or another LoRA space; and
 * churn at one table size, where deletions inside runs that wrap past the end happen every run. */
#include "kv_index.h"
#include "xb_prefix.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define B 4

static struct kv_event stored(uint64_t *hashes, size_t n, uint32_t *tokens, int has_parent, uint64_t parent)
{
    struct kv_event e = {.type = KVE_STORED, .hashes = hashes, .nhashes = n, .has_parent = has_parent,
                         .parent = parent, .tokens = tokens, .ntokens = n * B, .block_size = B, .lora_id = -1,
                         .group_idx = -1, .full_attention = 1};
    return e;
}

static struct kv_event removed(uint64_t *hashes, size_t n, const char *medium)
{
    struct kv_event e = {.type = KVE_REMOVED, .hashes = hashes, .nhashes = n, .lora_id = -1, .group_idx = -1,
                         .full_attention = 1};
    strncpy(e.medium, medium, sizeof e.medium - 1);
    return e;
}

/* the router's keys of a prompt: the same function it hashes a token-id prompt with */
static size_t keys_of(const uint32_t *ids, size_t n, uint64_t *out)
{
    int64_t wide[256];
    for (size_t i = 0; i < n; i++)
        wide[i] = ids[i];
    return xb_hash_tokens(wide, n, B, out, 64);
}

static uint32_t prompt[40];

static void setup_prompt(void)
{
    for (int i = 0; i < 40; i++)
        prompt[i] = (uint32_t)(1000 + i * 7);
}

static void chains_and_removals(void **state)
{
    (void)state;
    setup_prompt();
    struct kvi *x = kvi_new(3, 1000);
    uint64_t h1[3] = {11, 12, 13}, h2[2] = {14, 15}, h3[2] = {21, 22};
    struct kv_event a = stored(h1, 3, prompt, 0, 0), b = stored(h2, 2, prompt + 12, 1, 13);
    struct kv_event c = stored(h3, 2, prompt, 0, 0);
    assert_int_equal(kvi_apply(x, 0, &a, B), KVI_OK);
    assert_int_equal(kvi_apply(x, 0, &b, B), KVI_OK); /* continues from block 13 */
    assert_int_equal(kvi_apply(x, 1, &c, B), KVI_OK);
    uint64_t k[16];
    size_t n = keys_of(prompt, 32, k); /* 8 blocks */
    assert_int_equal(n, 8);
    uint32_t out[3];
    kvi_match(x, k, n, 0, out);
    assert_int_equal(out[0], 5);
    assert_int_equal(out[1], 2);
    assert_int_equal(out[2], 0);
    assert_int_equal(kvi_blocks(x, 0), 5);
    /* another prompt sharing the first block only */
    uint32_t other[8];
    memcpy(other, prompt, sizeof other);
    other[5] = 9;
    n = keys_of(other, 8, k);
    kvi_match(x, k, n, 0, out);
    assert_int_equal(out[0], 1);
    assert_int_equal(out[1], 1);
    /* the middle block evicted: the leading run ends before it */
    uint64_t gone[1] = {12};
    struct kv_event r = removed(gone, 1, "GPU");
    assert_int_equal(kvi_apply(x, 0, &r, B), KVI_OK);
    n = keys_of(prompt, 32, k);
    kvi_match(x, k, n, 0, out);
    assert_int_equal(out[0], 1);
    assert_int_equal(kvi_blocks(x, 0), 4);
    /* unknown hashes removed: nothing happens */
    uint64_t unknown[2] = {99, 11};
    struct kv_event r2 = removed(unknown, 1, "");
    kvi_apply(x, 0, &r2, B);
    assert_int_equal(kvi_blocks(x, 0), 4);
    /* AllBlocksCleared on rank 0: rank 1 keeps its blocks */
    struct kv_event clr = {.type = KVE_CLEARED};
    kvi_apply(x, 0, &clr, B);
    assert_int_equal(kvi_blocks(x, 0), 0);
    kvi_match(x, k, n, 0, out);
    assert_int_equal(out[0], 0);
    assert_int_equal(out[1], 2);
    kvi_drop_rank(x, 1);
    assert_int_equal(kvi_blocks(x, 1), 0);
    kvi_free(x);
}

static void refusals(void **state)
{
    (void)state;
    setup_prompt();
    struct kvi *x = kvi_new(2, 3);
    uint64_t h[4] = {1, 2, 3, 4}, k[8];
    struct kv_event orphan = stored(h, 1, prompt, 1, 777);
    assert_int_equal(kvi_apply(x, 0, &orphan, B), KVI_ORPHAN);
    struct kv_event sz = stored(h, 1, prompt, 0, 0);
    sz.block_size = B + 2; /* not a multiple of the router's, nor smaller blocks, nor too many of them */
    assert_int_equal(kvi_apply(x, 0, &sz, B), KVI_BLOCK_SIZE);
    sz.block_size = B - 1;
    assert_int_equal(kvi_apply(x, 0, &sz, B), KVI_BLOCK_SIZE);
    sz.block_size = B * (KVI_MAX_PARTS + 1);
    assert_int_equal(kvi_apply(x, 0, &sz, B), KVI_BLOCK_SIZE);
    sz.block_size = 2 * B; /* a multiple: token_ids must then be 2 x B a hash */
    assert_int_equal(kvi_apply(x, 0, &sz, B), KVI_SHAPE);
    struct kv_event sw = stored(h, 1, prompt, 0, 0);
    sw.full_attention = 0;
    assert_int_equal(kvi_apply(x, 0, &sw, B), KVI_NOT_FULL_ATTENTION);
    struct kv_event shape = stored(h, 2, prompt, 0, 0);
    shape.ntokens = 7;
    assert_int_equal(kvi_apply(x, 0, &shape, B), KVI_SHAPE);
    assert_int_equal(kvi_blocks(x, 0), 0);
    /* the bound: 3 pairs in all */
    struct kv_event four = stored(h, 4, prompt, 0, 0);
    assert_int_equal(kvi_apply(x, 0, &four, B), KVI_FULL);
    assert_int_equal(kvi_blocks(x, 0), 3);
    uint32_t out[2];
    size_t n = keys_of(prompt, 16, k);
    kvi_match(x, k, n, 0, out);
    assert_int_equal(out[0], 3);
    assert_null(kvi_new(0, 10));
    assert_null(kvi_new(5000, 10));
    kvi_free(x);
}

/* an engine whose blocks are two of the router's (vLLM --block-size 8 under 4): each kept as two, found again on
 * removal, chained from a parent; a rank's match in whole engine blocks */
static void engine_blocks_of_several(void **state)
{
    (void)state;
    setup_prompt();
    struct kvi *x = kvi_new(2, 1000);
    uint64_t h0[2] = {31, 32}, h1[3] = {41, 42, 43}, h2[1] = {33}, k[16];
    struct kv_event a = stored(h0, 2, prompt, 0, 0), b = stored(h1, 3, prompt, 0, 0);
    struct kv_event c = stored(h2, 1, prompt + 16, 1, 32); /* continues from engine block 32 */
    a.block_size = c.block_size = 2 * B;
    a.ntokens = 4 * B;
    c.ntokens = 2 * B;
    assert_int_equal(kvi_apply(x, 0, &a, B), KVI_OK);
    assert_int_equal(kvi_apply(x, 1, &b, B), KVI_OK);
    assert_int_equal(kvi_apply(x, 0, &c, B), KVI_OK);
    assert_int_equal(kvi_blocks(x, 0), 6); /* in the router's blocks */
    uint32_t out[2];
    size_t n = keys_of(prompt, 32, k);
    kvi_match(x, k, n, 0, out);
    assert_int_equal(out[0], 6);
    assert_int_equal(out[1], 3);
    /* a prompt of 3 of the router's blocks: rank 0 holds them, but the engine hits one block of its own (2) */
    n = keys_of(prompt, 14, k);
    assert_int_equal(n, 3);
    kvi_match(x, k, n, 0, out);
    assert_int_equal(out[0], 2);
    assert_int_equal(out[1], 3);
    /* removed from another medium than it is held on: nothing goes */
    uint64_t gone[1] = {32};
    struct kv_event cpu = removed(gone, 1, "CPU"), gpu = removed(gone, 1, "GPU");
    assert_int_equal(kvi_apply(x, 0, &cpu, B), KVI_OK);
    assert_int_equal(kvi_blocks(x, 0), 6);
    /* the middle engine block evicted: both its parts go, the run ends before them */
    assert_int_equal(kvi_apply(x, 0, &gpu, B), KVI_OK);
    assert_int_equal(kvi_blocks(x, 0), 4);
    n = keys_of(prompt, 32, k);
    kvi_match(x, k, n, 0, out);
    assert_int_equal(out[0], 2);
    /* the rank's engine now in the router's size: matches count block by block again */
    uint64_t h3[1] = {51};
    struct kv_event d = stored(h3, 1, prompt, 0, 0);
    assert_int_equal(kvi_apply(x, 0, &d, B), KVI_OK);
    n = keys_of(prompt, 12, k);
    kvi_match(x, k, n, 0, out);
    assert_int_equal(out[0], 2);
    n = keys_of(prompt, 4, k);
    kvi_match(x, k, n, 0, out);
    assert_int_equal(out[0], 1);
    kvi_free(x);
}

/* engine blocks of b tokens (SGLang's --page-size 1: an event per token) stored one at a time or several to an
 * event: stored from the parent */
static int store_small(struct kvi *x, int rank, uint64_t first_hash, size_t from, size_t n, size_t b, int parent)
{
    uint64_t h[16];
    for (size_t i = 0; i < n; i++)
        h[i] = first_hash + i;
    struct kv_event e = stored(h, n, prompt + from * b, parent, first_hash - 1);
    e.block_size = (long)b;
    e.ntokens = n * b;
    return kvi_apply(x, rank, &e, B);
}

/* an engine whose blocks are a quarter or half of the router's: a router block is keyed when the engine block
 * that ends it arrives, from the tokens of the ones before it (kept as pieces); a missing piece leaves it unkeyed */
static void engine_blocks_smaller_than_the_routers(void **state)
{
    (void)state;
    setup_prompt();
    struct kvi *x = kvi_new(2, 1000);
    uint64_t k[16];
    uint32_t out[2];
    assert_int_equal(store_small(x, 0, 100, 0, 1, 1, 0), KVI_OK); /* token 0, no parent */
    for (size_t i = 1; i < 10; i++) /* tokens 1..9, one event each, chained */
        assert_int_equal(store_small(x, 0, 100 + i, i, 1, 1, 1), KVI_OK);
    assert_int_equal(kvi_blocks(x, 0), 2); /* tokens 0-3 and 4-7; 8 and 9 wait */
    assert_int_equal(kvi_pieces(x), 8);    /* 0-2, 4-6, 8-9 */
    size_t n = keys_of(prompt, 16, k);
    kvi_match(x, k, n, 0, out);
    assert_int_equal(out[0], 2);
    assert_int_equal(store_small(x, 0, 110, 10, 2, 1, 1), KVI_OK); /* tokens 10, 11 in one event */
    kvi_match(x, k, n, 0, out);
    assert_int_equal(out[0], 3);
    assert_int_equal(store_small(x, 1, 200, 0, 4, 2, 0), KVI_OK); /* rank 1: blocks of 2, tokens 0..7 */
    kvi_match(x, k, n, 0, out);
    assert_int_equal(out[1], 2);
    assert_int_equal(kvi_blocks(x, 1), 2);
    /* a piece evicted: its router block stays until the engine block ending it goes too (SGLang evicts a leaf's
     * pages together, the end with them) */
    uint64_t piece[1] = {105}, end[1] = {107};
    struct kv_event rp = removed(piece, 1, "GPU"), re = removed(end, 1, "GPU");
    assert_int_equal(kvi_apply(x, 0, &rp, B), KVI_OK);
    assert_int_equal(kvi_blocks(x, 0), 3);
    assert_int_equal(kvi_apply(x, 0, &re, B), KVI_OK);
    assert_int_equal(kvi_blocks(x, 0), 2);
    kvi_match(x, k, n, 0, out);
    assert_int_equal(out[0], 1);
    /* tokens 12..14 kept, 12 evicted, then 15: its router block cannot be keyed */
    assert_int_equal(store_small(x, 0, 112, 12, 3, 1, 1), KVI_OK);
    uint64_t first[1] = {112};
    struct kv_event r12 = removed(first, 1, "GPU");
    assert_int_equal(kvi_apply(x, 0, &r12, B), KVI_OK);
    assert_int_equal(store_small(x, 0, 115, 15, 1, 1, 1), KVI_ORPHAN);
    assert_int_equal(store_small(x, 0, 300, 0, 1, 1, 1), KVI_ORPHAN); /* parent 299 unknown */
    assert_int_equal(kvi_blocks(x, 0), 2);
    /* forgotten with the rank: nothing to go on from */
    kvi_drop_rank(x, 0);
    assert_int_equal(kvi_blocks(x, 0), 0);
    assert_int_equal(kvi_pieces(x), 2); /* rank 1's */
    assert_int_equal(store_small(x, 0, 110, 10, 2, 1, 1), KVI_ORPHAN);
    kvi_free(x);
    /* pieces count against the bound */
    x = kvi_new(1, 5);
    int rc = KVI_OK;
    for (size_t i = 0; i < 12 && rc == KVI_OK; i++)
        rc = store_small(x, 0, 100 + i, i, 1, 1, i > 0);
    assert_int_equal(rc, KVI_FULL);
    assert_int_equal(kvi_blocks(x, 0) + kvi_pieces(x), 5);
    kvi_free(x);
}

static void media_duplicates_and_lora(void **state)
{
    (void)state;
    setup_prompt();
    struct kvi *x = kvi_new(1, 100);
    uint64_t h[1] = {5}, h2[1] = {6}, k[4];
    uint32_t out[1];
    size_t n = keys_of(prompt, 4, k);
    struct kv_event gpu = stored(h, 1, prompt, 0, 0), cpu = stored(h, 1, prompt, 0, 0);
    strcpy(cpu.medium, "CPU");
    kvi_apply(x, 0, &gpu, B);
    kvi_apply(x, 0, &cpu, B);
    struct kv_event rg = removed(h, 1, "GPU"), rc = removed(h, 1, "CPU");
    kvi_apply(x, 0, &rg, B); /* offloaded: still there */
    kvi_match(x, k, n, 0, out);
    assert_int_equal(out[0], 1);
    kvi_apply(x, 0, &rc, B);
    kvi_match(x, k, n, 0, out);
    assert_int_equal(out[0], 0);
    /* the same content under two engine hashes: held until both are removed */
    struct kv_event d1 = stored(h, 1, prompt, 0, 0), d2 = stored(h2, 1, prompt, 0, 0);
    kvi_apply(x, 0, &d1, B);
    kvi_apply(x, 0, &d2, B);
    struct kv_event r1 = removed(h, 1, ""), r2 = removed(h2, 1, "");
    kvi_apply(x, 0, &r1, B);
    kvi_match(x, k, n, 0, out);
    assert_int_equal(out[0], 1);
    kvi_apply(x, 0, &r2, B);
    kvi_match(x, k, n, 0, out);
    assert_int_equal(out[0], 0);
    /* an adapter's block is not the base model's */
    struct kv_event lora = stored(h, 1, prompt, 0, 0);
    kve_set_lora(&lora, "sql-adapter", 11);
    lora.lora_id = 3;
    kvi_apply(x, 0, &lora, B);
    kvi_match(x, k, n, 0, out);
    assert_int_equal(out[0], 0);
    assert_int_equal(kvi_space_for(x, "base-model"), 0);
    assert_int_equal(kvi_space_for(x, NULL), 0);
    uint64_t sp = kvi_space_for(x, "sql-adapter");
    assert_true(sp != 0);
    kvi_match(x, k, n, sp, out);
    assert_int_equal(out[0], 1);
    /* the engine's hash now names the same tokens for the base model: the adapter's block is gone */
    struct kv_event base = stored(h, 1, prompt, 0, 0);
    kvi_apply(x, 0, &base, B);
    kvi_match(x, k, n, sp, out);
    assert_int_equal(out[0], 0);
    kvi_match(x, k, n, 0, out);
    assert_int_equal(out[0], 1);
    assert_int_equal(kvi_blocks(x, 0), 1);
    assert_true(kvi_bytes(x) > 0);
    kvi_free(x);
}

/* Many adapters: every one a key space of its own, beyond the 64 the index once kept a fixed room for (the 65th's
 * requests were then taken for the base model's and credited its blocks); and past the bound, no credit for a
 * model the index cannot tell from an adapter. */
static void many_adapters(void **state)
{
    (void)state;
    setup_prompt();
    struct kvi *x = kvi_new(2, 100000);
    uint64_t h[1] = {5}, k[4];
    uint32_t out[2];
    size_t n = keys_of(prompt, 4, k);
    struct kv_event base = stored(h, 1, prompt, 0, 0); /* rank 0: the base model's block */
    assert_int_equal(kvi_apply(x, 0, &base, B), KVI_OK);
    char name[32];
    for (int a = 0; a < 100; a++) { /* rank 1: the same tokens under 100 adapters */
        uint64_t ha[1] = {1000 + (uint64_t)a};
        struct kv_event e = stored(ha, 1, prompt, 0, 0);
        snprintf(name, sizeof name, "adapter-%d", a);
        kve_set_lora(&e, name, strlen(name));
        assert_int_equal(kvi_apply(x, 1, &e, B), KVI_OK);
    }
    for (int a = 0; a < 100; a++) {
        snprintf(name, sizeof name, "adapter-%d", a);
        uint64_t sp = kvi_space_for(x, name);
        assert_true(sp != 0 && sp != KVI_SPACE_UNKNOWN);
        kvi_match(x, k, n, sp, out);
        assert_int_equal(out[0], 0); /* never the base model's block */
        assert_int_equal(out[1], 1);
    }
    assert_int_equal(kvi_space_for(x, "base-model"), 0);
    kvi_match(x, k, n, 0, out);
    assert_int_equal(out[0], 1);
    assert_int_equal(out[1], 0);
    kvi_free(x);

    /* at most 2 adapters remembered: the third's blocks are not kept, and a model the index does not know may be
     * that adapter, so it matches nothing (the base model's blocks included); remembered ones are as before */
    x = kvi_new(2, 1000);
    kvi_set_max_adapters(x, 2);
    assert_int_equal(kvi_apply(x, 0, &base, B), KVI_OK);
    for (int a = 0; a < 3; a++) {
        uint64_t ha[1] = {1000 + (uint64_t)a};
        struct kv_event e = stored(ha, 1, prompt, 0, 0);
        snprintf(name, sizeof name, "adapter-%d", a);
        kve_set_lora(&e, name, strlen(name));
        assert_int_equal(kvi_apply(x, 1, &e, B), a < 2 ? KVI_OK : KVI_ADAPTERS);
    }
    assert_int_equal(kvi_blocks(x, 1), 2);
    assert_int_equal(kvi_space_for(x, "adapter-2"), KVI_SPACE_UNKNOWN);
    assert_int_equal(kvi_space_for(x, "base-model"), KVI_SPACE_UNKNOWN);
    kvi_match(x, k, n, KVI_SPACE_UNKNOWN, out);
    assert_int_equal(out[0], 0);
    assert_int_equal(out[1], 0);
    uint64_t sp1 = kvi_space_for(x, "adapter-1");
    assert_true(sp1 != 0 && sp1 != KVI_SPACE_UNKNOWN);
    kvi_match(x, k, n, sp1, out);
    assert_int_equal(out[1], 1);
    /* an event of a remembered adapter is still taken */
    uint64_t h9[1] = {9};
    struct kv_event again = stored(h9, 1, prompt + 4, 1, 1001);
    kve_set_lora(&again, "adapter-1", 9);
    assert_int_equal(kvi_apply(x, 1, &again, B), KVI_OK);
    kvi_free(x);
}

static void many_ranks(void **state)
{
    (void)state;
    setup_prompt();
    struct kvi *x = kvi_new(300, 1000);
    uint64_t h[2] = {1, 2}, k[8];
    struct kv_event a = stored(h, 2, prompt, 0, 0), one = stored(h, 1, prompt, 0, 0);
    assert_int_equal(kvi_apply(x, 3, &a, B), KVI_OK);
    assert_int_equal(kvi_apply(x, 250, &one, B), KVI_OK); /* the bitmaps grow from one word to four */
    assert_int_equal(kvi_apply(x, 130, &a, B), KVI_OK);
    uint32_t out[300];
    size_t n = keys_of(prompt, 12, k);
    kvi_match(x, k, n, 0, out);
    assert_int_equal(out[3], 2);
    assert_int_equal(out[250], 1);
    assert_int_equal(out[130], 2);
    assert_int_equal(out[0], 0);
    assert_int_equal(out[299], 0);
    kvi_drop_rank(x, 130);
    kvi_match(x, k, n, 0, out);
    assert_int_equal(out[130], 0);
    assert_int_equal(out[3], 2);
    kvi_free(x);
}

static void extra_keys_are_not_text(void **state)
{
    (void)state;
    setup_prompt();
    struct kvi *x = kvi_new(2, 100);
    uint64_t h[3] = {1, 2, 3}, h2[3] = {4, 5, 6}, k[8], extra[3] = {0, 77, 0}, none[3] = {0, 0, 0};
    struct kv_event img = stored(h, 3, prompt, 0, 0), plain = stored(h2, 3, prompt, 0, 0);
    img.extra = extra; /* block 1 carries an image's hash: it and block 2 are not the text's */
    plain.extra = none; /* entries all None: as if there were none */
    kvi_apply(x, 0, &img, B);
    kvi_apply(x, 1, &plain, B);
    uint32_t out[2];
    size_t n = keys_of(prompt, 12, k);
    kvi_match(x, k, n, 0, out);
    assert_int_equal(out[0], 1);
    assert_int_equal(out[1], 3);
    /* an image over the two halves of router block 1, in engine blocks of half of it: both halves name it, and
     * the block is still not the text's */
    uint64_t h3[6] = {11, 12, 13, 14, 15, 16}, halves[6] = {0, 0, 77, 77, 0, 0};
    struct kv_event small = stored(h3, 6, prompt, 0, 0);
    small.block_size = B / 2;
    small.ntokens = 6 * B / 2;
    small.extra = halves;
    assert_int_equal(kvi_apply(x, 0, &small, B), KVI_OK);
    kvi_match(x, k, n, 0, out);
    assert_int_equal(out[0], 1);
    kvi_free(x);
}

/* A plain model: per rank, engine hash -> content key; a rank holds a key when any of its hashes maps to it. */
#define R 6
#define H 40
static uint64_t model_key[R][H]; /* 0: not held */

static int model_holds(int r, uint64_t key)
{
    for (int i = 0; i < H; i++)
        if (model_key[r][i] == key)
            return 1;
    return 0;
}

static void random_against_a_model(void **state)
{
    (void)state;
    struct kvi *x = kvi_new(R, 100000);
    /* 8 prompts of 6 blocks over a small alphabet: many shared prefixes */
    uint32_t prompts[8][6 * B];
    uint64_t keys[8][6];
    srand(4242);
    for (int p = 0; p < 8; p++) {
        for (int i = 0; i < 6 * B; i++)
            prompts[p][i] = (uint32_t)(p < 4 && i < 2 * B ? i : rand() % 3);
        keys_of(prompts[p], 6 * B, keys[p]);
    }
    memset(model_key, 0, sizeof model_key);
    int deep = 0; /* checks where some rank held 2+ leading blocks: the run is not trivially all zeros */
    for (int step = 0; step < 20000; step++) {
        int r = rand() % R, p = rand() % 8, blk = rand() % 6;
        /* engine hash: the rank's own numbering of (prompt, block), like vLLM's per-content hash */
        uint64_t eh = (uint64_t)(p * 6 + blk) % H;
        if (rand() % 3) { /* store blocks blk.. of prompt p, chained from blk-1 when blk > 0 */
            if (blk > 0 && model_key[r][(p * 6 + blk - 1) % H] != keys[p][blk - 1])
                continue; /* parent not held (or held as other content): an orphan, tested above */
            uint64_t hashes[1] = {eh};
            struct kv_event e = stored(hashes, 1, prompts[p] + blk * B, blk > 0, (uint64_t)(p * 6 + blk - 1) % H);
            assert_int_equal(kvi_apply(x, r, &e, B), KVI_OK);
            model_key[r][eh] = keys[p][blk];
        } else {
            uint64_t hashes[1] = {eh};
            struct kv_event e = removed(hashes, 1, "GPU");
            kvi_apply(x, r, &e, B);
            model_key[r][eh] = 0;
        }
        if (step % 97 == 0) {
            int q = rand() % 8;
            uint32_t out[R];
            kvi_match(x, keys[q], 6, 0, out);
            for (int rr = 0; rr < R; rr++) {
                uint32_t want = 0;
                while (want < 6 && model_holds(rr, keys[q][want]))
                    want++;
                assert_int_equal(out[rr], want);
                deep += want >= 2;
            }
        }
        if (step == 15000)
            for (int i = 0; i < H; i++) { /* rank 2 restarts */
                kvi_drop_rank(x, 2);
                model_key[2][i] = 0;
            }
    }
    assert_true(deep > 20);
    for (int r = 0; r < R; r++) {
        size_t held = 0;
        for (int i = 0; i < H; i++)
            held += model_key[r][i] != 0;
        assert_int_equal(kvi_blocks(x, r), held);
    }
    kvi_free(x);
}

/* The same at scale, where the tables grow, deletions wrap around them and rank bitmaps span two words: 70 ranks,
 * 2,048 engine hashes each drawn at random per store (so a hash often comes to name other content, or the same
 * content under a LoRA adapter's key space), 200 prompts of 8 blocks, removals, ranks dropped and cleared; every
 * rank's block count and leading run checked against the model as it goes. */
#define R2 70
#define H2 2048
#define P2 200
struct held {
    uint64_t key, space; /* key 0: not held */
};
static struct held model2[R2][H2];

static long model2_find(int r, uint64_t key, uint64_t space)
{
    for (int i = 0; i < H2; i++)
        if (model2[r][i].key == key && model2[r][i].space == space)
            return i;
    return -1;
}

static void growth_and_spaces_against_a_model(void **state)
{
    (void)state;
    struct kvi *x = kvi_new(R2, 1000000);
    static uint32_t prompts[P2][8 * B];
    static uint64_t keys[P2][8];
    srand(777);
    for (int p = 0; p < P2; p++) {
        for (int i = 0; i < 8 * B; i++) /* a tenth share their first 3 blocks: chains branch */
            prompts[p][i] = (uint32_t)(p % 10 == 0 && i < 3 * B ? i : 100 + rand() % 50);
        keys_of(prompts[p], 8 * B, keys[p]);
    }
    memset(model2, 0, sizeof model2);
    uint64_t lora = 0;
    size_t deep = 0, grew_from = kvi_bytes(x);
    for (int step = 0; step < 60000; step++) {
        int p = rand() % P2, r = (p + rand() % 3) % R2, adapter = rand() % 4 == 0; /* a prompt on ~3 ranks */
        uint64_t space = adapter ? lora : 0;
        int op = rand() % 100;
        if (op < 70) { /* the next 1-3 blocks after what the rank holds of the prompt, under fresh random hashes */
            int blk = 0;
            long parent = -1, pi;
            while (blk < 8 && (pi = model2_find(r, keys[p][blk], space)) >= 0) {
                parent = pi;
                blk++;
            }
            int k = 1 + rand() % 3;
            if (blk + k > 8)
                continue;
            uint64_t hashes[3];
            for (int i = 0; i < k; i++)
                hashes[i] = (uint64_t)(rand() % H2);
            if (k > 1 && (hashes[1] == hashes[0] || (k > 2 && (hashes[2] == hashes[0] || hashes[2] == hashes[1]))))
                continue; /* one event naming one hash twice: not what an engine sends */
            if (blk && (hashes[0] == (uint64_t)parent || (k > 1 && hashes[1] == (uint64_t)parent) ||
                        (k > 2 && hashes[2] == (uint64_t)parent)))
                continue; /* the parent's own hash reused for its child in one event: neither */
            struct kv_event e = stored(hashes, (size_t)k, prompts[p] + blk * B, blk > 0, (uint64_t)parent);
            if (adapter)
                kve_set_lora(&e, "ad1", 3);
            assert_int_equal(kvi_apply(x, r, &e, B), KVI_OK);
            if (adapter && !lora)
                space = lora = kvi_space_for(x, "ad1");
            for (int i = 0; i < k; i++)
                model2[r][hashes[i]] = (struct held){keys[p][blk + i], space};
        } else if (op < 98) {
            uint64_t hashes[1] = {(uint64_t)(rand() % H2)};
            struct kv_event e = removed(hashes, 1, "GPU");
            kvi_apply(x, r, &e, B);
            model2[r][hashes[0]].key = 0;
        } else if (op < 99) {
            kvi_drop_rank(x, r);
            memset(model2[r], 0, sizeof model2[r]);
        } else {
            struct kv_event e = {.type = KVE_CLEARED, .lora_id = -1, .group_idx = -1, .full_attention = 1};
            assert_int_equal(kvi_apply(x, r, &e, B), KVI_OK);
            memset(model2[r], 0, sizeof model2[r]);
        }
        if (step % 250 == 0) {
            for (int rr = 0; rr < R2; rr++) {
                size_t n = 0;
                for (int i = 0; i < H2; i++)
                    n += model2[rr][i].key != 0;
                assert_int_equal(kvi_blocks(x, rr), n);
            }
            int q = rand() % P2;
            uint64_t sp = rand() % 2 ? lora : 0;
            uint32_t out[R2];
            kvi_match(x, keys[q], 8, sp, out);
            for (int rr = 0; rr < R2; rr++) {
                uint32_t want = 0;
                while (want < 8 && model2_find(rr, keys[q][want], sp) >= 0)
                    want++;
                assert_int_equal(out[rr], want);
                deep += want >= 2;
            }
        }
    }
    assert_true(lora != 0);
    assert_true(deep > 100);
    assert_true(kvi_bytes(x) > 8 * grew_from); /* the tables grew */
    kvi_free(x);
}

/* Churn at one table size: between 300 and 500 blocks held (the tables stay at 1,024 slots, half full at most) out of
 * 2,000 one-block contents, 100,000 stores and removals: every content's block sits at its own place in the table,
 * so deletions inside runs that wrap past the table's end happen many times (the content keys, unlike the pair
 * keys, are not seeded per process: the same every run); after every 40 operations each content is looked up. */
static void churn_at_one_table_size(void **state)
{
    (void)state;
    enum { N = 2000 };
    struct kvi *x = kvi_new(1, 100000);
    static uint32_t toks[N][B];
    static uint64_t key[N];
    static char held[N];
    int live = 0;
    srand(99);
    for (int i = 0; i < N; i++) {
        for (int t = 0; t < B; t++)
            toks[i][t] = (uint32_t)(i * B + t);
        keys_of(toks[i], B, &key[i]);
    }
    memset(held, 0, sizeof held);
    for (int step = 0; step < 100000; step++) {
        int i = rand() % N;
        uint64_t h[1] = {(uint64_t)i + 1};
        if (!held[i] && (live < 300 || (live < 500 && rand() % 2))) {
            struct kv_event e = stored(h, 1, toks[i], 0, 0);
            assert_int_equal(kvi_apply(x, 0, &e, B), KVI_OK);
            held[i] = 1;
            live++;
        } else if (held[i]) {
            struct kv_event e = removed(h, 1, "GPU");
            kvi_apply(x, 0, &e, B);
            held[i] = 0;
            live--;
        }
        if (step % 40 == 0) {
            for (int k = 0; k < N; k++) {
                uint32_t out[1];
                kvi_match(x, &key[k], 1, 0, out);
                assert_int_equal(out[0], held[k]);
            }
            assert_int_equal(kvi_blocks(x, 0), live);
        }
    }
    kvi_free(x);
}

/* Blocks a client aimed at one slot of the content table (prompts tried until the table's slot function, as
 * published but without its seed, put their blocks' keys at multiples of 2^13: the engines store and publish them,
 * and unseeded each stored block then walked one probe run of all the others) land apart: the seed, random per
 * index, is what the client cannot know. */
static uint64_t unseeded_slot(uint64_t k) /* kv_index.c's home() with a seed of 0 */
{
    return xb_slot_mix(k);
}

static void aimed_blocks_do_not_line_up(void **state)
{
    (void)state;
    enum { N = 2000 };
    struct kvi *x = kvi_new(1, 100000);
    assert_non_null(x);
    uint64_t seed = 0x2545f4914f6cdd1dULL, keys[N];
    uint32_t tokens[B];
    for (int i = 0; i < N; i++) {
        do { /* the client's search */
            for (int t = 0; t < B; t++) {
                seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
                tokens[t] = (uint32_t)(seed % 150000);
            }
            keys[i] = xb_hash_block_ids(xb_chain_seed(), tokens, B);
        } while (unseeded_slot(keys[i]) & 0x1fff);
        uint64_t ehash = (uint64_t)i + 1;
        struct kv_event e = stored(&ehash, 1, tokens, 0, 0);
        assert_int_equal(kvi_apply(x, 0, &e, B), KVI_OK);
    }
    assert_int_equal(kvi_blocks(x, 0), N);
    uint32_t out[1];
    kvi_match(x, keys + N - 1, 1, 0, out); /* the last one is found, as a prompt of its tokens would find it */
    assert_int_equal(out[0], 1);
    /* unseeded: one run of all N; seeded: ~log of the table's slots */
    assert_in_range(kvi_longest_run(x), 1, 100);
    kvi_free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(chains_and_removals),
        cmocka_unit_test(refusals),
        cmocka_unit_test(engine_blocks_of_several),
        cmocka_unit_test(engine_blocks_smaller_than_the_routers),
        cmocka_unit_test(media_duplicates_and_lora),
        cmocka_unit_test(many_adapters),
        cmocka_unit_test(many_ranks),
        cmocka_unit_test(extra_keys_are_not_text),
        cmocka_unit_test(random_against_a_model),
        cmocka_unit_test(growth_and_spaces_against_a_model),
        cmocka_unit_test(churn_at_one_table_size),
        cmocka_unit_test(aimed_blocks_do_not_line_up),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
