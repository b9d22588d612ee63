/* SPDX-License-Identifier: Apache-2.0 */
/* xb.h - xpyd balancer: pools of instances (DP ranks), their load, and pick/charge/release.
 *
 * Pure policy: no sockets, no event loop. All functions are thread-safe (one short mutex per pool, never
 * held across I/O). Load is charged by the caller at pick time and released by exactly the same amount;
 * after every request has ended, every instance's load is zero. */
#ifndef XB_H
#define XB_H

#include <stddef.h>
#include <stdint.h>

enum xb_policy { XB_POLICY_LOT = 0, XB_POLICY_P2C, XB_POLICY_RR, XB_POLICY_RANDOM, XB_POLICY_CACHE };

/* What placement needs to know of an instance: its capacity and limits. Who the instance is (host, port, DP
 * rank, engine-specific ports) is the caller's registry's business; the balancer knows instances by index. */
struct xb_instance_cfg {
    int tp;               /* tensor-parallel size, >= 1 */
    int weight;           /* relative capacity, >= 1 */
    long max_model_len;   /* 0: unknown (no filtering) */
    int max_inflight;     /* requests the engine runs at once (vLLM max_num_seqs); 0 = unknown */
    uint64_t key;         /* stable identity (e.g. a hash of host:port/rank) for session hashing; 0: the index */
};

struct xb_instance_stats {
    int tp, weight, healthy, max_inflight;
    long max_model_len;         /* configured (0: none) */
    long learned_max_model_len; /* reported by its engine (xb_set_learned_max_model_len; 0: none) */
    int64_t inflight;         /* requests charged and not yet released */
    int64_t outstanding;      /* tokens charged and not yet released */
    uint64_t selected;        /* picks */
    int64_t feedback;         /* engine-reported load blended in, in tokens (0 without scraping) */
    int64_t remote, remote_inflight; /* other routers' published load on it (xb_set_remote) */
    int ejected;              /* passively ejected right now (consecutive failures) */
    uint64_t ejections;       /* times it was ejected */
    int removed;              /* taken out at runtime; in-flight requests on it finish */
    int failing;              /* its last attempt reported to xb_report failed, or two decodes lost its KV since */
    int ready;                /* usable as far as its description goes (xb_set_ready) */
    int64_t prefix_blocks;    /* prefix index: blocks recorded on it, and its capacity (0, 0: index off) */
    int64_t prefix_capacity;
};

struct xb_pool;

/* Returns a new empty pool, or NULL on OOM. seed makes random choices deterministic. */
struct xb_pool *xb_pool_new(int policy, uint64_t seed);
void xb_pool_free(struct xb_pool *p);
/* Reserves room for cap instances once; afterwards the array never moves, so xb_pool_add may run while
 * other threads pick (it then fails with -ENOSPC when full). Call before any concurrent use. */
int xb_pool_reserve(struct xb_pool *p, size_t cap);
/* Adds an instance; returns its index, or -ENOMEM / -EINVAL / -ENOSPC. Concurrent with picks only after
 * xb_pool_reserve. Indices are stable for the pool's life. */
int xb_pool_add(struct xb_pool *p, const struct xb_instance_cfg *cfg);
/* Runtime membership: a removed instance is never picked (in-flight requests finish); 0 puts it back with
 * a clean health/ejection state. */
int xb_set_removed(struct xb_pool *p, int idx, int removed);
/* A removed instance's index given to another engine: its state starts afresh (health, ejection, counts, its
 * prefix-index entries, capacity), as a new instance's would. -EBUSY unless it is removed with nothing in
 * flight (nothing this router charged on it is outstanding), -EINVAL for a bad index or configuration. */
int xb_reuse(struct xb_pool *p, int idx, const struct xb_instance_cfg *cfg);
/* Updates tp, weight, max_model_len, max_inflight of an instance. */
int xb_update(struct xb_pool *p, int idx, const struct xb_instance_cfg *cfg);
size_t xb_pool_size(const struct xb_pool *p);
/* The max_model_len the instance's engine reports (its /v1/models; 0: none): what placement holds it to when
 * its configuration gives none. Kept apart from the configuration (xb_update leaves it; xb_reuse clears it). */
void xb_set_learned_max_model_len(struct xb_pool *p, int idx, long mml);
/* The largest max_model_len (configured, else learned) among the instances that may be picked (healthy, ready,
 * not removed); 0 when one of them has none (unknown: no limit) or none may be picked. */
long xb_max_model_len(struct xb_pool *p);
int xb_policy_parse(const char *s); /* lot|p2c|rr|random, -1 if unknown */
const char *xb_policy_name(int policy);

/* Picks an eligible instance (healthy, not in exclude, max_model_len >= need_len when known) and charges
 * it one in-flight request and `tokens` outstanding tokens. Instances at their max_inflight are passed over
 * while any eligible one has room (a full engine would queue the request); when all are full, the policy
 * chooses among all of them — unless the pool has a hard cap (xb_set_hard_cap), then it returns -EBUSY.
 * Returns the index, -ENOENT when no instance is healthy (and not excluded), or -E2BIG when healthy ones
 * exist but none can hold need_len tokens. */
int xb_pick(struct xb_pool *p, uint64_t need_len, int64_t tokens, const int *exclude, int nexclude);
/* on: max_inflight is a hard limit per instance (the caller queues when xb_pick returns -EBUSY). */
void xb_set_hard_cap(struct xb_pool *p, int on);
/* Adds delta (may be negative) to an instance's outstanding tokens (e.g. corrected prompt size). */
void xb_adjust(struct xb_pool *p, int idx, int64_t delta);
/* Ends one request on idx: releases one in-flight and `tokens` outstanding tokens. */
void xb_release(struct xb_pool *p, int idx, int64_t tokens);
void xb_set_healthy(struct xb_pool *p, int idx, int healthy);
/* ready 0: never picked until it is 1 again (an engine whose own description, e.g. vLLM MooncakeConnector's
 * /query, has not been read). Instances start ready; separate from health, which the probe owns. */
void xb_set_ready(struct xb_pool *p, int idx, int ready);
/* Engine feedback (from its /metrics), in tokens, added to the router's own outstanding tokens when the
 * policy compares loads. Lock-free; any thread. */
void xb_set_feedback(struct xb_pool *p, int idx, int64_t tokens);
/* Router replicas: what the other routers report charging idx (tokens, requests), added to this router's own
 * load when the policy compares (kept apart from it: xb_release never touches it). Lock-free; any thread. */
void xb_set_remote(struct xb_pool *p, int idx, int64_t tokens, int64_t inflight);
/* Passive ejection: after `after` consecutive failures an instance is skipped for base_ms, doubling per
 * repeated ejection up to max_ms; at most half of the pool (rounded down) is ejected at once. after 0 = off. */
void xb_set_ejection(struct xb_pool *p, int after, long base_ms, long max_ms);
/* Reports the outcome of one attempt on idx (failure: connect error, timeout, 5xx; never a 4xx). Returns the
 * ejection time in ms when this report ejected the instance, else 0. Thread-safe. */
long xb_report(struct xb_pool *p, int idx, int ok);
/* Ends idx's ejection and its failure streak (an engine seen starting again: its failures were the old
 * process's); the next ejection starts at base_ms. 1 when it was ejected. Thread-safe. */
int xb_unejected(struct xb_pool *p, int idx);
/* The same, for a failure for want of what another instance, src (in its own pool), should have provided: a
 * decode's 5xx before taking the KV a prefill held (-1: none). src_uses is xb_uses(src) now. Consecutive failures
 * lacking the same src, which no one used successfully in between (src_uses unchanged), count once toward
 * ejection: a prefill's crash does not eject the decodes that were about to pull its KV, while a decode that
 * cannot use a prefill the others use is ejected as before. */
long xb_report_from(struct xb_pool *p, int idx, int ok, int src, uint64_t src_uses);
/* Instance idx's output was used (a decode answered with the KV a prefill held); xb_uses counts them. */
void xb_report_used(struct xb_pool *p, int idx);
uint64_t xb_uses(struct xb_pool *p, int idx);
/* Instance idx (a prefill) held KV that a decode (by, an index in the decode pool) failed to use. Once two
 * different decodes have since idx's last success, idx counts as failing (xb_instance_stats.failing) until its
 * next success: one broken decode never blames it. Returns failing. Thread-safe. */
int xb_report_kv_lost(struct xb_pool *p, int idx, int by);

/* ---------- cache-aware placement and session affinity ---------- */

/* One placement question with everything the cache and session choices need. */
struct xb_query {
    uint64_t need_len;         /* prompt + max tokens, against max_model_len */
    int estimated;             /* need_len is a guess: held to configured max_model_lens only, never to what an
                                * engine reported (xb_set_learned_max_model_len): a guess refuses nothing the
                                * engine would take unless the operator set the length */
    int64_t tokens;            /* the request's cost on a rank holding none of its prefix */
    const uint64_t *blocks;    /* chained block hashes of its prompt (xb_prefix.h), NULL: none */
    size_t nblocks;
    int64_t block_tokens;      /* tokens one block stands for */
    const int64_t *precise;    /* per instance: leading blocks of them it reports holding (engines' KV events), or
                                * -1 where that is not known (the prefix index's guess then); NULL: none */
    const uint64_t *pending_since; /* with precise: per instance, blocks the pool's index recorded sending it at or
                                    * after this time (µs, CLOCK_MONOTONIC; 0: none) count as held though its
                                    * events have not told them yet */
    const uint16_t *pending_unit;  /* with pending_since: per instance, its engine holds a multiple of this many
                                    * blocks (its own blocks are that many of ours); NULL: 1 */
    uint64_t session;          /* hash of its session key; 0: no session */
    const int *exclude;
    int nexclude;
    int peek;                  /* 1: only say what would be chosen (nothing charged, the index unchanged) */
    /* results */
    int64_t cached;            /* tokens of its prefix the chosen rank probably holds (index on), else 0 */
    int64_t charged;           /* tokens charged on the chosen rank: tokens - cached; release exactly this */
    int by_session;            /* 1: the session's rank on the ring took it */
};

/* Turns on the pool's prefix index (see xb_prefix.h for the bounds). The `cache` policy then costs a rank
 * (load + the request's uncached tokens) / capacity; a rank whose load per capacity exceeds max_imbalance ×
 * max(the pool's mean, the request's own tokens per capacity), or that is at its max_inflight, gets no credit
 * for its cache. With any policy, picks record the request's blocks on the chosen rank and report `cached`.
 * 0, -EINVAL or -ENOMEM. Call before concurrent use. */
int xb_prefix_enable(struct xb_pool *p, long per_rank_blocks, size_t max_bytes, long ttl_ms, double max_imbalance);
/* The cache policy's cost becomes load + weight × uncached tokens (weight >= 1; 1 by default, the plain
 * formula). Above 1 a rank without the prefix must be that much less loaded to win: computing a prefix
 * somewhere new also costs cache room that the prefix's next requests would have hit. */
void xb_cache_weight(struct xb_pool *p, double weight);
/* A rank's own cache size in blocks (engine-reported num_gpu_blocks); <= 0: the default. */
void xb_prefix_capacity(struct xb_pool *p, int idx, long blocks);
/* Memory the prefix index uses, in bytes (0 when off). */
size_t xb_prefix_memory(struct xb_pool *p);
/* Session affinity: a query with a session goes to the first rank clockwise from the session's hash on a
 * consistent-hash ring (64 points per rank, from cfg.key) whose load is within (1 + epsilon) × the pool's mean
 * load counting this request (consistent hashing with bounded loads); epsilon < 0 turns it off. */
void xb_session_enable(struct xb_pool *p, double epsilon);
/* Picks like xb_pick with the query's prefix and session; charges q->charged (unless q->peek). */
int xb_pick_q(struct xb_pool *p, struct xb_query *q);
/* 1 when every usable instance is at its max_inflight (instances without one are never full). */
int xb_saturated(struct xb_pool *p);

/* Copies instance idx's numbers. 0 or -EINVAL. */
int xb_stats(struct xb_pool *p, int idx, struct xb_instance_stats *out);
/* Sum of in-flight and outstanding over the pool (tests: both return to zero). */
void xb_totals(struct xb_pool *p, int64_t *inflight, int64_t *outstanding);

#endif
