/* SPDX-License-Identifier: Apache-2.0 */
/* sim_lease.h - table of KV held by a prefill for a decode to pull, each under an expiring lease. */
#ifndef SIM_LEASE_H
#define SIM_LEASE_H

#include <stddef.h>
#include <stdint.h>

#define SIM_LEASE_BUCKETS 1024

struct sim_lease {
    char *key;            /* owned: "req:<request id>" or "room:<bootstrap room>" */
    char *engine_id;      /* owned: engine that holds the blocks */
    uint64_t block_sig;   /* FNV over the block ids handed out */
    uint64_t prompt_hash;
    unsigned char *kv;    /* owned: the KV bytes */
    size_t kv_len;
    uint64_t expires_us;  /* monotonic deadline */
    struct sim_lease *next;
};

struct sim_lease_table {
    struct sim_lease *bucket[SIM_LEASE_BUCKETS];
    size_t count;
    /* optional: called before a lease is freed by sim_lease_expire / sim_lease_clear (e.g. to unregister its
     * KV from a transfer engine); leases taken with sim_lease_take are the caller's to handle */
    void (*on_drop)(void *arg, struct sim_lease *l);
    void *on_drop_arg;
};

/* Inserts a lease; the table takes ownership of kv (freed on failure too). key and engine_id are copied.
 * Returns 0, -EEXIST when key is present (nothing changed but kv freed), or -ENOMEM. Single-threaded. */
int sim_lease_put(struct sim_lease_table *t, const char *key, const char *engine_id, uint64_t block_sig,
                  uint64_t prompt_hash, unsigned char *kv, size_t kv_len, uint64_t expires_us);
/* Looks a lease up without removing it; NULL when absent. */
struct sim_lease *sim_lease_find(struct sim_lease_table *t, const char *key);
/* Removes and returns the lease (caller frees with sim_lease_free), NULL when absent. */
struct sim_lease *sim_lease_take(struct sim_lease_table *t, const char *key);
/* Removes every lease whose deadline is <= now_us; returns how many expired. */
size_t sim_lease_expire(struct sim_lease_table *t, uint64_t now_us);
void sim_lease_free(struct sim_lease *l);
/* Frees every lease. */
void sim_lease_clear(struct sim_lease_table *t);

#endif
