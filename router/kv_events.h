/* SPDX-License-Identifier: Apache-2.0 */
/* kv_events.h - engines' KV-cache events (issue 40), decoded: one msgpack KVEventBatch as vLLM and SGLang publish
 * it on ZeroMQ, in either of the two encodings in production (kv_events.c). Pure: no sockets, any thread.
 *   batch: {"ts", "events", "data_parallel_rank"} or [ts, events, data_parallel_rank?]
 *   event: {"type": "BlockStored"|"BlockRemoved"|"AllBlocksCleared", ...} or ["BlockStored", block_hashes,
 *          parent_block_hash, token_ids, block_size, lora_id, medium, lora_name, extra_keys, group_idx,
 *          kv_cache_spec_kind, ...] (trailing defaults omitted), ["BlockRemoved", block_hashes, medium,
 *          group_idx], ["AllBlocksCleared"]
 * Unknown keys and trailing elements are ignored; a block hash is an unsigned or signed 64-bit integer, or bytes
 * (the last 8, big-endian). Every count is bounded (struct kve_limits). */
#ifndef XPYD_KV_EVENTS_H
#define XPYD_KV_EVENTS_H

#include <stddef.h>
#include <stdint.h>

enum kve_type { KVE_STORED = 1, KVE_REMOVED, KVE_CLEARED };

struct kv_event {
    enum kve_type type;
    uint64_t *hashes;     /* block_hashes (the engine's), nhashes of them */
    size_t nhashes;
    int has_parent;
    uint64_t parent;      /* parent_block_hash */
    uint32_t *tokens;     /* BlockStored: token_ids of the blocks, ntokens (nhashes × block_size when whole) */
    size_t ntokens;
    uint64_t *extra;      /* BlockStored: per block, a hash of its extra_keys entry (0: none); NULL: none at all */
    long block_size;      /* 0: not given */
    int64_t lora_id;      /* -1: none */
    char lora_name[64];   /* "": none; its first 63 bytes, for messages (the adapter is lora_hash: kve_set_lora) */
    size_t lora_len;      /* the whole name's length (0: none) */
    uint64_t lora_hash;   /* XXH3-64 of the whole name: names alike in their first 63 bytes are different adapters */
    char medium[16];      /* "": not given (vLLM's GPU) */
    long group_idx;       /* -1: not given */
    int full_attention;   /* kv_cache_spec_kind absent or "full_attention": the groups that drive routing */
};

struct kv_batch {
    double ts;
    long dp_rank;         /* -1: not given */
    struct kv_event *ev;
    size_t n;
};

struct kve_limits {
    size_t max_events;    /* per batch */
    size_t max_hashes;    /* per event */
    size_t max_tokens;    /* per event */
};

/* Why a payload was refused (counted by cause). */
enum kve_error { KVE_OK = 0, KVE_EMSGPACK, KVE_ESHAPE, KVE_ETYPE, KVE_EHASH, KVE_ELIMIT, KVE_ENOMEM, KVE_ECOUNT };
extern const char *const kve_error_names[KVE_ECOUNT];

/* Decodes one payload into *out (kve_batch_free it). KVE_OK, or the cause with a message in err. */
int kve_decode(const void *buf, size_t len, const struct kve_limits *lim, struct kv_batch *out, char *err,
               size_t errlen);
void kve_batch_free(struct kv_batch *b);
/* An event's LoRA adapter: the whole name hashed (lora_hash, what keys its blocks), its start kept to print. */
void kve_set_lora(struct kv_event *e, const char *name, size_t len);
/* The hash a block's extra_keys entry of n strings is kept by (what a request adds to its blocks: vLLM's
 * cache_salt on the first block is the entry [salt]); 0 when n is 0. */
uint64_t kve_extra_hash(const char *const *strs, const size_t *lens, int n);

#endif
