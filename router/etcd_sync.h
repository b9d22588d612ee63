/* SPDX-License-Identifier: Apache-2.0 */
/* etcd_sync.h - `--discovery etcd://...`: membership from etcd and router replicas sharing load, on the
 * router's main event loop; see etcd_sync.c. */
#ifndef XPYD_ETCD_SYNC_H
#define XPYD_ETCD_SYNC_H

#include <stdint.h>

struct event_base;
struct esync;

/* Starts when --discovery is set (NULL otherwise, or when it cannot start: logged). port: the bound client
 * port (this router's address in etcd). */
struct esync *esync_start(struct event_base *base, int port);
/* Draining (SIGTERM): this router leaves etcd now (its lease is revoked, so its entry and load vanish). */
void esync_drain(struct esync *s);
/* 1 once the drain's revoke answered (or timed out), or when discovery is off. */
int esync_left(const struct esync *s);
void esync_stop(struct esync *s);
/* Milliseconds since etcd last answered (0 when discovery is off): the /metrics gauge. Any thread. */
int64_t esync_age_ms(void);
/* 1 while in sync with etcd and etcd answered within a lease TTL (xpyd_discovery_up). */
int esync_up(void);

#endif
