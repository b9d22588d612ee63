/* SPDX-License-Identifier: Apache-2.0 */
/* xb_prefix.h - prefix index: which blocks of a prompt each rank probably holds in its prefix cache.
 *
 * A prompt is cut into blocks of a fixed number of tokens; each full block is identified by a chained 64-bit
 * hash (xxHash3 of the block's content, seeded with the previous block's hash), so two prompts share the
 * hashes of exactly the blocks of their common prefix. Per rank the index keeps an approximate set of such
 * hashes: bounded per rank (LRU eviction), optionally aged out (TTL), and bounded as a whole in bytes.
 *
 * Approximation, on purpose: a chain is inserted last block first, so its first block is the most recently
 * used and LRU eviction removes a chain from its end. The blocks a rank holds of one chain are then (almost
 * always) a prefix of it, and the longest cached prefix is found by binary search: about log2(blocks) probes
 * per rank instead of one per block (an 8k-token prompt against 64 ranks: ~640 probes).
 *
 * Pure: no I/O, no clock, no locking (the pool's mutex covers it); its answers are deterministic for a given
 * sequence of calls (only where entries sit in its table is seeded at random, see xb_slot_mix). Times are passed
 * in (µs, any monotonic origin). */
#ifndef XB_PREFIX_H
#define XB_PREFIX_H

#include <stddef.h>
#include <stdint.h>

/* Chained hashes of the full blocks of a token-id prompt (block_tokens ids per block, each hashed as a
 * little-endian 64-bit value). Returns the number written (at most cap); a trailing partial block has none. */
size_t xb_hash_tokens(const int64_t *ids, size_t n, size_t block_tokens, uint64_t *out, size_t cap);
/* Same over bytes (a text prompt, or a chat's canonical serialization), block_bytes bytes per block. */
size_t xb_hash_bytes(const void *data, size_t len, size_t block_bytes, uint64_t *out, size_t cap);
/* One link of the token-id chain: the hash of a block of n ids after the block hashed prev (a chain's first
 * block: prev = xb_chain_seed()). xb_hash_tokens' k-th value is this applied k+1 times. */
uint64_t xb_hash_block_ids(uint64_t prev, const uint32_t *ids, size_t n);
uint64_t xb_chain_seed(void);

/* Where a table keyed by block hashes puts a key: the key, already xored with the table's random seed, through
 * MurmurHash3's finalizer (every output bit depends on every input bit). A client chooses its prompts' blocks;
 * with a published mix and no seed it could try blocks until thousands shared one slot, and each insert then
 * walked one probe run of them all (65,000 such blocks: 57 x slower). This index and the KV-event index
 * (router/kv_index.c) place their keys with it; their tests aim blocks at it unseeded. */
static inline uint64_t xb_slot_mix(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    return k ^ (k >> 33);
}
/* The same chain over bytes fed in pieces (a prompt decoded as it is read, never held whole): the hashes equal
 * xb_hash_bytes over the concatenation. Out of memory aborts. */
struct xb_hasher;
struct xb_hasher *xb_hasher_new(size_t block_bytes);
void xb_hasher_feed(struct xb_hasher *h, const void *data, size_t len);
/* Ids as little-endian 64-bit values, as xb_hash_tokens hashes them (block_bytes = 8 x block tokens). */
void xb_hasher_feed_id(struct xb_hasher *h, int64_t id);
/* What else names each block besides its bytes (an engine's extra keys: vLLM's cache_salt on the first block):
 * extra[0] for the first block, extra[1] for the others (0 or NULL: none), mixed into the chain by xb_chain_extra
 * so the block and every one after it differ. Set before feeding. */
void xb_hasher_extra(struct xb_hasher *h, const uint64_t extra[2]);
uint64_t xb_chain_extra(uint64_t chain, uint64_t extra);
/* Frees h; *out gets the hashes (malloc'd, NULL when there are none); returns how many. */
size_t xb_hasher_finish(struct xb_hasher *h, uint64_t **out);

struct xb_prefix;

/* An empty index. per_rank_blocks: LRU capacity of each rank (>= 1); max_bytes: bound on the whole index's
 * memory (>= 4096); ttl_us: blocks older than this count as absent (0 = no TTL). NULL on OOM. */
struct xb_prefix *xb_prefix_new(long per_rank_blocks, size_t max_bytes, uint64_t ttl_us);
void xb_prefix_free(struct xb_prefix *x);
/* A rank's own capacity in blocks (e.g. the engine's num_gpu_blocks); <= 0 goes back to the default. */
void xb_prefix_set_capacity(struct xb_prefix *x, int rank, long blocks);
/* Number of leading blocks of h[0..n) that rank holds (not older than the TTL at now_us). */
size_t xb_prefix_match(const struct xb_prefix *x, int rank, const uint64_t *h, size_t n, uint64_t now_us);
/* The same counting only blocks recorded (sent to the rank) at or after since_us. */
size_t xb_prefix_match_since(const struct xb_prefix *x, int rank, const uint64_t *h, size_t n, uint64_t now_us,
                             uint64_t since_us);
/* Records h[0..n) as held by rank, most recently used; evicts what the bounds require. 0 or -ENOMEM (then
 * the index is unchanged for the blocks not recorded). */
int xb_prefix_insert(struct xb_prefix *x, int rank, const uint64_t *h, size_t n, uint64_t now_us);
/* Forgets everything rank holds (a removed or restarted engine). */
void xb_prefix_drop_rank(struct xb_prefix *x, int rank);
/* A rank's capacity in blocks (its own, or the default). */
long xb_prefix_capacity_of(const struct xb_prefix *x, int rank);
/* Blocks rank holds; bytes the whole index uses (entries and hash table). */
size_t xb_prefix_blocks(const struct xb_prefix *x, int rank);
size_t xb_prefix_bytes(const struct xb_prefix *x);
/* Bytes one block costs in the index (for sizing --prefix-index-max-bytes). */
size_t xb_prefix_entry_bytes(void);
/* The longest run of occupied slots in its table: what a lookup of an absent block probes at worst (tests: blocks
 * a client aimed at one slot do not line up, the slots being seeded at random). */
size_t xb_prefix_longest_run(const struct xb_prefix *x);

#endif
