/* SPDX-License-Identifier: Apache-2.0 */
/* registry.c - the live pools, their one owner (g_rt->reg): it starts from the configuration's plan and the
 * configuration is not changed afterwards. Endpoints and ranks live in arrays of fixed capacity (--max-instances
 * ranks per pool, twice that in endpoints) made at start, so they never move: worker threads read them without a
 * lock while the admin API, etcd or a SIGHUP reload appends (an entry is written completely, then the count is
 * published with a release store) or marks an entry removed. A removed rank keeps its slot and index while requests
 * in flight on it finish and release exactly what they charged; adding the same host:port:rank again revives that
 * slot. When a pool has no never-used slot left, the next engine that joins takes the slot of a removed rank with
 * nothing this router charged on it in flight (its balancer state starts afresh, its per-rank counters from zero);
 * likewise an endpoint no rank refers to any more goes to the next new address once the endpoint table is full
 * (up_endpoint.gen tells the connection pools and TLS sessions of the old address apart). So engines that come and
 * go under new addresses never fill the pools. Mutations are serialized by one mutex; readers that hold no charge on
 * a rank (metrics, /status, the admin list) read identities under it. */
#include "handoff.h"
#include "kv_endpoint.h"
#include "router.h"
#include "xpyd_reply.h"
#include "admin_parse.h"
#include "loopguard.h"

#include "xpyd_oai.h"
#include "xpyd_util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <event2/buffer.h>
#include <evhtp/evhtp.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;

int rt_rank_identity(int role, int idx, char *hp, size_t cap)
{
    pthread_mutex_lock(&reg_mu);
    int dp = -1;
    if (idx < 0 || (size_t)idx >= __atomic_load_n(&g_rt->reg.n_ranks[role], __ATOMIC_ACQUIRE)) {
        snprintf(hp, cap, "-");
    } else {
        const struct rt_live_rank *r = &g_rt->reg.ranks[role][idx];
        const struct rt_endpoint_cfg *e = &g_rt->reg.endpoints[r->endpoint];
        xpyd_hostport(e->host, e->port, hp, cap);
        dp = r->dp_rank;
    }
    pthread_mutex_unlock(&reg_mu);
    return dp;
}

int rt_rank_kv_events(int role, int idx, char *ep, size_t cap)
{
    pthread_mutex_lock(&reg_mu);
    int live = idx >= 0 && (size_t)idx < __atomic_load_n(&g_rt->reg.n_ranks[role], __ATOMIC_ACQUIRE) &&
               !rt_rank_removed(role, idx);
    snprintf(ep, cap, "%s", live ? g_rt->reg.ranks[role][idx].kv_events : "");
    pthread_mutex_unlock(&reg_mu);
    return live;
}

/* A rank slot another engine may take: removed, with nothing this router charged on it in flight. */
static int rank_reusable(int role, size_t i)
{
    struct xb_instance_stats st;
    return xb_stats(g_rt->pools[role], (int)i, &st) == 0 && st.removed && st.inflight == 0;
}

void rt_registry_slots(int role, long *active, long *draining, long *unused)
{
    pthread_mutex_lock(&reg_mu);
    long a = 0, d = 0;
    for (size_t i = 0; i < g_rt->reg.n_ranks[role]; i++) {
        struct xb_instance_stats st;
        xb_stats(g_rt->pools[role], (int)i, &st);
        a += !st.removed;
        d += st.removed && st.inflight > 0;
    }
    pthread_mutex_unlock(&reg_mu);
    *active = a;
    *draining = d;
    *unused = g_rt->cfg.max_instances - a - d;
}

/* The query endpoint (host:bootstrap port) of a prefill rank, if it has one in the table. Under reg_mu. */
static int query_endpoint_of(const struct rt_live_rank *r)
{
    const struct rt_endpoint_cfg *e = &g_rt->reg.endpoints[r->endpoint];
    for (size_t i = 0; i < g_rt->reg.n_endpoints; i++)
        if (g_rt->reg.endpoints[i].port == r->bootstrap_port && !strcmp(g_rt->reg.endpoints[i].host, e->host))
            return (int)i;
    return -1;
}

/* An endpoint slot no rank refers to (nor, under --handoff mooncake, a prefill's /query), or -1. Under reg_mu. */
static int endpoint_unreferenced(void)
{
    size_t n = g_rt->reg.n_endpoints;
    if (!n)
        return -1;
    char *used = XPYD_XALLOC(calloc(n, 1));
    for (int role = 0; role < 2; role++)
        for (size_t i = 0; i < g_rt->reg.n_ranks[role]; i++) {
            const struct rt_live_rank *r = &g_rt->reg.ranks[role][i];
            used[r->endpoint] = 1;
            if (role == RT_PREFILL && rt_config_prefill_by_query(&g_rt->cfg) && !rank_reusable(role, i)) {
                int q = query_endpoint_of(r);
                if (q >= 0)
                    used[q] = 1;
            }
        }
    int free_idx = -1;
    for (size_t i = 0; i < n && free_idx < 0; i++)
        if (!used[i])
            free_idx = (int)i;
    free(used);
    return free_idx;
}

void rt_registry_endpoint_slots(long *used, long *unused)
{
    pthread_mutex_lock(&reg_mu);
    long n = (long)g_rt->reg.n_endpoints, u = n;
    if (endpoint_unreferenced() >= 0) { /* count them: a scrape is rare, the table small */
        char *seen = XPYD_XALLOC(calloc((size_t)n, 1));
        for (int role = 0; role < 2; role++)
            for (size_t i = 0; i < g_rt->reg.n_ranks[role]; i++)
                seen[g_rt->reg.ranks[role][i].endpoint] = 1;
        u = 0;
        for (long i = 0; i < n; i++)
            u += seen[i];
        free(seen);
    }
    pthread_mutex_unlock(&reg_mu);
    *used = u;
    *unused = (long)g_rt->ep_cap - u;
}

enum { APPLY_UPDATED = 0, APPLY_ADDED, APPLY_REVIVED, APPLY_UNCHANGED };
static const char *const apply_names[] = {"updated", "added", "revived", "unchanged"};

static struct rt_live_rank live_rank(const struct rt_rank *plan, int endpoint)
{
    struct rt_live_rank r = {endpoint, plan->dp_rank, plan->bootstrap_port, "", RT_SRC_CONFIG, ""};
    memcpy(r.kv_events, plan->kv_events, sizeof r.kv_events);
    return r;
}

/* A prefill rank that must describe itself first (--handoff mooncake: GET /query) starts unready. */
static int learned_role(const struct rt_config *c, int role)
{
    return role == RT_PREFILL && rt_config_prefill_by_query(c);
}

/* What the balancer is told of a planned rank; its key (host:port/dp rank) places it on the session ring the
 * same way in every router replica. */
static struct xb_instance_cfg inst_cfg(const struct rt_rank *r, const char *host, int port)
{
    char id[300];
    int n = snprintf(id, sizeof id, "%s:%d/%d", host, port, r->dp_rank);
    uint64_t key = XXH3_64bits(id, n > 0 && (size_t)n < sizeof id ? (size_t)n : strlen(id));
    struct xb_instance_cfg ic = {r->tp, r->weight, r->max_model_len, r->max_inflight, key ? key : 1};
    return ic;
}

/* The registry starts from the configuration's plan (its endpoints and expanded ranks), copied into arrays
 * of fixed capacity it owns from here on; the configuration itself is not changed after start. */
int rt_registry_setup(struct router *rt)
{
    const struct rt_config *c = &rt->cfg;
    struct rt_registry *g = &rt->reg;
    size_t cap = (size_t)c->max_instances, ecap = 2 * cap;
    for (int role = 0; role < 2; role++)
        if (c->n_ranks[role] > cap) {
            fprintf(stderr, "xpyd_router: the %s pool has %zu ranks, more than --max-instances %zu\n",
                    role ? "decode" : "prefill", c->n_ranks[role], cap);
            return -1;
        }
    g->endpoints = XPYD_XALLOC(calloc(ecap, sizeof *g->endpoints));
    if (c->n_endpoints) /* none with --discovery and no -p/-d */
        memcpy(g->endpoints, c->endpoints, c->n_endpoints * sizeof *g->endpoints);
    g->n_endpoints = c->n_endpoints;
    rt->endpoints = XPYD_XALLOC(calloc(ecap, sizeof *rt->endpoints));
    rt->ep_cap = ecap;
    for (size_t i = 0; i < g->n_endpoints; i++) {
        rt->endpoints[i].tls = g->endpoints[i].tls;
        if (up_endpoint_resolve(&rt->endpoints[i], g->endpoints[i].host, g->endpoints[i].port) != 0) {
            fprintf(stderr, "xpyd_router: cannot resolve '%s'\n", g->endpoints[i].host);
            return -1;
        }
    }
    rt->n_endpoints = g->n_endpoints;
    for (int role = 0; role < 2; role++) {
        g->ranks[role] = XPYD_XALLOC(calloc(cap, sizeof(struct rt_live_rank)));
        for (size_t i = 0; i < c->n_ranks[role]; i++)
            g->ranks[role][i] = live_rank(&c->ranks[role][i], c->ranks[role][i].endpoint);
        g->n_ranks[role] = c->n_ranks[role];
        rt->pools[role] = XPYD_XALLOC(xb_pool_new(c->pools[role].policy, 0x5eed + (uint64_t)role));
        xb_set_ejection(rt->pools[role], (int)c->eject_after, c->eject_base_ms, c->eject_max_ms);
        xb_set_hard_cap(rt->pools[role], c->admission_queue > 0);
        rt->prefix_on[role] = c->pools[role].policy == XB_POLICY_CACHE ||
                              (role == RT_DECODE && (c->local_prefill_max_tokens || c->local_prefill_when_busy_tokens));
        if (rt->prefix_on[role] && xb_prefix_enable(rt->pools[role], c->prefix_cache_blocks,
                                                    (size_t)c->prefix_index_max_bytes, c->prefix_ttl_ms,
                                                    c->cache_max_imbalance) != 0)
            return -1;
        xb_cache_weight(rt->pools[role], c->cache_uncached_weight);
        if (c->session_key[0])
            xb_session_enable(rt->pools[role], c->session_epsilon);
        if (xb_pool_reserve(rt->pools[role], cap) != 0)
            return -1;
        for (size_t i = 0; i < g->n_ranks[role]; i++) {
            const struct rt_endpoint_cfg *e = &c->endpoints[c->ranks[role][i].endpoint];
            struct xb_instance_cfg ic = inst_cfg(&c->ranks[role][i], e->host, e->port);
            if (xb_pool_add(rt->pools[role], &ic) != (int)i)
                return -1;
            if (learned_role(c, role))
                xb_set_ready(rt->pools[role], (int)i, 0);
        }
    }
    return 0;
}

int rt_registry_self_check(char *err, size_t cap)
{
    for (size_t i = 0; i < g_rt->n_endpoints; i++)
        if (rt_loop_is_self((const struct sockaddr *)&g_rt->endpoints[i].addr, g_rt->endpoints[i].addrlen)) {
            char hp[300];
            snprintf(err, cap, "%s is this router's own listener: requests sent there would come back to it (give "
                               "the engine's address)",
                     xpyd_hostport(g_rt->endpoints[i].host, g_rt->endpoints[i].port, hp, sizeof hp));
            return -1;
        }
    return 0;
}

/* The endpoint host:port, appended (and resolved) when new. Under reg_mu. */
static int endpoint_for(const char *host, int port, int tls, char *err, size_t errcap)
{
    struct rt_registry *c = &g_rt->reg;
    for (size_t i = 0; i < c->n_endpoints; i++)
        if (c->endpoints[i].port == port && strcmp(c->endpoints[i].host, host) == 0) {
            if (c->endpoints[i].tls != tls) {
                snprintf(err, errcap, "%s:%d is already configured as %s (changing the scheme needs a restart)", host,
                         port, c->endpoints[i].tls ? "https" : "http");
                return -EINVAL;
            }
            return (int)i;
        }
    int reuse = c->n_endpoints >= g_rt->ep_cap ? endpoint_unreferenced() : -1; /* new slots first */
    size_t n = reuse >= 0 ? (size_t)reuse : c->n_endpoints;
    if (n >= g_rt->ep_cap) {
        snprintf(err, errcap, "no room for another endpoint (2 x --max-instances = %zu, all in use)", g_rt->ep_cap);
        return -ENOSPC;
    }
    struct up_endpoint ep;
    memset(&ep, 0, sizeof ep);
    if (strlen(host) >= sizeof c->endpoints[0].host || up_endpoint_resolve(&ep, host, port) != 0) {
        snprintf(err, errcap, "cannot resolve host '%.200s'", host);
        return -EINVAL;
    }
    if (rt_loop_is_self((const struct sockaddr *)&ep.addr, ep.addrlen)) {
        snprintf(err, errcap, "%.200s:%d is this router's own listener: requests sent there would come back to it",
                 host, port);
        return -EINVAL;
    }
    /* written field by field: the slot's generation is read by other threads (their pooled connections) */
    struct up_endpoint *live = &g_rt->endpoints[n];
    memcpy(live->host, ep.host, sizeof ep.host);
    live->port = ep.port;
    memcpy(live->hostport, ep.hostport, sizeof ep.hostport);
    live->addr = ep.addr;
    live->addrlen = ep.addrlen;
    live->tls = tls;
    snprintf(c->endpoints[n].host, sizeof c->endpoints[n].host, "%s", host);
    c->endpoints[n].port = port;
    c->endpoints[n].tls = tls;
    if (reuse >= 0) {
        __atomic_add_fetch(&live->gen, 1, __ATOMIC_RELEASE); /* connections to the old address are not reused */
        atomic_fetch_add(&g_rt->ctr.endpoint_reuses, 1);
        return reuse;
    }
    __atomic_store_n(&c->n_endpoints, n + 1, __ATOMIC_RELEASE);
    __atomic_store_n(&g_rt->n_endpoints, n + 1, __ATOMIC_RELEASE);
    return (int)n;
}

/* Puts one rank (want->endpoint ignored: host:port given) into role's pool: a new slot, a revived one, or
 * new settings for an active one. Returns APPLY_* and the index, or -errno with err set. Under reg_mu. */
static int apply_rank(int role, const char *host, int port, const struct rt_rank *want, int *idx_out, char *err,
                      size_t errcap)
{
    struct rt_registry *c = &g_rt->reg;
    int ep = endpoint_for(host, port, want->tls, err, errcap);
    if (ep < 0)
        return ep;
    struct xb_instance_cfg ic = inst_cfg(want, host, port);
    for (size_t i = 0; i < c->n_ranks[role]; i++) {
        struct rt_live_rank *cur = &c->ranks[role][i];
        if (cur->endpoint != ep || cur->dp_rank != want->dp_rank)
            continue;
        int was_removed = rt_rank_removed(role, (int)i);
        struct xb_instance_stats st;
        xb_stats(g_rt->pools[role], (int)i, &st);
        int same = cur->bootstrap_port == want->bootstrap_port && st.tp == ic.tp && st.weight == ic.weight &&
                   st.max_model_len == ic.max_model_len && st.max_inflight == ic.max_inflight &&
                   !strcmp(cur->kv_events, want->kv_events);
        cur->bootstrap_port = want->bootstrap_port;
        memcpy(cur->kv_events, want->kv_events, sizeof cur->kv_events);
        xb_update(g_rt->pools[role], (int)i, &ic);
        *idx_out = (int)i;
        if (!was_removed)
            return same ? APPLY_UNCHANGED : APPLY_UPDATED;
        if (learned_role(&g_rt->cfg, role)) { /* back, but its engine must describe itself again */
            cur->engine_id[0] = 0;
            xb_set_ready(g_rt->pools[role], (int)i, 0);
        }
        xb_set_removed(g_rt->pools[role], (int)i, 0);
        return APPLY_REVIVED;
    }
    /* a never-used slot first (a removed rank keeps its slot for its own return while there is room); when the
     * pool is full, the first removed slot with nothing in flight */
    for (size_t i = 0; c->n_ranks[role] >= (size_t)g_rt->cfg.max_instances && i < c->n_ranks[role]; i++) {
        if (!rank_reusable(role, i))
            continue;
        /* written while the slot is removed (never picked); xb_reuse puts it back in the pool afresh */
        c->ranks[role][i] = live_rank(want, ep);
        if (xb_reuse(g_rt->pools[role], (int)i, &ic) != 0)
            continue; /* not reached: a removed rank gains no charges */
        for (int k = 0; i < 4096 && k < RT_CAUSE_COUNT; k++)
            atomic_store(&g_rt->ctr.instance_errors[role][i][k], 0);
        if (learned_role(&g_rt->cfg, role))
            xb_set_ready(g_rt->pools[role], (int)i, 0);
        __atomic_add_fetch(&c->generation, 1, __ATOMIC_RELEASE);
        atomic_fetch_add(&g_rt->ctr.rank_reuses[role], 1);
        *idx_out = (int)i;
        return APPLY_ADDED;
    }
    size_t n = c->n_ranks[role];
    if (n >= (size_t)g_rt->cfg.max_instances) {
        snprintf(err, errcap, "the %s pool is full (--max-instances %ld ranks, every one active or with requests "
                              "still in flight)",
                 role ? "decode" : "prefill", g_rt->cfg.max_instances);
        return -ENOSPC;
    }
    c->ranks[role][n] = live_rank(want, ep);
    if (xb_pool_add(g_rt->pools[role], &ic) != (int)n) {
        snprintf(err, errcap, "the balancer refused the instance");
        return -EINVAL;
    }
    if (learned_role(&g_rt->cfg, role))
        xb_set_ready(g_rt->pools[role], (int)n, 0);
    __atomic_store_n(&c->n_ranks[role], n + 1, __ATOMIC_RELEASE);
    *idx_out = (int)n;
    return APPLY_ADDED;
}

static void remove_rank(int role, int idx)
{
    xb_set_removed(g_rt->pools[role], idx, 1);
}

static void log_change(const char *what, int role, int idx)
{
    const struct rt_live_rank *r = &g_rt->reg.ranks[role][idx];
    const struct rt_endpoint_cfg *e = &g_rt->reg.endpoints[r->endpoint];
    char hp[300];
    xpyd_log_event(XPYD_LOG_INFO, "event=instance_%s role=%s instance=%s dp_rank=%d", what, role ? "decode" : "prefill",
                   xpyd_hostport(e->host, e->port, hp, sizeof hp), r->dp_rank);
}

/* ---------- SIGHUP: the configuration again, applied as a difference ---------- */

int rt_reload(void)
{
    struct rt_config nc;
    int rc = rt_config_load(&nc, g_rt->argc, g_rt->argv);
    if (rc == 0 && nc.handoff != g_rt->cfg.handoff) {
        fprintf(stderr, "xpyd_router: --handoff changes need a restart (running: %s)\n",
                rt_handoff_names[g_rt->cfg.handoff]);
        rc = -1;
    }
    if (rc == 0 && !rt_handoff_resolve(&nc))
        rc = -1;
    xpyd_log_level = g_rt->cfg.log_level; /* the reload parses --log-level too; the running one stays */
    if (rc != 0) {
        xpyd_log_event(XPYD_LOG_ERROR, "event=reload_failed reason=\"configuration rejected (see the message above); nothing "
                       "changed\"");
        rt_config_free(&nc);
        return -1;
    }
    char restart[600];
    size_t nrestart = rt_config_changed(&g_rt->cfg, &nc, restart, sizeof restart);
    int counts[5] = {0, 0, 0, 0, 0}; /* updated, added, revived, unchanged, removed */
    char err[300] = "";
    pthread_mutex_lock(&reg_mu);
    for (int role = 0; role < 2 && !err[0]; role++) {
        size_t n_old = g_rt->reg.n_ranks[role];
        char *keep = XPYD_XALLOC(calloc(n_old + nc.n_ranks[role] + 1, 1));
        for (size_t i = 0; i < nc.n_ranks[role]; i++) {
            const struct rt_rank *want = &nc.ranks[role][i];
            const struct rt_endpoint_cfg *e = &nc.endpoints[want->endpoint];
            int idx = -1;
            int res = apply_rank(role, e->host, e->port, want, &idx, err, sizeof err);
            if (res < 0)
                break;
            g_rt->reg.ranks[role][idx].source = RT_SRC_CONFIG;
            counts[res]++;
            if (res == APPLY_ADDED || res == APPLY_REVIVED)
                log_change(apply_names[res], role, idx);
            if ((size_t)idx < n_old + nc.n_ranks[role])
                keep[idx] = 1;
        }
        if (learned_role(&g_rt->cfg, role)) /* the prefill's own ranks (from /query) stay while it is planned */
            for (size_t i = 0; i < n_old; i++)
                for (size_t k = 0; k < nc.n_ranks[role] && !keep[i]; k++) {
                    const struct rt_endpoint_cfg *e = &nc.endpoints[nc.ranks[role][k].endpoint];
                    const struct rt_endpoint_cfg *cur = &g_rt->reg.endpoints[g_rt->reg.ranks[role][i].endpoint];
                    keep[i] = e->port == cur->port && strcmp(e->host, cur->host) == 0;
                }
        for (size_t i = 0; i < n_old && !err[0]; i++)
            if (!keep[i] && !rt_rank_removed(role, (int)i) && g_rt->reg.ranks[role][i].source != RT_SRC_ETCD) {
                remove_rank(role, (int)i);
                log_change("removed", role, (int)i);
                counts[4]++;
            }
        free(keep);
    }
    pthread_mutex_unlock(&reg_mu);
    rt_config_free(&nc);
    if (err[0]) {
        xpyd_log_event(XPYD_LOG_ERROR, "event=reload_failed reason=\"%s\" (changes before it were applied)", err);
        return -1;
    }
    xpyd_log_event(XPYD_LOG_INFO, "event=reloaded added=%d revived=%d updated=%d unchanged=%d removed=%d", counts[APPLY_ADDED],
                   counts[APPLY_REVIVED], counts[APPLY_UPDATED], counts[APPLY_UNCHANGED], counts[4]);
    if (nrestart)
        xpyd_log_event(XPYD_LOG_WARN, "event=reload_needs_restart settings=\"%s\" detail=\"only the pools change at runtime; these "
                       "keep their running values until a restart\"", restart);
    return 0;
}

/* ---------- ranks a prefill describes itself (--handoff mooncake: GET /query) ---------- */

size_t rt_registry_query_targets(struct rt_query_target *out, size_t cap)
{
    size_t n = 0;
    char err[300];
    pthread_mutex_lock(&reg_mu);
    for (size_t i = 0; i < g_rt->reg.n_ranks[RT_PREFILL] && n < cap; i++) {
        const struct rt_live_rank *r = &g_rt->reg.ranks[RT_PREFILL][i];
        int seen = 0;
        for (size_t k = 0; k < n && !seen; k++)
            seen = out[k].endpoint == r->endpoint;
        if (seen || rt_rank_removed(RT_PREFILL, (int)i))
            continue;
        int q = endpoint_for(g_rt->reg.endpoints[r->endpoint].host, r->bootstrap_port, 0, err, sizeof err);
        if (q < 0) {
            XLOG_WARN("msg=\"cannot query a prefill's bootstrap server\" reason=\"%s\"", err);
            continue;
        }
        out[n].endpoint = r->endpoint;
        out[n].query_endpoint = q;
        n++;
    }
    pthread_mutex_unlock(&reg_mu);
    return n;
}

void rt_registry_learned(int endpoint, const char *const *ids, int n, const char *why)
{
    struct rt_registry *g = &g_rt->reg;
    pthread_mutex_lock(&reg_mu);
    int tmpl = -1; /* an active rank of the endpoint: what new ranks of it inherit */
    for (size_t i = 0; i < g->n_ranks[RT_PREFILL] && tmpl < 0; i++)
        if (g->ranks[RT_PREFILL][i].endpoint == endpoint && !rt_rank_removed(RT_PREFILL, (int)i))
            tmpl = (int)i;
    if (tmpl < 0) { /* taken out meanwhile (admin API, reload): it stays out */
        pthread_mutex_unlock(&reg_mu);
        return;
    }
    const struct rt_endpoint_cfg *e = &g->endpoints[endpoint];
    char hp[300];
    xpyd_hostport(e->host, e->port, hp, sizeof hp);
    int changed = 0, ready = 0;
    if (n < 0) {
        for (size_t i = 0; i < g->n_ranks[RT_PREFILL]; i++) {
            struct xb_instance_stats st;
            if (g->ranks[RT_PREFILL][i].endpoint != endpoint || rt_rank_removed(RT_PREFILL, (int)i) ||
                xb_stats(g_rt->pools[RT_PREFILL], (int)i, &st) != 0 || !st.ready)
                continue;
            xb_set_ready(g_rt->pools[RT_PREFILL], (int)i, 0);
            changed++;
        }
        pthread_mutex_unlock(&reg_mu);
        if (changed)
            xpyd_log_event(XPYD_LOG_WARN, "event=prefill_unready instance=%s ranks=%d reason=\"%s\"", hp, changed, why);
        return;
    }
    struct xb_instance_stats ts;
    xb_stats(g_rt->pools[RT_PREFILL], tmpl, &ts);
    struct rt_rank want = {0};
    want.tp = ts.tp;
    want.weight = ts.weight;
    want.max_model_len = ts.max_model_len;
    want.max_inflight = ts.max_inflight;
    want.bootstrap_port = g->ranks[RT_PREFILL][tmpl].bootstrap_port;
    want.tls = e->tls;
    char host[256];
    snprintf(host, sizeof host, "%s", e->host);
    int port = e->port;
    for (int r = 0; r < n; r++) {
        if (!ids[r])
            continue;
        want.dp_rank = r;
        int idx = -1;
        char err[300];
        int res = APPLY_UPDATED;
        for (size_t i = 0; i < g->n_ranks[RT_PREFILL] && idx < 0; i++)
            if (g->ranks[RT_PREFILL][i].endpoint == endpoint && g->ranks[RT_PREFILL][i].dp_rank == r &&
                !rt_rank_removed(RT_PREFILL, (int)i))
                idx = (int)i;
        if (idx < 0) {
            res = apply_rank(RT_PREFILL, host, port, &want, &idx, err, sizeof err);
            if (res < 0) {
                XLOG_WARN("msg=\"cannot add a prefill rank\" instance=%s dp_rank=%d reason=\"%s\"", hp, r, err);
                continue;
            }
            log_change(apply_names[res], RT_PREFILL, idx);
            changed++;
        }
        struct rt_live_rank *lr = &g->ranks[RT_PREFILL][idx];
        struct xb_instance_stats st;
        xb_stats(g_rt->pools[RT_PREFILL], idx, &st);
        if (strcmp(lr->engine_id, ids[r]) != 0 || !st.ready) {
            snprintf(lr->engine_id, sizeof lr->engine_id, "%s", ids[r]);
            xb_set_ready(g_rt->pools[RT_PREFILL], idx, 1);
            changed++;
        }
        ready++;
    }
    for (size_t i = 0; i < g->n_ranks[RT_PREFILL]; i++) { /* ranks the prefill no longer has */
        struct rt_live_rank *lr = &g->ranks[RT_PREFILL][i];
        if (lr->endpoint != endpoint || rt_rank_removed(RT_PREFILL, (int)i) ||
            (lr->dp_rank >= 0 && lr->dp_rank < n && ids[lr->dp_rank]))
            continue;
        remove_rank(RT_PREFILL, (int)i);
        log_change("removed", RT_PREFILL, (int)i);
        changed++;
    }
    pthread_mutex_unlock(&reg_mu);
    if (changed)
        xpyd_log_event(XPYD_LOG_INFO, "event=prefill_ranks_learned instance=%s ranks=%d", hp, ready);
}

int rt_rank_engine_id(int role, int idx, char *out, size_t cap)
{
    pthread_mutex_lock(&reg_mu);
    const char *id = g_rt->reg.ranks[role][idx].engine_id;
    int ok = id[0] != 0;
    snprintf(out, cap, "%s", id);
    pthread_mutex_unlock(&reg_mu);
    return ok ? 0 : -1;
}

/* ---------- admin API ---------- */

/* Admin endpoints answer 403 while no admin key is set, 401 without the right one. */
static int admin_allowed(evhtp_request_t *req)
{
    if (!g_rt->cfg.admin_key[0]) {
        xpyd_reply_error(req, 403, "the admin API is off: start the router with --admin-key (or XPYD_ADMIN_KEY)");
        return 0;
    }
    if (!rt_bearer_ok(req, g_rt->cfg.admin_key)) {
        evhtp_headers_add_header(req->headers_out, evhtp_header_new("WWW-Authenticate", "Bearer", 0, 0));
        xpyd_reply_error(req, 401, "invalid or missing admin key: send Authorization: Bearer <admin key>");
        return 0;
    }
    return 1;
}

static cJSON *rank_json(int role, int idx)
{
    const struct rt_live_rank *r = &g_rt->reg.ranks[role][idx];
    const struct rt_endpoint_cfg *e = &g_rt->reg.endpoints[r->endpoint];
    struct xb_instance_stats st;
    xb_stats(g_rt->pools[role], idx, &st);
    cJSON *o = XPYD_XALLOC(cJSON_CreateObject());
    cJSON_AddStringToObject(o, "role", role ? "decode" : "prefill");
    cJSON_AddNumberToObject(o, "index", idx);
    cJSON_AddStringToObject(o, "host", e->host);
    cJSON_AddNumberToObject(o, "port", e->port);
    cJSON_AddNumberToObject(o, "dp_rank", r->dp_rank);
    /* capacity, limits and eligibility as placement uses them: the balancer's (their one owner at runtime) */
    cJSON_AddNumberToObject(o, "tp", st.tp);
    cJSON_AddNumberToObject(o, "weight", st.weight);
    cJSON_AddNumberToObject(o, "max_inflight", st.max_inflight);
    cJSON_AddNumberToObject(o, "max_model_len", (double)st.max_model_len);
    cJSON_AddNumberToObject(o, "learned_max_model_len", (double)st.learned_max_model_len);
    cJSON_AddBoolToObject(o, "removed", st.removed);
    cJSON_AddBoolToObject(o, "healthy", st.healthy);
    cJSON_AddBoolToObject(o, "ready", st.ready);
    if (r->engine_id[0])
        cJSON_AddStringToObject(o, "engine_id", r->engine_id);
    if (r->kv_events[0])
        cJSON_AddStringToObject(o, "kv_events", r->kv_events);
    static const char *const sources[] = {"config", "admin", "etcd"};
    cJSON_AddStringToObject(o, "source", sources[r->source]);
    cJSON_AddNumberToObject(o, "inflight", (double)st.inflight);
    return o;
}

static void send_cjson(evhtp_request_t *req, int status, cJSON *o)
{
    char *s = XPYD_XALLOC(cJSON_PrintUnformatted(o));
    cJSON_Delete(o);
    xpyd_reply(req, status, "application/json", s, strlen(s));
    free(s);
}

static void admin_list(evhtp_request_t *req)
{
    cJSON *o = XPYD_XALLOC(cJSON_CreateObject());
    pthread_mutex_lock(&reg_mu);
    for (int role = 0; role < 2; role++) {
        cJSON *a = cJSON_AddArrayToObject(o, role ? "decode" : "prefill");
        for (size_t i = 0; i < g_rt->reg.n_ranks[role]; i++)
            cJSON_AddItemToArray(a, rank_json(role, (int)i));
    }
    pthread_mutex_unlock(&reg_mu);
    send_cjson(req, 200, o);
}

static int parse_role(const char *s)
{
    return !strcmp(s, "prefill") ? RT_PREFILL : !strcmp(s, "decode") ? RT_DECODE : -1;
}

/* POST /admin/instances {"role","host","port"[,"dp","tp","weight","max_inflight","max_model_len",
 * "bootstrap_port","kv_events"]}: every rank of that host, expanded as the configuration does. */
int rt_registry_add(const struct rt_admin_instance *in, int source, cJSON *report, int *changed, char *err,
                    size_t cap)
{
    int role = in->role;
    *changed = 0;
    pthread_mutex_lock(&reg_mu);
    if (source == RT_SRC_ETCD) /* a configured (or admin-added) endpoint is not discovery's to change */
        for (size_t i = 0; i < g_rt->reg.n_ranks[role]; i++) {
            const struct rt_live_rank *r = &g_rt->reg.ranks[role][i];
            const struct rt_endpoint_cfg *e = &g_rt->reg.endpoints[r->endpoint];
            if (r->source != RT_SRC_ETCD && !rt_rank_removed(role, (int)i) && e->port == in->port &&
                strcmp(e->host, in->host) == 0) {
                pthread_mutex_unlock(&reg_mu);
                snprintf(err, cap, "%s:%ld is configured statically; its settings there win", in->host, in->port);
                return 0;
            }
        }
    int by_header = rt_config_ranks_by_header(&g_rt->cfg, role), status = 0;
    for (long i = 0; i < in->dp; i++) {
        struct rt_rank want = {0};
        want.dp_rank = by_header ? (int)i : -1;
        want.tp = (int)in->tp;
        want.weight = (int)in->weight;
        want.max_inflight = (int)in->max_inflight;
        want.max_model_len = in->max_model_len;
        want.bootstrap_port = role == RT_PREFILL ? rt_config_bootstrap_port(&g_rt->cfg, (int)in->bootstrap_port,
                                                                            (int)in->port) + (by_header ? 0 : (int)i)
                                                 : 0; /* external DP: each rank's own, as in config.c */
        want.tls = in->tls;
        rt_kv_endpoint_for(in->kv_events, in->host, g_rt->cfg.kv_events_port[role], (int)i, want.kv_events,
                           sizeof want.kv_events);
        int idx = -1;
        int res = apply_rank(role, in->host, (int)(by_header ? in->port : in->port + i), &want, &idx, err, cap);
        if (res < 0) {
            status = res == -ENOSPC ? 507 : 400;
            break;
        }
        g_rt->reg.ranks[role][idx].source = source;
        int grew = res == APPLY_ADDED || res == APPLY_REVIVED;
        *changed |= grew;
        if (grew)
            log_change(apply_names[res], role, idx);
        if (report) {
            cJSON *rj = rank_json(role, idx);
            cJSON_AddStringToObject(rj, "result", apply_names[res]);
            cJSON_AddItemToArray(report, rj);
        }
    }
    pthread_mutex_unlock(&reg_mu);
    return status;
}

static void admin_add(evhtp_request_t *req)
{
    size_t len = evbuffer_get_length(req->buffer_in);
    char err[300] = "";
    struct rt_admin_defaults defs[2];
    for (int r = 0; r < 2; r++)
        defs[r] = (struct rt_admin_defaults){g_rt->cfg.pools[r].dp, g_rt->cfg.pools[r].tp, g_rt->cfg.pools[r].max_inflight};
    struct rt_admin_instance in;
    if (rt_admin_parse_instance(len ? (const char *)evbuffer_pullup(req->buffer_in, -1) : "", len, defs,
                                g_rt->cfg.dp_internal, &in, err, sizeof err) != 0) {
        xpyd_reply_error(req, 400, err);
        return;
    }
    cJSON *out = XPYD_XALLOC(cJSON_CreateObject());
    cJSON *arr = cJSON_AddArrayToObject(out, "instances");
    int changed = 0;
    int status = rt_registry_add(&in, RT_SRC_ADMIN, arr, &changed, err, sizeof err);
    if (status) {
        cJSON_Delete(out);
        xpyd_reply_error(req, status, err);
        return;
    }
    send_cjson(req, changed ? 201 : 200, out);
}

/* DELETE /admin/instances/<role>/<host>:<port>: every active rank of that endpoint in role stops getting
 * requests; the ones in flight finish. */
static void admin_remove(evhtp_request_t *req, const char *rest)
{
    char buf[400];
    snprintf(buf, sizeof buf, "%s", rest);
    char *slash = strchr(buf, '/');
    char *colon = slash ? strrchr(slash + 1, ':') : NULL;
    int role = -1;
    long port = 0;
    if (slash) {
        *slash = 0;
        role = parse_role(buf);
    }
    if (role < 0 || !colon || xpyd_parse_long(colon + 1, 1, 65535, &port) != 0) {
        xpyd_reply_error(req, 400, "use DELETE /admin/instances/<prefill|decode>/<host>:<port>");
        return;
    }
    *colon = 0;
    char *host = slash + 1;
    size_t hl = strlen(host);
    if (hl > 2 && host[0] == '[' && host[hl - 1] == ']') { /* [::1]:8200 */
        host[hl - 1] = 0;
        host++;
    }
    cJSON *out = XPYD_XALLOC(cJSON_CreateObject());
    cJSON *arr = cJSON_AddArrayToObject(out, "removed");
    if (!rt_registry_remove(role, host, (int)port, -1, -1, arr)) {
        cJSON_Delete(out);
        xpyd_reply_error(req, 404, "no such active instance in that pool");
        return;
    }
    send_cjson(req, 200, out);
}

int rt_registry_remove(int role, const char *host, int port, int source, int min_dp_rank, cJSON *report)
{
    int n = 0;
    pthread_mutex_lock(&reg_mu);
    for (size_t i = 0; i < g_rt->reg.n_ranks[role]; i++) {
        struct rt_live_rank *r = &g_rt->reg.ranks[role][i];
        const struct rt_endpoint_cfg *e = &g_rt->reg.endpoints[r->endpoint];
        if (rt_rank_removed(role, (int)i) || e->port != port || strcmp(e->host, host) != 0 ||
            (source >= 0 && r->source != source) || r->dp_rank < min_dp_rank)
            continue;
        remove_rank(role, (int)i);
        log_change("removed", role, (int)i);
        if (report)
            cJSON_AddItemToArray(report, rank_json(role, (int)i));
        n++;
    }
    pthread_mutex_unlock(&reg_mu);
    return n;
}

static void on_admin_instances(evhtp_request_t *req, void *arg)
{
    if (!admin_allowed(req))
        return;
    const char *path = req->uri && req->uri->path && req->uri->path->full ? req->uri->path->full : "";
    const char *base = "/admin/instances";
    const char *rest = strncmp(path, base, strlen(base)) == 0 ? path + strlen(base) : "";
    htp_method m = req->method;
    if (!rest[0] && m == htp_method_GET)
        admin_list(req);
    else if (!rest[0] && m == htp_method_POST)
        admin_add(req);
    else if (rest[0] == '/' && rest[1] && m == htp_method_DELETE)
        admin_remove(req, rest + 1);
    else {
        evhtp_headers_add_header(req->headers_out,
                                 evhtp_header_new("Allow", rest[0] ? "DELETE" : "GET, POST", 0, 0));
        xpyd_reply_error(req, 405, "use GET or POST /admin/instances, or DELETE /admin/instances/<role>/<host>:<port>");
    }
}

void rt_admin_handlers(evhtp_t *htp)
{
    evhtp_set_cb(htp, "/admin/instances", on_admin_instances, NULL);
    evhtp_set_glob_cb(htp, "/admin/instances/*", on_admin_instances, NULL);
}
