/* SPDX-License-Identifier: Apache-2.0 */
/* sim_lease.c - chained hash table of KV leases. */
#include "sim_lease.h"

#include "xpyd_util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static size_t slot(const char *key)
{
    return (size_t)(xpyd_fnv64(XPYD_FNV_INIT, key, strlen(key)) % SIM_LEASE_BUCKETS);
}

struct sim_lease *sim_lease_find(struct sim_lease_table *t, const char *key)
{
    for (struct sim_lease *l = t->bucket[slot(key)]; l; l = l->next)
        if (strcmp(l->key, key) == 0)
            return l;
    return NULL;
}

int sim_lease_put(struct sim_lease_table *t, const char *key, const char *engine_id, uint64_t block_sig,
                  uint64_t prompt_hash, unsigned char *kv, size_t kv_len, uint64_t expires_us)
{
    if (sim_lease_find(t, key)) {
        free(kv);
        return -EEXIST;
    }
    struct sim_lease *l = calloc(1, sizeof *l);
    if (!l || !(l->key = strdup(key)) || !(l->engine_id = strdup(engine_id))) {
        if (l) {
            free(l->key);
            free(l);
        }
        free(kv);
        return -ENOMEM;
    }
    l->block_sig = block_sig;
    l->prompt_hash = prompt_hash;
    l->kv = kv;
    l->kv_len = kv_len;
    l->expires_us = expires_us;
    size_t s = slot(key);
    l->next = t->bucket[s];
    t->bucket[s] = l;
    t->count++;
    return 0;
}

struct sim_lease *sim_lease_take(struct sim_lease_table *t, const char *key)
{
    for (struct sim_lease **pp = &t->bucket[slot(key)]; *pp; pp = &(*pp)->next) {
        if (strcmp((*pp)->key, key) == 0) {
            struct sim_lease *l = *pp;
            *pp = l->next;
            l->next = NULL;
            t->count--;
            return l;
        }
    }
    return NULL;
}

size_t sim_lease_expire(struct sim_lease_table *t, uint64_t now_us)
{
    size_t n = 0;
    if (t->count == 0)
        return 0;
    for (size_t i = 0; i < SIM_LEASE_BUCKETS; i++) {
        struct sim_lease **pp = &t->bucket[i];
        while (*pp) {
            if ((*pp)->expires_us <= now_us) {
                struct sim_lease *l = *pp;
                *pp = l->next;
                if (t->on_drop)
                    t->on_drop(t->on_drop_arg, l);
                sim_lease_free(l);
                t->count--;
                n++;
            } else {
                pp = &(*pp)->next;
            }
        }
    }
    return n;
}

void sim_lease_free(struct sim_lease *l)
{
    if (!l)
        return;
    free(l->key);
    free(l->engine_id);
    free(l->kv);
    free(l);
}

void sim_lease_clear(struct sim_lease_table *t)
{
    for (size_t i = 0; i < SIM_LEASE_BUCKETS; i++) {
        while (t->bucket[i]) {
            struct sim_lease *l = t->bucket[i];
            t->bucket[i] = l->next;
            if (t->on_drop)
                t->on_drop(t->on_drop_arg, l);
            sim_lease_free(l);
        }
    }
    t->count = 0;
}
