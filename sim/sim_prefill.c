/* SPDX-License-Identifier: Apache-2.0 */
/* sim_prefill.c - what a simulated prefill keeps for its decode: the KV lease a decode pulls (kv-params, xpyd:
 * registered with the transfer engine), the store key, the bootstrap room, the mooncake transfer id; and the
 * prefix cache of --prefix-caching (vLLM's: a prompt's full blocks, chained hashes, per rank). */
#include "sim_internal.h"

#include "xpyd_util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A lease's KV registered with the transfer engine must leave the engine before its memory is freed
 * (unregistering waits for peers reading it). */
void sim_lease_unregister(void *arg, struct sim_lease *l)
{
    struct sim *s = arg;
    if (s->xt && l->kv)
        xt_unregister_memory(s->xt, l->kv);
}

void sim_lease_drop(struct sim *s, struct sim_lease *l)
{
    sim_lease_unregister(s, l);
    sim_lease_free(l);
}

int sim_register_kv_params(struct sreq *r)
{
    struct sim *s = r->sim;
    size_t kvlen;
    unsigned char *kv = sim_kv_make(r, &kvlen);
    size_t nblocks = (r->p.prompt.n + 15) / 16;
    uint64_t base = r->rank->next_block;
    r->rank->next_block += nblocks;
    uint64_t sig = XPYD_FNV_INIT;
    cJSON *o = XPYD_XALLOC(cJSON_CreateObject());
    cJSON_AddBoolToObject(o, "do_remote_prefill", 1);
    cJSON_AddBoolToObject(o, "do_remote_decode", 0);
    cJSON *blocks = cJSON_AddArrayToObject(o, "remote_block_ids");
    for (size_t i = 0; i < nblocks; i++) {
        long long id = (long long)(base + i);
        sig = xpyd_fnv64(sig, &id, sizeof id);
        cJSON_AddItemToArray(blocks, cJSON_CreateNumber((double)id));
    }
    char key[240], rid[220];
    snprintf(rid, sizeof rid, "%s", r->id);
    snprintf(key, sizeof key, "req:%s", rid);
    if (sim_lease_find(&s->leases, key)) { /* the same X-Request-Id reused while its KV is held */
        snprintf(rid, sizeof rid, "%.150s~%" PRIu64, r->id, ++s->seq);
        snprintf(key, sizeof key, "req:%s", rid);
    }
    uint64_t exp = xpyd_now_us() + (uint64_t)s->cfg.lease_ms * 1000u;
    if (sim_lease_put(&s->leases, key, r->rank->engine_id, sig, r->p.prompt.hash, kv, kvlen, exp)) {
        cJSON_Delete(o);
        return -1;
    }
    s->leases_created++;
    snprintf(r->lease_key, sizeof r->lease_key, "%s", key);
    cJSON_AddStringToObject(o, "remote_engine_id", r->rank->engine_id);
    cJSON_AddStringToObject(o, "remote_request_id", rid);
    cJSON_AddStringToObject(o, "remote_host", s->cfg.host);
    cJSON_AddNumberToObject(o, "remote_port", s->cfg.bootstrap_port ? s->cfg.bootstrap_port : r->rank->port);
    cJSON_AddNumberToObject(o, "tp_size", 1);
    if (s->xt) { /* xpyd: the decode reads the bytes through libxpyd_transfer, then asks for the release */
        struct sim_lease *l = sim_lease_find(&s->leases, key);
        if (!l || xt_register_memory(s->xt, l->kv, l->kv_len ? l->kv_len : 1, "sim:kv") != 0) {
            sim_lease_drop(s, sim_lease_take(&s->leases, key));
            r->lease_key[0] = 0;
            cJSON_Delete(o);
            return -1;
        }
        char seg[300], addr[32];
        xpyd_hostport(s->cfg.host, xt_engine_port(s->xt), seg, sizeof seg);
        snprintf(addr, sizeof addr, "%" PRIu64, (uint64_t)(uintptr_t)l->kv);
        cJSON_AddStringToObject(o, "xpyd_segment", seg);
        cJSON_AddStringToObject(o, "xpyd_addr", addr);
        cJSON_AddNumberToObject(o, "xpyd_len", (double)l->kv_len);
        cJSON_AddStringToObject(o, "xpyd_key", key);
    }
    r->kv_out = o;
    return 0;
}

/* Keeps the prefill's KV under a rendezvous key ("room:<n>" SGLang, "xfer:<id>" vLLM MooncakeConnector) for the
 * decode that claims it. -EEXIST: the key is in use. */
int sim_register_key(struct sreq *r, const char *key)
{
    struct sim *s = r->sim;
    size_t kvlen;
    unsigned char *kv = sim_kv_make(r, &kvlen);
    uint64_t exp = xpyd_now_us() + (uint64_t)s->cfg.lease_ms * 1000u;
    int rc = sim_lease_put(&s->leases, key, r->rank->engine_id, 0, r->p.prompt.hash, kv, kvlen, exp);
    if (rc == 0) {
        s->leases_created++;
        snprintf(r->lease_key, sizeof r->lease_key, "%s", key);
    }
    return rc;
}

int sim_register_room(struct sreq *r)
{
    char key[64];
    snprintf(key, sizeof key, "room:%" PRIu64, r->p.h.bootstrap_room);
    return sim_register_key(r, key);
}

int sim_register_transfer(struct sreq *r)
{
    char key[240];
    snprintf(key, sizeof key, "xfer:%s", r->p.h.transfer_id);
    return sim_register_key(r, key);
}

/* ---------- the prefix cache (--prefix-caching): the rank's block pool, sim_blocks.c ---------- */

/* r's prompt is now in its rank's cache (computed here, or received from a prefill); count: the tokens of it the
 * rank already held are counted as vLLM counts them (queries and hits in tokens) and returned: at least one token
 * is always computed, so a fully cached prompt reuses all but its last block. */
long sim_prefix_store(struct sreq *r, int count)
{
    size_t n = r->p.prompt.n, bs = (size_t)r->sim->cfg.block_size, hit = 0;
    if (!r->rank->pool)
        return 0;
    sim_pool_store(r->rank->pool, r->rank, r->p.prompt.ids, n, r->p.cache_salt, &hit);
    if (!count)
        return 0;
    if (hit * bs >= n)
        hit = n ? (n - 1) / bs : 0;
    r->rank->prefix_queries += n;
    r->rank->prefix_hits += hit * bs;
    return (long)(hit * bs);
}
