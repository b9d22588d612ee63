/* SPDX-License-Identifier: Apache-2.0 */
/* kv_sub.h - the engines' KV events, consumed (issue 40): one thread subscribes with libzmq to every rank that
 * has a KV-event endpoint (the topology's "kv_events", --prefill/decode-kv-events-port) and hears engines that
 * connect to --kv-events-bind (the topic names the engine, the port's offset its DP rank), decodes each batch
 * (kv_events.h) and keeps per pool what each rank reports holding (kv_index.h). Sequence numbers per rank: a
 * gap asks the rank's replay endpoint (--kv-events-replay-offset) or forgets the rank's blocks; a number going
 * back (the engine restarted), AllBlocksCleared and a lost connection forget them too (the connection's loss and
 * return are also hints for the health checks: rt_kv_take_hint). A rank that is not connected,
 * or that was sent a prompt of a block or more and published nothing for --kv-events-stale-ms, is not trusted until
 * it publishes again. The registry is
 * followed (reloads, the admin API, etcd): a rank whose endpoint changes or that is removed starts afresh. */
#ifndef XPYD_KV_SUB_H
#define XPYD_KV_SUB_H

#include <stddef.h>
#include <stdint.h>

struct router;
struct evbuffer;
struct xb_query;

/* Starts the consumer when a pool has KV-event endpoints (0, or -1 with a message). */
int rt_kv_setup(struct router *rt);
void rt_kv_stop(void);

/* A pick's prompt blocks into q (blocks of --prefix-block-tokens) and, for pool role, per instance (every slot)
 * the leading blocks of them the rank reports holding, or -1 where its events are not trusted (none, stale) and
 * placement stays approximate (q->precise NULL when none is trusted). Valid until the thread's next call. */
void rt_kv_query(struct xb_query *q, int role, const uint64_t *blocks, size_t n, const char *model);
/* After a pick with that query: a rank sent a prompt of a block or more should publish (the staleness clock),
 * and the pick is counted precise or approximate. Returns what rt_kv_released takes when the request leaves the
 * rank (until then its blocks are pending there, --kv-events-pending-ms), 0 when nothing. */
uint64_t rt_kv_picked(int role, int idx, const struct xb_query *q);
void rt_kv_released(int role, int idx, uint64_t pending);
/* What else names a request's prompt blocks as the engines key them (their extra_keys; a LoRA adapter is the
 * index's key space instead): vLLM's cache_salt on the first block. 1 when any, into extra[2] for
 * rw_prefix_blocks / rw_id_blocks. */
struct rw_src;
int rt_kv_extras(const struct rw_src *body, uint64_t extra[2]);
/* The publishers' connections as hints for the health checks (probe.c): KV_HINT_GONE when rank idx's publisher
 * went away (an engine stopping or crashing drops it at once), KV_HINT_BACK when it connected (an engine started
 * again), the latest since the last call; 0 none. Connect mode only (a bound port serves many engines). */
enum { KV_HINT_NONE, KV_HINT_GONE, KV_HINT_BACK };
int rt_kv_take_hint(int role, int idx);
/* wake(arg) is called, from the consumer's thread, after a hint is left (NULL: none). Returns once no call of the
 * previous one is under way. */
void rt_kv_on_hint(void (*wake)(void *), void *arg);
/* A model name an engine's GET /v1/models lists as a LoRA adapter (probe.c): its requests are matched in its own
 * key space from now on, before any rank reports blocks under it (callback of probe_parse_models_adapters). */
void rt_kv_adapter_listed(void *unused, const char *name, size_t n);
/* The xpyd_kv_* series of /metrics. */
void rt_kv_metrics(struct evbuffer *b);

#endif
