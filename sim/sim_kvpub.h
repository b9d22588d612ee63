/* SPDX-License-Identifier: Apache-2.0 */
/* sim_kvpub.h - xpyd_sim's KV events (--kv-events), published as vLLM publishes them: per DP rank a ZeroMQ PUB
 * socket on the endpoint's port + rank (an endpoint with `*` binds, any other connects, as vLLM's rule), each
 * message three frames: the topic (--kv-events-topic), an 8-byte big-endian sequence number from 0, a msgpack
 * KVEventBatch (--kv-events-format map: {"ts", "events", "data_parallel_rank"} with {"type": ...} events, as
 * current vLLM; array: positional, tagged by the class name, trailing defaults omitted, as vLLM before mid-2026).
 * --kv-events-replay ENDPOINT (port + rank): a ROUTER socket answering an 8-byte start sequence number with the
 * buffered (seq, payload) pairs from it (the last --kv-events-buffer batches) and then (-1, empty).
 * Events accumulate per rank and go out as one batch at sim_kvpub_flush. */
#ifndef XPYD_SIM_KVPUB_H
#define XPYD_SIM_KVPUB_H

#include <stddef.h>
#include <stdint.h>

struct sim;
struct sim_rank;

int sim_kvpub_start(struct sim *s); /* 0, or -1 logged */
void sim_kvpub_stop(struct sim *s);

/* salt (NULL none): the first block's extra key, as vLLM sends a cache_salt: extra_keys [[salt], None, ...] */
void sim_kvpub_stored(struct sim_rank *rk, const unsigned char (*hashes)[32], size_t n, const unsigned char *parent,
                      const uint32_t *tokens, size_t ntokens, size_t block_size, const char *salt);
void sim_kvpub_removed(struct sim_rank *rk, const unsigned char (*hashes)[32], size_t n);
void sim_kvpub_cleared(struct sim_rank *rk);
void sim_kvpub_flush(struct sim_rank *rk);

#endif
