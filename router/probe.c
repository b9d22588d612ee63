/* SPDX-License-Identifier: Apache-2.0 */
/* probe.c - active health checks and engine-metrics feedback (see probe.h). */
#include "probe.h"

#include "feedback_parse.h"
#include "router.h"
#include "xpyd_util.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <stdlib.h>
#include <string.h>

struct ep_state {
    struct probe *p;
    int idx;
    int healthy;          /* endpoint verdict, starts up */
    int streak;           /* consecutive results against the current verdict */
    struct up_leg *hleg;  /* health check in flight */
    int hstatus;
    struct up_leg *sleg;  /* metrics scrape in flight */
    int sstatus;
    struct evbuffer *sbody;
    unsigned gen;         /* the endpoint slot's generation this state is of (up_endpoint.gen) */
};

struct probe {
    struct event_base *base;
    struct up_thread *up;
    struct ep_state *eps;
    size_t n;
    struct event *health_ev, *scrape_ev;
};

static void ep_desc(int idx, char *out, size_t cap)
{
    xpyd_hostport(g_rt->endpoints[idx].host, g_rt->endpoints[idx].port, out, cap);
}

static void apply_health(struct ep_state *s)
{
    for (int role = 0; role < 2; role++)
        for (size_t i = 0; i < g_rt->reg.n_ranks[role]; i++)
            if (g_rt->reg.ranks[role][i].endpoint == s->idx)
                xb_set_healthy(g_rt->pools[role], (int)i, s->healthy);
}

/* Endpoints added at runtime (admin API, reload) join the rounds; one no active rank uses is skipped. A slot
 * given to another address starts afresh (checks of the old address in flight are dropped). */
static int ep_in_use(struct probe *p, size_t i)
{
    struct ep_state *s = &p->eps[i];
    unsigned gen = __atomic_load_n(&g_rt->endpoints[i].gen, __ATOMIC_ACQUIRE);
    if (!s->sbody) {
        s->p = p;
        s->idx = (int)i;
        s->healthy = 1;
        s->sbody = XPYD_XALLOC(evbuffer_new());
        s->gen = gen;
    } else if (s->gen != gen) {
        up_leg_cancel(s->hleg);
        up_leg_cancel(s->sleg);
        s->hleg = s->sleg = NULL;
        s->healthy = 1;
        s->streak = 0;
        s->gen = gen;
        evbuffer_drain(s->sbody, evbuffer_get_length(s->sbody));
    }
    for (int role = 0; role < 2; role++)
        for (size_t k = 0; k < g_rt->reg.n_ranks[role]; k++)
            if (g_rt->reg.ranks[role][k].endpoint == (int)i && !rt_rank_removed(role, (int)k))
                return 1;
    return 0;
}

static size_t n_endpoints(void)
{
    return __atomic_load_n(&g_rt->n_endpoints, __ATOMIC_ACQUIRE);
}

/* One check result through the hysteresis counter. */
static void health_result(struct ep_state *s, int ok, const char *why)
{
    if (ok == s->healthy) {
        s->streak = 0;
        apply_health(s); /* a rank revived at runtime takes its endpoint's verdict */
        return;
    }
    s->streak++;
    long need = s->healthy ? g_rt->cfg.health_fall : g_rt->cfg.health_rise;
    if (s->streak < need)
        return;
    s->healthy = ok;
    s->streak = 0;
    apply_health(s);
    atomic_fetch_add(&g_rt->ctr.health_transitions, 1);
    char d[300];
    ep_desc(s->idx, d, sizeof d);
    xpyd_log_event(ok ? XPYD_LOG_INFO : XPYD_LOG_WARN, "event=health_transition endpoint=%s state=%s reason=\"%s\"", d, ok ? "up" : "down", why);
}

static void h_head(struct up_leg *leg, int status, void *arg)
{
    ((struct ep_state *)arg)->hstatus = status;
}

static void h_done(struct up_leg *leg, int err, void *arg)
{
    struct ep_state *s = arg;
    s->hleg = NULL;
    char why[120];
    if (err)
        snprintf(why, sizeof why, "GET /health: %s", err == -ETIME || err == -ETIMEDOUT ? "timed out" : strerror(-err));
    else
        snprintf(why, sizeof why, "GET /health answered %d", s->hstatus);
    health_result(s, !err && s->hstatus == 200, why);
}

static struct evbuffer *get_request(int idx, const char *path)
{
    struct evbuffer *b = XPYD_XALLOC(evbuffer_new());
    up_request_line(b, &g_rt->endpoints[idx], "GET", path);
    evbuffer_add(b, "\r\n", 2);
    return b;
}

static const struct up_timeouts *probe_timeouts(void)
{
    static struct up_timeouts to;
    to.connect_ms = to.first_byte_ms = to.idle_ms = g_rt->cfg.health_timeout_ms;
    return &to;
}

static void on_health_tick(evutil_socket_t fd, short ev, void *arg)
{
    struct probe *p = arg;
    static const struct up_leg_cbs cbs = {h_head, NULL, h_done, NULL, NULL, NULL};
    for (size_t i = 0; i < n_endpoints(); i++) {
        struct ep_state *s = &p->eps[i];
        if (!ep_in_use(p, i) || s->hleg)
            continue; /* unused, or the previous check is still running */
        s->hstatus = 0;
        struct evbuffer *req = get_request((int)i, "/health");
        s->hleg = up_leg_start(p->up, (int)i, req, probe_timeouts(), &cbs, s);
        evbuffer_free(req);
    }
}

static void s_head(struct up_leg *leg, int status, void *arg)
{
    ((struct ep_state *)arg)->sstatus = status;
}

static void s_body(struct up_leg *leg, const char *data, size_t len, void *arg)
{
    struct ep_state *s = arg;
    if (evbuffer_get_length(s->sbody) < (8u << 20))
        evbuffer_add(s->sbody, data, len);
}

static void s_done(struct up_leg *leg, int err, void *arg)
{
    struct ep_state *s = arg;
    s->sleg = NULL;
    size_t len = evbuffer_get_length(s->sbody);
    const char *page = len ? (const char *)evbuffer_pullup(s->sbody, -1) : "";
    for (int role = 0; role < 2; role++) {
        for (size_t i = 0; i < g_rt->reg.n_ranks[role]; i++) {
            const struct rt_live_rank *rk = &g_rt->reg.ranks[role][i];
            if (rk->endpoint != s->idx)
                continue;
            struct engine_load el;
            int64_t fb = 0;
            int fb_ok = !err && s->sstatus == 200 && probe_parse_engine_metrics(page, len, rk->dp_rank, &el) > 0;
            if (fb_ok)
                fb = (int64_t)(el.waiting * (double)g_rt->cfg.feedback_waiting_tokens +
                               el.running * (double)g_rt->cfg.feedback_running_tokens +
                               el.kv_usage * (double)g_rt->cfg.feedback_kv_tokens);
            xb_set_feedback(g_rt->pools[role], (int)i, fb); /* no reading: no feedback, the router's own count rules */
            if (fb_ok && g_rt->prefix_on[role] && el.num_gpu_blocks > 0) { /* the engine's cache size, in our blocks */
                long bs = el.block_size > 0 ? el.block_size : g_rt->cfg.prefix_block_tokens;
                xb_prefix_capacity(g_rt->pools[role], (int)i,
                                   (long)((double)el.num_gpu_blocks * (double)bs / (double)g_rt->cfg.prefix_block_tokens));
            }
        }
    }
    evbuffer_drain(s->sbody, len);
}

static void on_scrape_tick(evutil_socket_t fd, short ev, void *arg)
{
    struct probe *p = arg;
    static const struct up_leg_cbs cbs = {s_head, s_body, s_done, NULL, NULL, NULL};
    for (size_t i = 0; i < n_endpoints(); i++) {
        struct ep_state *s = &p->eps[i];
        if (!ep_in_use(p, i) || s->sleg)
            continue;
        s->sstatus = 0;
        struct evbuffer *req = get_request((int)i, "/metrics");
        s->sleg = up_leg_start(p->up, (int)i, req, probe_timeouts(), &cbs, s);
        evbuffer_free(req);
    }
}

static struct event *every(struct probe *p, long ms, event_callback_fn cb)
{
    struct event *e = XPYD_XALLOC(event_new(p->base, -1, EV_PERSIST, cb, p));
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    event_add(e, &tv);
    event_active(e, EV_TIMEOUT, 0); /* the first round right away */
    return e;
}

struct probe *probe_start(struct event_base *base)
{
    if (g_rt->cfg.health_interval_ms <= 0 && g_rt->cfg.scrape_interval_ms <= 0)
        return NULL;
    struct probe *p = XPYD_XALLOC(calloc(1, sizeof *p));
    p->base = base;
    p->n = g_rt->ep_cap;
    p->up = XPYD_XALLOC(up_thread_new_shared(base, g_rt->endpoints, p->n, 2));
    if (g_rt->tls_client)
        up_thread_set_tls(p->up, g_rt->tls_client);
    p->eps = XPYD_XALLOC(calloc(p->n ? p->n : 1, sizeof *p->eps));
    if (g_rt->cfg.health_interval_ms > 0)
        p->health_ev = every(p, g_rt->cfg.health_interval_ms, on_health_tick);
    if (g_rt->cfg.scrape_interval_ms > 0)
        p->scrape_ev = every(p, g_rt->cfg.scrape_interval_ms, on_scrape_tick);
    return p;
}

void probe_stop(struct probe *p)
{
    if (!p)
        return;
    if (p->health_ev)
        event_free(p->health_ev);
    if (p->scrape_ev)
        event_free(p->scrape_ev);
    for (size_t i = 0; i < p->n; i++) {
        up_leg_cancel(p->eps[i].hleg);
        up_leg_cancel(p->eps[i].sleg);
        if (p->eps[i].sbody)
            evbuffer_free(p->eps[i].sbody);
    }
    up_thread_free(p->up);
    free(p->eps);
    free(p);
}
