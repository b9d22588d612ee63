/* SPDX-License-Identifier: Apache-2.0 */
/* kv_index.h - what each rank of a pool reports holding in its prefix cache (issue 40): the blocks of the KV
 * events it published (kv_events.h), keyed by their token content as the router hashes a prompt's blocks
 * (xb_hash_block_ids, chained from the parent block), never by the engine's own hash (vLLM's is pickle-based);
 * the engine's hash is kept per rank only to find a block again on removal and as the next block's parent. A block
 * with extra keys (multimodal hashes, a cache salt) is mixed with them, so it and the blocks after it never match a
 * prompt of the same token ids alone.
 *
 * Two tables: content key -> which ranks hold it (a bitmap), and (rank, engine hash) -> content key, the
 * entries of one content key linked so a removal recomputes that rank's bit from the others. A block under a
 * LoRA adapter lives in the adapter's key space (its content key mixed with the adapter's name), never the base
 * model's. Bounded: at most max_blocks (rank, block) pairs; beyond, stored blocks are not kept (counted).
 * An engine whose blocks are m times the router's (vLLM --block-size 64 under --prefix-block-tokens 16) has each
 * of its blocks kept as m of the router's, the last under the engine's hash (the next block's parent) and the
 * others under hashes derived from it (found again on removal); a rank's match is then a multiple of m blocks, as
 * the engine hits whole blocks of its own only. An engine whose blocks are a k-th of the router's (SGLang's
 * --page-size 1: a block a token) has each of them that does not end a router block kept as a piece (its tokens,
 * its parent) until the one that ends it comes, which is keyed from them. Pieces count against max_blocks too.
 * Thread-safe (a rwlock: lookups share it, events take it alone). */
#ifndef XPYD_KV_INDEX_H
#define XPYD_KV_INDEX_H

#include "kv_events.h"

#include <stddef.h>
#include <stdint.h>

struct kvi;

/* Why an event was not (wholly) applied, counted by cause. */
enum kvi_skip {
    KVI_OK = 0,
    KVI_NOT_FULL_ATTENTION, /* a sliding-window or mamba group: does not drive routing */
    KVI_BLOCK_SIZE,         /* block_size neither a multiple nor a divisor of --prefix-block-tokens: never match */
    KVI_SHAPE,              /* token_ids not block_size x block_hashes */
    KVI_ORPHAN,             /* the parent block is unknown (missed, or evicted before): its chain cannot be keyed */
    KVI_FULL,               /* max_blocks reached */
    KVI_NOMEM,
    KVI_ADAPTERS,           /* a LoRA adapter's name when max adapters were already remembered: not kept */
    KVI_COUNT
};
extern const char *const kvi_skip_names[KVI_COUNT];
#define KVI_MAX_PARTS 256 /* an engine's block at most this many of the router's (else KVI_BLOCK_SIZE) */

struct kvi *kvi_new(int nranks, size_t max_blocks);
void kvi_free(struct kvi *x);
/* At most n LoRA adapter names remembered (1024 unless set; each a key space): the blocks of an adapter beyond
 * them are not kept (KVI_ADAPTERS), and from then on a model name not remembered is not taken for the base
 * model (kvi_space_for). */
void kvi_set_max_adapters(struct kvi *x, size_t n);
/* A model name known to be a LoRA adapter before any block is stored under it (an engine's GET /v1/models lists
 * it with a parent): its requests get its key space, not the base model's. 0, KVI_ADAPTERS or KVI_NOMEM. */
int kvi_add_adapter(struct kvi *x, const char *name, size_t len);
size_t kvi_adapters(struct kvi *x); /* adapter names remembered */

/* Applies one event of rank r (block_tokens: the router's block size). KVI_OK or why (not) applied. */
int kvi_apply(struct kvi *x, int rank, const struct kv_event *ev, long block_tokens);
/* Forgets everything rank r holds (AllBlocksCleared, an engine restart, a source gone or replaced). */
void kvi_drop_rank(struct kvi *x, int rank);

/* The key space of a request for `model` (0: the base model): an adapter's when some rank stored blocks under a
 * LoRA of that name, else the base model's — unless an adapter's name was refused for want of room (max
 * adapters): then a model not remembered may be such an adapter and gets KVI_SPACE_UNKNOWN, which holds no block
 * (no credit rather than the base model's, whose blocks an adapter's request never hits). */
#define KVI_SPACE_UNKNOWN (1ull << 63)
uint64_t kvi_space_for(struct kvi *x, const char *model);
/* out[r] (r < nranks) = how many leading blocks of keys[0..n) rank r holds in key space `space` (a multiple of
 * its engine's blocks, in the router's). */
void kvi_match(struct kvi *x, const uint64_t *keys, size_t n, uint64_t space, uint32_t *out);
/* The same, and units[r] = the router's blocks in one of rank r's engine blocks (1 until it stored blocks larger
 * than the router's): what the engine will hold of blocks sent to it is a multiple of it. */
void kvi_match_units(struct kvi *x, const uint64_t *keys, size_t n, uint64_t space, uint32_t *out, uint16_t *units);

size_t kvi_blocks(struct kvi *x, int rank); /* (rank, block) pairs of one rank */
size_t kvi_pieces(struct kvi *x);           /* engine blocks kept as pieces of router blocks, all ranks */
size_t kvi_bytes(struct kvi *x);            /* memory held by the tables */
size_t kvi_longest_run(struct kvi *x);      /* occupied slots in a row in the content table: its worst probe */

#endif
