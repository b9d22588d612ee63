/* SPDX-License-Identifier: Apache-2.0 */
/* sim_blocks.h - xpyd_sim's prefix cache: its own model of vLLM's block pool (vllm/v1/core/block_pool.py), written
 * apart from the router's index (balancer/xb_prefix.c) so that the router's prediction is checked against an
 * independent truth. Per rank, --num-gpu-blocks blocks: a prompt's full blocks are cached under a hash chained
 * from their parent's (SHA-256 of the parent's hash and the block's token ids, as 32 bytes: a stand-in for vLLM's
 * sha256_cbor, whose bytes the router never needs); blocks no request uses wait in a free queue, least recently
 * used first, and a block needed for a new prompt is taken from its head, evicting what it cached. A request's
 * blocks return to the queue in reverse order (its last block is evicted first), as vLLM frees them. Every
 * block cached or evicted is reported to sim_kvpub (KV events) when it is on. */
#ifndef XPYD_SIM_BLOCKS_H
#define XPYD_SIM_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

struct sim_rank;
struct sim_pool;

struct sim_pool *sim_pool_new(size_t nblocks, size_t block_size);
void sim_pool_free(struct sim_pool *p);

/* The prompt's full blocks are now cached (held ones touched, the others stored, evicting the least recently
 * used); events go to rank rk's publisher. salt (NULL none): the request's cache_salt, part of its first block's
 * hash as in vLLM (so its blocks and every one after them are its own). *held (may be NULL): how many leading blocks the pool held before.
 * Returns how many blocks are cached (fewer when the pool is smaller). */
size_t sim_pool_store(struct sim_pool *p, struct sim_rank *rk, const uint32_t *ids, size_t n, const char *salt,
                      size_t *held);
/* Everything forgotten (POST /reset_prefix_cache): AllBlocksCleared. */
void sim_pool_clear(struct sim_pool *p, struct sim_rank *rk);
size_t sim_pool_cached(const struct sim_pool *p);

#endif
