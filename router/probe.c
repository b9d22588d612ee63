/* SPDX-License-Identifier: Apache-2.0 */
/* probe.c - active health checks and engine-metrics feedback (see probe.h). */
#include "probe.h"

#include "feedback_parse.h"
#include "kv_sub.h"
#include "loopguard.h"
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
    /* its KV-event publisher's connection as a hint (--kv-events-recheck-ms) */
    int hint;             /* what the check in flight answers: KV_HINT_GONE / KV_HINT_BACK; 0 a round's */
    int pending;          /* a hint waiting for the check in flight to end */
    int gone, gone_failed; /* the publisher went away (no KV_HINT_BACK since); a check failed since */
    uint64_t recheck_until; /* after KV_HINT_BACK: checked again until it passes or then (µs) */
    struct event *recheck_ev; /* the next of those checks (made on first use) */
    /* its engine's max_model_len (--learn-max-model-len): GET /v1/models after a passing check, once per time
     * the engine is seen up */
    struct up_leg *mleg;  /* in flight */
    int mstatus;
    struct evbuffer *mbody;
    int mml_known;        /* answered since it was last seen down or restarted */
    long mml;             /* what it answered (0: no length) */
};

struct probe {
    struct event_base *base;
    struct up_thread *up;
    struct ep_state *eps;
    size_t n;
    struct event *health_ev, *scrape_ev, *hint_ev;
};

static void ep_desc(int idx, char *out, size_t cap)
{
    xpyd_hostport(g_rt->endpoints[idx].host, g_rt->endpoints[idx].port, out, cap);
}

/* The endpoint's verdict to every rank on it; uneject: their passive ejections end too (an engine seen starting
 * again: their failures were the old process's) */
static void apply_health(struct ep_state *s, int uneject)
{
    for (int role = 0; role < 2; role++)
        for (size_t i = 0; i < g_rt->reg.n_ranks[role]; i++) {
            if (g_rt->reg.ranks[role][i].endpoint != s->idx)
                continue;
            xb_set_healthy(g_rt->pools[role], (int)i, s->healthy);
            if (uneject && xb_unejected(g_rt->pools[role], (int)i)) {
                char d[300];
                ep_desc(s->idx, d, sizeof d);
                xpyd_log_event(XPYD_LOG_INFO, "event=unejected instance=%s role=%s rank=%zu reason=kv_events_back", d,
                               role ? "decode" : "prefill", i);
            }
        }
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
        up_leg_cancel(s->mleg);
        s->hleg = s->sleg = s->mleg = NULL;
        s->mml_known = 0;
        s->healthy = 1;
        s->streak = 0;
        s->gen = gen;
        s->hint = s->pending = s->gone = s->gone_failed = 0;
        if (s->recheck_ev)
            event_del(s->recheck_ev);
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

/* The endpoint's verdict is ok from now (uneject: apply_health's). */
static void verdict(struct ep_state *s, int ok, const char *why, int uneject)
{
    if (ok != s->healthy) {
        atomic_fetch_add(&g_rt->ctr.health_transitions, 1);
        char d[300];
        ep_desc(s->idx, d, sizeof d);
        xpyd_log_event(ok ? XPYD_LOG_INFO : XPYD_LOG_WARN, "event=health_transition endpoint=%s state=%s reason=\"%s\"", d, ok ? "up" : "down", why);
    }
    s->healthy = ok;
    s->streak = 0;
    if (!ok || uneject)
        s->mml_known = 0; /* when it is up again it may be another engine process, started with another length */
    apply_health(s, uneject); /* (unchanged too: a rank revived at runtime takes its endpoint's verdict) */
}

/* One check result through the hysteresis counter. */
static void health_result(struct ep_state *s, int ok, const char *why)
{
    if (ok != s->healthy && ++s->streak < (s->healthy ? g_rt->cfg.health_fall : g_rt->cfg.health_rise))
        return;
    verdict(s, ok, why, 0);
}

static void on_recheck(evutil_socket_t fd, short ev, void *arg);

/* A hinted check's result (--kv-events-recheck-ms). The publisher gone and the engine failing: down at once (two
 * signals; no --health-fall wait). The publisher back and the engine passing after it had failed: up at once,
 * ejection ended. The publisher back and the engine not answering yet: checked again shortly, not counted. */
static void hinted_result(struct ep_state *s, int hint, int ok, const char *why)
{
    char w[200];
    if (!ok && s->gone)
        s->gone_failed = 1;
    if (hint == KV_HINT_GONE && !ok) {
        snprintf(w, sizeof w, "KV events stopped; %s", why);
        verdict(s, 0, w, 0);
    } else if (hint == KV_HINT_BACK && ok) {
        int restarted = s->gone_failed || !s->healthy;
        s->gone = s->gone_failed = 0;
        if (!restarted) {
            health_result(s, ok, why);
            return;
        }
        snprintf(w, sizeof w, "KV events back; %s", why);
        verdict(s, 1, w, 1);
    } else if (hint == KV_HINT_BACK) {
        if (xpyd_now_us() < s->recheck_until) {
            struct timeval tv = {g_rt->cfg.kv_events_recheck_ms / 1000, (g_rt->cfg.kv_events_recheck_ms % 1000) * 1000};
            if (!s->recheck_ev)
                s->recheck_ev = XPYD_XALLOC(event_new(s->p->base, -1, 0, on_recheck, s));
            event_add(s->recheck_ev, &tv);
        }
    } else {
        health_result(s, ok, why);
    }
}

/* ---- the engine's max_model_len, from its model list ---- */

static void m_head(struct up_leg *leg, int status, void *arg)
{
    ((struct ep_state *)arg)->mstatus = status;
}

static void m_body(struct up_leg *leg, const char *data, size_t len, void *arg)
{
    struct ep_state *s = arg;
    if (evbuffer_get_length(s->mbody) < (1u << 20)) /* a list of adapters, not more: the rest is not read */
        evbuffer_add(s->mbody, data, len);
}

/* The endpoint's learned length to each of its ranks that does not have it yet (a rank added on it later, by the
 * admin API or etcd, too: called after every passing check) */
static void apply_mml(struct ep_state *s)
{
    char d[300];
    ep_desc(s->idx, d, sizeof d);
    for (int role = 0; role < 2; role++)
        for (size_t i = 0; i < g_rt->reg.n_ranks[role]; i++) {
            struct xb_instance_stats st;
            if (g_rt->reg.ranks[role][i].endpoint != s->idx || xb_stats(g_rt->pools[role], (int)i, &st) != 0 ||
                st.learned_max_model_len == s->mml)
                continue;
            xb_set_learned_max_model_len(g_rt->pools[role], (int)i, s->mml);
            xpyd_log_event(XPYD_LOG_INFO,
                           "event=max_model_len_learned instance=%s role=%s rank=%zu max_model_len=%ld configured=%ld",
                           d, role ? "decode" : "prefill", i, s->mml, st.max_model_len);
        }
}

/* What it answered, to every rank on the endpoint. Not answered (refused, timed out): asked again after the
 * next passing check; answered without a length (another status, another shape): known, nothing learned. */
static void m_done(struct up_leg *leg, int err, void *arg)
{
    struct ep_state *s = arg;
    s->mleg = NULL;
    size_t len = evbuffer_get_length(s->mbody);
    long mml = 0;
    if (!err && s->mstatus == 200 && len < (1u << 20)) {
        const char *body = (const char *)evbuffer_pullup(s->mbody, -1);
        mml = probe_parse_models_max_len(body, len);
        probe_parse_models_adapters(body, len, rt_kv_adapter_listed, NULL); /* LoRA adapters known before use */
    }
    evbuffer_drain(s->mbody, len);
    if (err)
        return;
    s->mml_known = 1;
    s->mml = mml;
    apply_mml(s);
}

static const struct up_timeouts *probe_timeouts(void);

static void models_fetch(struct ep_state *s)
{
    static const struct up_leg_cbs cbs = {m_head, m_body, m_done, NULL, NULL, NULL};
    if (!rt_learn_max_model_len(&g_rt->cfg))
        return;
    if (!s->mbody)
        s->mbody = XPYD_XALLOC(evbuffer_new());
    s->mstatus = 0;
    struct evbuffer *req = XPYD_XALLOC(evbuffer_new());
    up_request_line(req, &g_rt->endpoints[s->idx], "GET", "/v1/models");
    evbuffer_add_printf(req, "%s: %s\r\n", RT_VIA_HEADER, rt_loop_id()); /* an engine that is a router ends a loop */
    if (g_rt->cfg.api_key[0] && !strpbrk(g_rt->cfg.api_key, "\r\n")) /* engines take the clients' key (--api-key) */
        evbuffer_add_printf(req, "Authorization: Bearer %s\r\n", g_rt->cfg.api_key);
    evbuffer_add(req, "\r\n", 2);
    s->mleg = up_leg_start(s->p->up, s->idx, req, probe_timeouts(), &cbs, s);
    evbuffer_free(req);
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
    int hint = s->hint, ok = !err && s->hstatus == 200;
    s->hint = 0;
    hinted_result(s, hint, ok, why);
    if (ok && s->healthy && !s->mml_known && !s->mleg)
        models_fetch(s);
    else if (ok && s->mml_known)
        apply_mml(s);
    if (s->pending) /* a hint came while it ran */
        event_active(s->p->hint_ev, EV_TIMEOUT, 0);
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

static void check(struct probe *p, size_t i, int hint)
{
    static const struct up_leg_cbs cbs = {h_head, NULL, h_done, NULL, NULL, NULL};
    struct ep_state *s = &p->eps[i];
    s->hstatus = 0;
    s->hint = hint;
    struct evbuffer *req = get_request((int)i, "/health");
    s->hleg = up_leg_start(p->up, (int)i, req, probe_timeouts(), &cbs, s);
    evbuffer_free(req);
}

static void on_health_tick(evutil_socket_t fd, short ev, void *arg)
{
    struct probe *p = arg;
    for (size_t i = 0; i < n_endpoints(); i++)
        if (ep_in_use(p, i) && !p->eps[i].hleg) /* used, and the previous check is not still running */
            check(p, i, 0);
}

/* The KV-event consumer's hints (kv_sub.h), and the checks they ask for. */
static void on_hint(evutil_socket_t fd, short ev, void *arg)
{
    struct probe *p = arg;
    size_t n = n_endpoints();
    for (int role = 0; role < 2; role++)
        for (size_t i = 0; i < g_rt->reg.n_ranks[role]; i++) {
            int h = rt_kv_take_hint(role, (int)i), e = g_rt->reg.ranks[role][i].endpoint;
            if (!h || e < 0 || (size_t)e >= n || !ep_in_use(p, (size_t)e))
                continue;
            struct ep_state *s = &p->eps[e];
            s->pending = h;
            if (h == KV_HINT_GONE) {
                s->gone = 1;
                s->gone_failed = 0;
                if (s->recheck_ev)
                    event_del(s->recheck_ev);
            } else {
                s->recheck_until = xpyd_now_us() + (uint64_t)g_rt->cfg.health_interval_ms * 1000u;
            }
        }
    for (size_t i = 0; i < n; i++) {
        struct ep_state *s = &p->eps[i];
        if (s->pending && !s->hleg && s->sbody) {
            check(p, i, s->pending);
            s->pending = 0;
        }
    }
}

static void on_recheck(evutil_socket_t fd, short ev, void *arg)
{
    struct ep_state *s = arg;
    s->pending = s->pending ? s->pending : KV_HINT_BACK; /* started by on_hint (after a check in flight ends) */
    event_active(s->p->hint_ev, EV_TIMEOUT, 0);
}

static void wake(void *arg)
{
    event_active(((struct probe *)arg)->hint_ev, EV_TIMEOUT, 0);
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
    if (g_rt->cfg.health_interval_ms > 0 && g_rt->cfg.kv_events_recheck_ms > 0) {
        p->hint_ev = XPYD_XALLOC(event_new(base, -1, 0, on_hint, p));
        rt_kv_on_hint(wake, p);
    }
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
    if (p->hint_ev) {
        rt_kv_on_hint(NULL, NULL); /* (returns once no wake-up is under way) */
        event_free(p->hint_ev);
    }
    if (p->scrape_ev)
        event_free(p->scrape_ev);
    for (size_t i = 0; i < p->n; i++) {
        if (p->eps[i].recheck_ev)
            event_free(p->eps[i].recheck_ev);
        up_leg_cancel(p->eps[i].hleg);
        up_leg_cancel(p->eps[i].sleg);
        up_leg_cancel(p->eps[i].mleg);
        if (p->eps[i].sbody)
            evbuffer_free(p->eps[i].sbody);
        if (p->eps[i].mbody)
            evbuffer_free(p->eps[i].mbody);
    }
    up_thread_free(p->up);
    free(p->eps);
    free(p);
}
