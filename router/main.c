/* SPDX-License-Identifier: Apache-2.0 */
/* main.c - xpyd_router: configuration, start-up (the listeners and worker threads are workers.c's), signals (drain,
 * reload), TLS set-up; the operational endpoints are status.c's (/health, /status) and metrics.c's (/metrics). */
#include "handoff.h"
#include "loopguard.h"
#include "migrate.h"
#include "router.h"
#include "xpyd_reply.h"
#include "discovery.h"
#include "etcd_sync.h"
#include "probe.h"
#include "tokenize.h"
#include "kv_sub.h"
#include "workers.h"

#include "xpyd_oai.h"
#include "xpyd_tls.h"
#include "xpyd_util.h"
#include "xpyd_version.h"

#include <dlfcn.h>
#include <malloc.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <evhtp/evhtp.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* Memory freed by a burst of large requests goes back to the system once the router is idle (jemalloc keeps
 * freed pages until later activity decays them, and an idle router has none): every second, when no request
 * is in progress and some were since the last time, the allocator's dirty pages are purged. jemalloc is found
 * at run time (mallctl); without it (sanitizer builds), glibc's malloc_trim. */
static void on_idle_tick(evutil_socket_t fd, short ev, void *arg)
{
    static int64_t seen = -1;
    int64_t done = 0;
    for (int k = 0; k < RT_EP_COUNT; k++)
        for (int s = 100; s < 600; s++)
            done += atomic_load(&g_rt->ctr.requests[k][s]);
    if (atomic_load(&g_rt->ctr.active_requests) > 0 || done == seen)
        return;
    seen = done;
    static int (*mallctl_fn)(const char *, void *, size_t *, void *, size_t);
    static int looked;
    if (!looked) {
        looked = 1;
        *(void **)&mallctl_fn = dlsym(RTLD_DEFAULT, "mallctl");
    }
    if (mallctl_fn)
        mallctl_fn("arena.4096.purge", NULL, NULL, NULL, 0); /* MALLCTL_ARENAS_ALL */
    else
        malloc_trim(0);
}

struct drain {
    struct event_base *base;
    struct esync *es;  /* --discovery: leaves etcd first */
    struct event *timer;
    uint64_t deadline_us;
};

/* Every 20 ms while draining: exit once nothing is in flight, or when the drain timeout is over. */
static void on_drain_tick(evutil_socket_t fd, short ev, void *arg)
{
    struct drain *d = arg;
    int64_t active = (int64_t)atomic_load(&g_rt->ctr.active_requests);
    if ((active > 0 || !esync_left(d->es)) && xpyd_now_us() < d->deadline_us)
        return;
    if (active > 0)
        XLOG_WARN("msg=\"drain timeout: closing with requests in flight\" active=%lld", (long long)active);
    xpyd_log_event(XPYD_LOG_INFO, "event=drained active=%lld", (long long)active);
    event_base_loopexit(d->base, NULL);
}

/* SIGTERM/SIGINT: /health answers 503, the listener closes, in-flight requests finish (up to
 * --drain-timeout-ms), then the process exits 0. A second signal exits at once. */
static void on_signal(evutil_socket_t sig, short ev, void *arg)
{
    struct drain *d = arg;
    if (atomic_exchange(&g_rt->draining, 1)) {
        event_base_loopexit(d->base, NULL);
        return;
    }
    xpyd_log_event(XPYD_LOG_INFO, "event=draining signal=%d active=%lld timeout_ms=%ld", (int)sig,
                   (long long)atomic_load(&g_rt->ctr.active_requests), g_rt->cfg.drain_timeout_ms);
    rt_workers_stop_accepting();
    esync_drain(d->es);
    d->deadline_us = xpyd_now_us() + (uint64_t)g_rt->cfg.drain_timeout_ms * 1000u;
    d->timer = event_new(d->base, -1, EV_PERSIST, on_drain_tick, d);
    struct timeval tv = {0, 20000};
    event_add(d->timer, &tv);
}

static void on_sighup(evutil_socket_t sig, short ev, void *arg)
{
    rt_reload();
    if (g_rt->tls_server) { /* the certificate and key, read again: new handshakes use them */
        char err[600];
        if (xpyd_tls_server_reload(g_rt->tls_server, err, sizeof err) == 0) {
            atomic_fetch_add(&g_rt->ctr.tls_reloads, 1);
            xpyd_log_event(XPYD_LOG_INFO, "event=tls_reloaded cert=%s", g_rt->cfg.tls_cert);
        } else {
            xpyd_log_event(XPYD_LOG_ERROR, "event=tls_reload_failed reason=\"%s\" (the previous certificate stays in use)",
                           err);
        }
    }
}

/* An https engine's handshake failed: counted, and logged once per engine (the reason: an unknown CA, a name
 * that does not match, an expired certificate, ...); the leg fails like a connect error (retry, then 502). */
static void on_upstream_tls_failure(const struct up_endpoint *ep, const char *reason)
{
    static atomic_uchar logged[4096];
    atomic_fetch_add(&g_rt->ctr.tls_handshake_failures[1], 1);
    size_t i = (size_t)(ep - g_rt->endpoints);
    if (i < 4096 && atomic_exchange(&logged[i], 1))
        return;
    char hp[300];
    xpyd_log_event(XPYD_LOG_WARN, "event=tls_handshake_failed side=upstream peer=%s reason=\"%s\"",
                   xpyd_hostport(ep->host, ep->port, hp, sizeof hp), reason);
}

static int tls_setup(struct router *rt)
{
    char err[600];
    int minv = rt->cfg.tls_min_version ? TLS1_3_VERSION : TLS1_2_VERSION;
    if (rt->cfg.tls_cert[0]) {
        struct xpyd_tls_server_opts so = {rt->cfg.tls_cert, rt->cfg.tls_key, rt->cfg.tls_client_ca, minv};
        if (!(rt->tls_server = xpyd_tls_server_new(&so, err, sizeof err))) {
            fprintf(stderr, "xpyd_router: TLS: %s\n", err);
            return -1;
        }
        SSL_CTX_set_read_ahead(rt->tls_server, 1); /* one read per request, not two: client_conn.c tls_read_buffered */
    }
    /* always: engines may be added as https at run time (admin API, reload) */
    struct xpyd_tls_client_opts co = {rt->cfg.upstream_ca, rt->cfg.upstream_cert, rt->cfg.upstream_key, minv};
    if (!(rt->tls_client = xpyd_tls_client_new(&co, err, sizeof err))) {
        fprintf(stderr, "xpyd_router: TLS to engines: %s\n", err);
        return -1;
    }
    up_tls_failure_hook = on_upstream_tls_failure;
    return 0;
}

int main(int argc, char **argv)
{
    struct router *rt = XPYD_XALLOC(calloc(1, sizeof *rt));
    g_rt = rt;
    int rc = rt_config_load(&rt->cfg, argc, argv);
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    rt_migration_install();
    if (!(rt->ho = rt_handoff_resolve(&rt->cfg)))
        return 2;
    if (rt->cfg.dry_run) {
        /* names resolve as the real start resolves them, so a dry run that passes starts */
        for (size_t i = 0; i < rt->cfg.n_endpoints; i++) {
            struct up_endpoint ep;
            if (up_endpoint_resolve(&ep, rt->cfg.endpoints[i].host, rt->cfg.endpoints[i].port) != 0) {
                fprintf(stderr, "xpyd_router: cannot resolve '%s'\n", rt->cfg.endpoints[i].host);
                return 2;
            }
        }
        if (rt->cfg.listen_port > 0) /* as the start will find it once listening (port 0: only known then) */
            rt_loop_listener(rt->cfg.listen_host, rt->cfg.listen_port);
        if (rt->cfg.plain_port > 0)
            rt_loop_listener(rt->cfg.plain_host, (int)rt->cfg.plain_port);
        for (size_t i = 0; i < rt->cfg.n_endpoints; i++) {
            struct up_endpoint ep;
            up_endpoint_resolve(&ep, rt->cfg.endpoints[i].host, rt->cfg.endpoints[i].port);
            if (rt_loop_is_self((const struct sockaddr *)&ep.addr, ep.addrlen)) {
                fprintf(stderr, "xpyd_router: %s is this router's own listener: requests sent there would come back "
                                "to it (give the engine's address)\n", ep.hostport);
                return 2;
            }
        }
        rt_config_print(&rt->cfg, stdout);
        return 0;
    }
    rt->started_wall = xpyd_wall_s();
    rt->argc = argc;
    rt->argv = argv;
    if (tls_setup(rt) != 0 || rt_registry_setup(rt) != 0 || rt_kvxfer_start() != 0 || rt_tok_setup(rt) != 0 ||
        rt_kv_setup(rt) != 0)
        return 2;
    signal(SIGPIPE, SIG_IGN);
    xpyd_raise_nofile();
    /* Coalesce epoll_ctl calls within a loop iteration: streaming toggles EV_WRITE once per event otherwise.
     * Set before the worker bases are made (workers.c), which read it from the environment. */
    setenv("EVENT_EPOLL_USE_CHANGELIST", "1", 0);
    evthread_use_pthreads();
    struct event_config *ec = event_config_new();
    event_config_require_features(ec, EV_FEATURE_EARLY_CLOSE);
    struct event_base *base = event_base_new_with_config(ec);
    event_config_free(ec);
    if (!base)
        base = event_base_new();
    struct rt_listen ls[2] = {{rt->cfg.listen_host, rt->cfg.listen_port, rt->tls_server, -1},
                              {rt->cfg.plain_host, (int)rt->cfg.plain_port, NULL, -1}};
    if (rt_workers_bind(base, ls, rt->cfg.plain_port < 0 ? 1 : 2, (int)rt->cfg.listen_backlog) != 0)
        return 1;
    int port = ls[0].bound_port, pport = ls[1].bound_port;
    rt_loop_listener(rt->cfg.listen_host, port);
    if (pport >= 0)
        rt_loop_listener(rt->cfg.plain_host, pport);
    char self_err[400];
    if (rt_registry_self_check(self_err, sizeof self_err) != 0) {
        fprintf(stderr, "xpyd_router: %s\n", self_err);
        return 2;
    }
    if (rt->cfg.port_file[0]) {
        char tmp[600];
        snprintf(tmp, sizeof tmp, "%s.tmp", rt->cfg.port_file);
        FILE *pf = fopen(tmp, "w");
        if (!pf || fprintf(pf, "%d\n", port) < 0 || (pport >= 0 && fprintf(pf, "%d\n", pport) < 0) || fclose(pf) != 0 ||
            rename(tmp, rt->cfg.port_file) != 0) {
            fprintf(stderr, "xpyd_router: cannot write %s\n", rt->cfg.port_file);
            return 1;
        }
    }
    struct drain drain = {base, NULL, NULL, 0};
    struct event *si = evsignal_new(base, SIGINT, on_signal, &drain);
    struct event *st = evsignal_new(base, SIGTERM, on_signal, &drain);
    struct event *sh = evsignal_new(base, SIGHUP, on_sighup, NULL);
    event_add(si, NULL);
    event_add(st, NULL);
    event_add(sh, NULL);
    XLOG_INFO("msg=\"xpyd_router ready\" listen=%s:%d tls=%s plain_port=%d threads=%d handoff=%s prefill_ranks=%zu "
              "decode_ranks=%zu",
              rt->cfg.listen_host, port, rt->tls_server ? "on" : "off", pport, rt->cfg.threads, rt_handoff_names[rt->cfg.handoff],
              rt->reg.n_ranks[0], rt->reg.n_ranks[1]);
    fflush(stderr);
    struct event *idle = event_new(base, -1, EV_PERSIST, on_idle_tick, NULL);
    struct timeval one_s = {1, 0};
    event_add(idle, &one_s);
    struct probe *probe = probe_start(base);
    struct discovery *disc = discovery_start(base);
    drain.es = esync_start(base, port);
    if (rt_workers_start(rt->cfg.threads) != 0)
        return 1;
    event_base_dispatch(base);
    esync_stop(drain.es);
    discovery_stop(disc);
    probe_stop(probe);
    if (drain.timer)
        event_free(drain.timer);
    rt_workers_stop_accepting();
    event_free(si);
    event_free(st);
    event_free(sh);
    event_free(idle);
    rt_kvxfer_stop();
    rt_tok_stop();
    rt_kv_stop();
    XLOG_INFO("msg=\"xpyd_router stopped\"");
    /* Worker threads and their connections end with the process. */
    return 0;
}
