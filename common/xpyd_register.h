/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_register.h - an engine announcing itself in etcd while it is healthy (xpyd_register beside a real
 * engine, and xpyd_sim --register: the same code).
 *
 * Every health interval GET <health path> on the engine: while it answers 200 the key
 * <prefix>/instances/<role>/<host>:<port> is held under a lease kept alive every TTL/3; after `fall` failed
 * checks in a row the lease is revoked (routers remove the engine at once) and it is registered again at the
 * next good check. xreg_stop() revokes (SIGTERM); a registrar that dies lets the lease run out (TTL). */
#ifndef XPYD_REGISTER_H
#define XPYD_REGISTER_H

#include <stddef.h>

struct event_base;
struct ssl_ctx_st;
struct xreg;

struct xreg_opts {
    const char *etcd;            /* etcd://h:p[,h:p]/prefix or etcds:// */
    int roles;                   /* 1: prefill, 2: decode, 3: both (one key each) */
    const char *host;            /* the engine as routers reach it: the key */
    int port;
    const char *value;           /* the key's JSON value (dp, tp, weight, ...; "{}" for the routers' defaults) */
    long ttl_s;                  /* lease TTL */
    long etcd_timeout_ms;        /* one etcd call */
    const char *health_host;     /* where to check; usually the same engine */
    int health_port;
    int health_tls;              /* the engine speaks https */
    const char *health_path;     /* e.g. /health */
    long health_interval_ms, health_timeout_ms, health_fall;
};

/* Starts checking and registering on base. tls: client context for etcds:// and https engines (may be NULL
 * otherwise). NULL with err set when the options are unusable. */
struct xreg *xreg_start(struct event_base *base, const struct xreg_opts *o, struct ssl_ctx_st *tls, char *err,
                        size_t cap);
/* Deregisters (the lease revoked) and calls done within timeout_ms; nothing is checked afterwards. */
void xreg_stop(struct xreg *x, long timeout_ms, void (*done)(void *arg), void *arg);
/* 1 while registered (the lease held and the key written). */
int xreg_registered(const struct xreg *x);
void xreg_free(struct xreg *x);

#endif
