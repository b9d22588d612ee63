/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_register.c - health-gated registration of one engine in etcd; see xpyd_register.h. */
#include "xpyd_register.h"

#include "xpyd_etcd.h"
#include "xpyd_etcd_lease.h"
#include "xpyd_http_client.h"
#include "xpyd_util.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct xreg {
    struct etcd *e;
    struct etcd_reg *reg;
    struct up_thread *up;
    struct up_endpoint ep;
    struct up_timeouts to;
    char path[256], name[300];
    long interval_ms, fall;
    long failures;
    int healthy; /* -1 unknown, 0, 1 */
    int status;
    int stopped;
    struct up_leg *check;
    struct event *tick;
};

static void set_healthy(struct xreg *x, int healthy, const char *why)
{
    if (x->healthy == healthy)
        return;
    x->healthy = healthy;
    if (healthy)
        xpyd_log_event(XPYD_LOG_INFO, "event=engine_healthy engine=%s detail=\"registering\"", x->name);
    else
        xpyd_log_event(XPYD_LOG_WARN, "event=engine_unhealthy engine=%s reason=\"%s\" detail=\"deregistering\"", x->name,
                       why);
    etcd_reg_active(x->reg, healthy);
}

static void on_state(int held, void *arg)
{
    struct xreg *x = arg;
    xpyd_log_event(XPYD_LOG_INFO, "event=%s engine=%s", held ? "registered" : "deregistered", x->name);
}

static void c_head(struct up_leg *leg, int status, void *arg)
{
    ((struct xreg *)arg)->status = status;
}

static void c_body(struct up_leg *leg, const char *data, size_t len, void *arg)
{
}

static void c_done(struct up_leg *leg, int err, void *arg)
{
    struct xreg *x = arg;
    x->check = NULL;
    if (!err && x->status == 200) {
        x->failures = 0;
        set_healthy(x, 1, "");
        return;
    }
    char why[400];
    if (err)
        snprintf(why, sizeof why, "GET %s: %s", x->path, err == -ETIME || err == -ETIMEDOUT ? "timed out" : strerror(-err));
    else
        snprintf(why, sizeof why, "GET %s answered %d", x->path, x->status);
    if (++x->failures >= x->fall || x->healthy < 0)
        set_healthy(x, 0, why);
}

static void on_tick(evutil_socket_t fd, short ev, void *arg)
{
    static const struct up_leg_cbs cbs = {c_head, c_body, c_done, NULL, NULL, NULL};
    struct xreg *x = arg;
    if (x->check || x->stopped)
        return;
    x->status = 0;
    struct evbuffer *req = evbuffer_new();
    if (!req)
        return;
    up_request_line(req, &x->ep, "GET", x->path);
    evbuffer_add(req, "\r\n", 2);
    x->check = up_leg_start(x->up, 0, req, &x->to, &cbs, x);
    evbuffer_free(req);
}

struct xreg *xreg_start(struct event_base *base, const struct xreg_opts *o, struct ssl_ctx_st *tls, char *err,
                        size_t cap)
{
    struct etcd_url u;
    if (etcd_url_parse(o->etcd, &u, err, cap) != 0)
        return NULL;
    if (u.tls && !tls) {
        snprintf(err, cap, "etcds:// needs a TLS client context");
        return NULL;
    }
    struct xreg *x = XPYD_XALLOC(calloc(1, sizeof *x));
    x->ep.tls = o->health_tls;
    if (up_endpoint_resolve(&x->ep, o->health_host, o->health_port) != 0 ||
        strlen(o->health_host) >= sizeof x->ep.host) {
        snprintf(err, cap, "cannot resolve the engine '%s'", o->health_host);
        free(x);
        return NULL;
    }
    snprintf(x->ep.host, sizeof x->ep.host, "%s", o->health_host);
    snprintf(x->path, sizeof x->path, "%s", o->health_path);
    xpyd_hostport(o->host, o->port, x->name, sizeof x->name);
    x->interval_ms = o->health_interval_ms;
    x->fall = o->health_fall < 1 ? 1 : o->health_fall;
    x->to.connect_ms = x->to.first_byte_ms = x->to.idle_ms = o->health_timeout_ms;
    x->healthy = -1;
    x->e = XPYD_XALLOC(etcd_new(base, &u, u.tls ? tls : NULL, o->etcd_timeout_ms));
    x->reg = XPYD_XALLOC(etcd_reg_new(x->e, o->ttl_s, on_state, x));
    for (int role = 0; role < 2; role++)
        if (o->roles & (1 << role)) {
            char key[600];
            snprintf(key, sizeof key, "%s/instances/%s/%s", u.prefix, role ? "decode" : "prefill", x->name);
            etcd_reg_set(x->reg, key, o->value);
        }
    x->up = XPYD_XALLOC(up_thread_new(base, &x->ep, 1, 1));
    if (tls)
        up_thread_set_tls(x->up, tls);
    x->tick = XPYD_XALLOC(event_new(base, -1, EV_PERSIST, on_tick, x));
    struct timeval tv = {x->interval_ms / 1000, (x->interval_ms % 1000) * 1000};
    event_add(x->tick, &tv);
    event_active(x->tick, EV_TIMEOUT, 0); /* the first check right away */
    return x;
}

int xreg_registered(const struct xreg *x)
{
    return etcd_reg_held(x->reg);
}

void xreg_stop(struct xreg *x, long timeout_ms, void (*done)(void *arg), void *arg)
{
    x->stopped = 1;
    event_del(x->tick);
    up_leg_cancel(x->check);
    x->check = NULL;
    etcd_reg_stop(x->reg, timeout_ms, done, arg);
}

void xreg_free(struct xreg *x)
{
    if (!x)
        return;
    event_free(x->tick);
    up_leg_cancel(x->check);
    etcd_reg_free(x->reg);
    etcd_free(x->e);
    up_thread_free(x->up);
    free(x);
}
