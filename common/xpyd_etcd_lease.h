/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_etcd_lease.h - registrations on etcd (xpyd_etcd_lease.c): keys held under one lease that is granted, kept
 * alive every TTL/3 and granted again (with the keys put again) when etcd lost it; turned off, the lease is
 * revoked so the keys vanish at once; if the process dies, they vanish when the TTL runs out. Built on
 * xpyd_etcd.h's calls; the same contract (no callback after its cancel or free returned). */
#ifndef XPYD_ETCD_LEASE_H
#define XPYD_ETCD_LEASE_H

#include "xpyd_etcd.h"

struct etcd_reg;

/* on_state(held): the lease is held and every key put (1), or was lost / revoked (0). Optional. */
struct etcd_reg *etcd_reg_new(struct etcd *e, long ttl_s, void (*on_state)(int held, void *arg), void *arg);
/* Sets key (under the registration's lease) to value; put at once when the lease is held, else when it is.
 * A key whose put is in flight is put again with the newest value afterwards. */
void etcd_reg_set(struct etcd_reg *r, const char *key, const char *value);
/* on 1: grant the lease and put the keys; on 0: revoke it (the keys vanish). Idempotent. */
void etcd_reg_active(struct etcd_reg *r, int on);
int etcd_reg_held(const struct etcd_reg *r);
/* Revokes the lease if held, then calls done (at most timeout_ms later); the registration is inactive after. */
void etcd_reg_stop(struct etcd_reg *r, long timeout_ms, void (*done)(void *arg), void *arg);
/* Frees without revoking (a dying process: the lease runs out by itself). */
void etcd_reg_free(struct etcd_reg *r);

#endif
