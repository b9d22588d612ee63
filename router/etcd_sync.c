/* SPDX-License-Identifier: Apache-2.0 */
/* etcd_sync.c - `--discovery etcd://...`: the pools follow what engines registered in etcd, and router
 * replicas share their load. On the main event loop; keys under the cluster prefix P (docs/PROTOCOLS.md#etcd):
 *   P/instances/<prefill|decode>/<host>:<port>  {"dp","tp","weight","max_inflight","max_model_len",
 *                                                "bootstrap_port","tls"} (all optional: the pool's defaults)
 *   P/routers/<id>                              {"address","version"}      under this router's lease
 *   P/load/<id>                                 {"prefill"|"decode": {"<host:port>/<dp rank>": [tokens, requests]}}
 * Membership: a range over P/, then a watch from the next revision; every change goes through the registry
 * like the admin API's (added, updated, removed with streams finishing). When the watch ends (etcd gone, a
 * compaction, an error) the router keeps what it has, retries with jittered backoff, and reads everything
 * again: what vanished meanwhile is removed, what appeared is added. Only ranks discovery added are ever
 * removed by it; a statically configured host:port is left alone.
 * Load: every --load-sync-ms this router publishes the outstanding tokens and requests it charges each rank
 * (a put only when they changed), and sets each rank's "remote" load in the balancer to the sum the other
 * routers published; a router that dies loses its lease and its share vanishes with it. */
#include "etcd_sync.h"

#include "admin_parse.h"
#include "etcd_parse.h"
#include "router.h"
#include "xpyd_etcd.h"
#include "xpyd_etcd_lease.h"
#include "xpyd_util.h"
#include "xpyd_version.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <event2/event.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#define VAL_MAX (256u << 10) /* one value (an instance, a router's load) */

struct disc {        /* an endpoint discovery put into a pool */
    int role, port, dp;
    char host[256];
};

struct peer {        /* another router's published load */
    char id[128];
    int64_t *load;   /* [role][rank][tokens, requests] */
};

struct name_map {    /* published rank names to indices (rank_by_name) */
    int *idx;        /* cap slots, -1 empty; cap a power of two >= 2 × --max-instances */
    size_t cap, indexed;
    unsigned gen;    /* the registry's generation it was built for (a slot given to another engine: rebuilt) */
};

struct esync {
    struct event_base *base;
    struct etcd *e;
    char pfx[ETCD_MAX_PREFIX + 2]; /* "P/" */
    char id[128];
    struct etcd_op *range;
    struct etcd_watch *watch;
    struct event *retry, *load_tick;
    long backoff_ms;
    uint64_t rng;
    int64_t rev;
    struct etcd_reg *reg;
    char reg_key[400], load_key[400];
    struct disc *disc;
    size_t ndisc, capdisc;
    struct peer *peers;
    size_t npeers, cappeers;
    size_t nslots;   /* ranks per role in a peer's table: --max-instances */
    struct name_map names[2];
    long routers;    /* P/routers/ entries seen */
    int left;        /* draining: the lease is revoked */
};

static _Atomic(struct esync *) g_es;

int64_t esync_age_ms(void)
{
    struct esync *s = atomic_load(&g_es);
    if (!s)
        return 0;
    struct etcd_stats st;
    etcd_get_stats(s->e, &st);
    uint64_t now = xpyd_now_us();
    return st.last_ok_us ? (int64_t)((now - st.last_ok_us) / 1000) : (int64_t)(now / 1000);
}

static void set_up(struct esync *s, int up)
{
    atomic_store(&g_rt->ctr.discovery_synced, up);
}

int esync_up(void)
{
    /* in sync, and etcd answered (a watch message, a keep-alive: one every third of the TTL) within a lease's
     * TTL: an etcd that hangs keeps the watch's connection open and answers nothing */
    return atomic_load(&g_rt->ctr.discovery_synced) && esync_age_ms() <= g_rt->cfg.discovery_ttl_s * 1000;
}

static void invalid(const char *key, const char *why)
{
    atomic_fetch_add(&g_rt->ctr.discovery_invalid, 1);
    xpyd_log_event(XPYD_LOG_WARN, "event=discovery_invalid key=\"%.300s\" reason=\"%s\"", key, why);
}

/* ---------- instances ---------- */

static struct disc *find_disc(struct esync *s, int role, const char *host, long port)
{
    for (size_t i = 0; i < s->ndisc; i++)
        if (s->disc[i].role == role && s->disc[i].port == port && !strcmp(s->disc[i].host, host))
            return &s->disc[i];
    return NULL;
}

/* Takes out ranks [from_dp, dp) of a discovered endpoint (all of them: from_dp 0). */
static void remove_ranks(const struct disc *d, int from_dp)
{
    if (rt_config_ranks_by_header(&g_rt->cfg, d->role))
        rt_registry_remove(d->role, d->host, d->port, RT_SRC_ETCD, from_dp ? from_dp : -1, NULL);
    else
        for (int i = from_dp; i < d->dp; i++)
            rt_registry_remove(d->role, d->host, d->port + i, RT_SRC_ETCD, -1, NULL);
}

static void forget(struct esync *s, struct disc *d)
{
    remove_ranks(d, 0);
    *d = s->disc[--s->ndisc];
}

static void put_instance(struct esync *s, const char *key, const char *rest, const char *val)
{
    int role;
    long port;
    char host[256], err[300] = "";
    if (esync_instance_key(rest, &role, host, sizeof host, &port) != 0) {
        invalid(key, "the key is not instances/<prefill|decode>/<host>:<port>");
        return;
    }
    /* the admin API's fields, checked the same way */
    char *body = esync_instance_body(role, host, port, val, err, sizeof err);
    if (!body) {
        invalid(key, err);
        return;
    }
    struct rt_admin_defaults defs[2];
    for (int r = 0; r < 2; r++)
        defs[r] = (struct rt_admin_defaults){g_rt->cfg.pools[r].dp, g_rt->cfg.pools[r].tp, g_rt->cfg.pools[r].max_inflight};
    struct rt_admin_instance in;
    int bad = rt_admin_parse_instance(body, strlen(body), defs, g_rt->cfg.dp_internal, &in, err, sizeof err);
    free(body);
    if (bad) {
        invalid(key, err);
        return;
    }
    struct disc *d = find_disc(s, role, host, port);
    if (d && d->dp > in.dp) /* fewer DP ranks than before: the ones beyond go */
        remove_ranks(d, (int)in.dp);
    int changed = 0;
    err[0] = 0;
    int status = rt_registry_add(&in, RT_SRC_ETCD, NULL, &changed, err, sizeof err);
    if (status) { /* e.g. the pool is full: none of it, rather than the ranks that fitted, untracked */
        struct disc all = {role, (int)port, (int)in.dp, ""};
        snprintf(all.host, sizeof all.host, "%s", host);
        if (!d)
            remove_ranks(&all, 0);
        invalid(key, err);
        return;
    }
    if (err[0]) { /* configured statically: not ours */
        xpyd_log_event(XPYD_LOG_INFO, "event=discovery_ignored key=\"%.300s\" reason=\"%s\"", key, err);
        return;
    }
    if (!d) {
        if (s->ndisc == s->capdisc) {
            s->capdisc = s->capdisc ? 2 * s->capdisc : 16;
            s->disc = XPYD_XALLOC(realloc(s->disc, s->capdisc * sizeof *s->disc));
        }
        d = &s->disc[s->ndisc++];
        d->role = role;
        d->port = (int)port;
        snprintf(d->host, sizeof d->host, "%s", host);
    }
    d->dp = (int)in.dp;
    atomic_fetch_add(&g_rt->ctr.discovery_events, 1);
}

static void delete_instance(struct esync *s, const char *rest)
{
    int role;
    long port;
    char host[256];
    if (esync_instance_key(rest, &role, host, sizeof host, &port) != 0)
        return;
    struct disc *d = find_disc(s, role, host, port);
    if (d) {
        forget(s, d);
        atomic_fetch_add(&g_rt->ctr.discovery_events, 1);
    }
}

/* ---------- the other routers' load ---------- */

static struct peer *find_peer(struct esync *s, const char *id, int create)
{
    for (size_t i = 0; i < s->npeers; i++)
        if (!strcmp(s->peers[i].id, id))
            return &s->peers[i];
    if (!create)
        return NULL;
    if (s->npeers == s->cappeers) {
        s->cappeers = s->cappeers ? 2 * s->cappeers : 8;
        s->peers = XPYD_XALLOC(realloc(s->peers, s->cappeers * sizeof *s->peers));
    }
    struct peer *p = &s->peers[s->npeers++];
    snprintf(p->id, sizeof p->id, "%s", id);
    p->load = XPYD_XALLOC(calloc(2 * s->nslots * 2, sizeof *p->load));
    return p;
}

/* Sums the peers' loads per rank into the balancer. */
static void apply_remote(struct esync *s)
{
    for (int role = 0; role < 2; role++) {
        size_t n = __atomic_load_n(&g_rt->reg.n_ranks[role], __ATOMIC_ACQUIRE);
        for (size_t i = 0; i < n && i < s->nslots; i++) {
            int64_t tok = 0, req = 0;
            for (size_t k = 0; k < s->npeers; k++) {
                const int64_t *v = &s->peers[k].load[(role * s->nslots + i) * 2];
                tok += v[0];
                req += v[1];
            }
            xb_set_remote(g_rt->pools[role], (int)i, tok, req);
        }
    }
}

/* The rank index of "<host:port>/<dp rank>" in role, or -1. */
/* A rank's name in published loads: "<host:port>/<dp rank>". */
static void rank_name(int role, size_t i, char *buf, size_t cap)
{
    char hp[300];
    int dp = rt_rank_identity(role, (int)i, hp, sizeof hp);
    snprintf(buf, cap, "%s/%d", hp, dp);
}

/* The rank index of a published name, or -1: an open-addressing table of name hashes per role, extended as
 * ranks are appended and built again when a removed rank's slot was given to another engine (the registry's
 * generation), so a peer's update costs one hash per entry instead of a scan of every rank. */
static int rank_by_name(struct esync *s, int role, const char *name)
{
    struct name_map *m = &s->names[role];
    unsigned gen = __atomic_load_n(&g_rt->reg.generation, __ATOMIC_ACQUIRE);
    if (gen != m->gen) {
        memset(m->idx, 0xff, m->cap * sizeof *m->idx);
        m->indexed = 0;
        m->gen = gen;
    }
    size_t n = __atomic_load_n(&g_rt->reg.n_ranks[role], __ATOMIC_ACQUIRE), mask = m->cap - 1;
    char buf[320];
    for (; m->indexed < n; m->indexed++) {
        rank_name(role, m->indexed, buf, sizeof buf);
        size_t k = (size_t)XXH3_64bits(buf, strlen(buf)) & mask;
        while (m->idx[k] >= 0)
            k = (k + 1) & mask;
        m->idx[k] = (int)m->indexed;
    }
    for (size_t k = (size_t)XXH3_64bits(name, strlen(name)) & mask; m->idx[k] >= 0; k = (k + 1) & mask) {
        rank_name(role, (size_t)m->idx[k], buf, sizeof buf);
        if (!strcmp(buf, name))
            return m->idx[k];
    }
    return -1;
}

struct load_fill {
    struct esync *s;
    struct peer *p;
};

static void load_rank(int role, const char *name, int64_t tokens, int64_t requests, void *arg)
{
    struct load_fill *f = arg;
    int idx = rank_by_name(f->s, role, name);
    if (idx < 0 || (size_t)idx >= f->s->nslots)
        return; /* a rank this router does not have (yet) */
    int64_t *v = &f->p->load[(role * f->s->nslots + (size_t)idx) * 2];
    v[0] = tokens;
    v[1] = requests;
}

static void put_load(struct esync *s, const char *key, const char *id, const char *val)
{
    if (!strcmp(id, s->id) || !id[0] || strchr(id, '/'))
        return; /* our own (already counted), or not a router's */
    struct peer *p = find_peer(s, id, 1);
    memset(p->load, 0, 2 * s->nslots * 2 * sizeof *p->load);
    struct load_fill f = {s, p};
    char err[300];
    if (esync_parse_load(val, load_rank, &f, err, sizeof err))
        invalid(key, err);
    apply_remote(s);
    atomic_fetch_add(&g_rt->ctr.discovery_events, 1);
}

static void delete_peer(struct esync *s, const char *id)
{
    struct peer *p = find_peer(s, id, 0);
    if (!p)
        return;
    free(p->load);
    *p = s->peers[--s->npeers];
    apply_remote(s);
    atomic_fetch_add(&g_rt->ctr.discovery_events, 1);
}

/* This router's own charges, as published: only ranks with something on them. */
static void publish_load(evutil_socket_t fd, short ev, void *arg)
{
    struct esync *s = arg;
    cJSON *o = XPYD_XALLOC(cJSON_CreateObject());
    for (int role = 0; role < 2; role++) {
        cJSON *m = cJSON_AddObjectToObject(o, role ? "decode" : "prefill");
        size_t n = __atomic_load_n(&g_rt->reg.n_ranks[role], __ATOMIC_ACQUIRE);
        for (size_t i = 0; i < n; i++) {
            struct xb_instance_stats st;
            xb_stats(g_rt->pools[role], (int)i, &st);
            if (!st.inflight && !st.outstanding)
                continue;
            char name[320];
            rank_name(role, i, name, sizeof name);
            cJSON *pair = cJSON_AddArrayToObject(m, name);
            cJSON_AddItemToArray(pair, cJSON_CreateNumber((double)(st.outstanding > 0 ? st.outstanding : 0)));
            cJSON_AddItemToArray(pair, cJSON_CreateNumber((double)st.inflight));
        }
    }
    char *v = XPYD_XALLOC(cJSON_PrintUnformatted(o));
    cJSON_Delete(o);
    etcd_reg_set(s->reg, s->load_key, v); /* a put only when it changed */
    free(v);
    struct etcd_stats st;
    etcd_get_stats(s->e, &st);
    atomic_store(&g_rt->ctr.etcd_writes, (int64_t)st.writes);
}

/* ---------- one key changed (or was read) ---------- */

static void on_put(struct esync *s, const char *key, const char *val)
{
    const char *rest = key + strlen(s->pfx);
    if (!strncmp(rest, "instances/", 10))
        put_instance(s, key, rest + 10, val);
    else if (!strncmp(rest, "load/", 5) && g_rt->cfg.load_sync_ms > 0)
        put_load(s, key, rest + 5, val);
}

static void on_delete(struct esync *s, const char *key)
{
    const char *rest = key + strlen(s->pfx);
    if (!strncmp(rest, "instances/", 10))
        delete_instance(s, rest + 10);
    else if (!strncmp(rest, "load/", 5))
        delete_peer(s, rest + 5);
}

static void count_routers(struct esync *s, long delta)
{
    s->routers += delta;
    if (s->routers < 0)
        s->routers = 0;
    atomic_store(&g_rt->ctr.discovery_routers, s->routers);
}

/* ---------- range, watch, resync ---------- */

static void resync(struct esync *s);

static void schedule_resync(struct esync *s)
{
    set_up(s, 0);
    long max = g_rt->cfg.discovery_retry_max_ms;
    s->backoff_ms = s->backoff_ms ? s->backoff_ms * 2 : 100;
    if (s->backoff_ms > max)
        s->backoff_ms = max;
    s->rng ^= s->rng << 13, s->rng ^= s->rng >> 7, s->rng ^= s->rng << 17;
    long ms = s->backoff_ms / 2 + (long)(s->rng % (uint64_t)(s->backoff_ms / 2 + 1));
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    event_add(s->retry, &tv);
}

static void on_watch_result(struct etcd *e, const cJSON *res, void *arg)
{
    struct esync *s = arg;
    int canceled = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(res, "canceled")) ||
                   etcd_i64(res, "compact_revision") > 0;
    if (canceled) {
        xpyd_log_event(XPYD_LOG_WARN, "event=discovery_watch_canceled compact_revision=%" PRId64
                       " detail=\"reading everything again\"", etcd_i64(res, "compact_revision"));
        etcd_watch_cancel(s->watch);
        s->watch = NULL;
        schedule_resync(s);
        return;
    }
    const cJSON *evs = cJSON_GetObjectItemCaseSensitive(res, "events");
    static char key[1024], val[VAL_MAX];
    for (const cJSON *ev = cJSON_IsArray(evs) ? evs->child : NULL; ev; ev = ev->next) {
        const cJSON *kv = cJSON_GetObjectItemCaseSensitive(ev, "kv");
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(ev, "type");
        if (etcd_kv(kv, key, sizeof key, val, sizeof val) != 0 || strncmp(key, s->pfx, strlen(s->pfx)) != 0) {
            invalid("?", "a watch event without a readable key or value");
            continue;
        }
        int del = cJSON_IsString(type) && !strcmp(type->valuestring, "DELETE");
        int64_t rev = etcd_i64(kv, "mod_revision");
        if (rev > s->rev)
            s->rev = rev;
        if (!strncmp(key + strlen(s->pfx), "routers/", 8)) {
            if (del)
                count_routers(s, -1);
            else if (etcd_i64(kv, "version") == 1) /* created (later puts are updates) */
                count_routers(s, 1);
            continue;
        }
        if (del)
            on_delete(s, key);
        else
            on_put(s, key, val);
    }
}

static void on_watch_end(struct etcd *e, int err, void *arg)
{
    struct esync *s = arg;
    s->watch = NULL;
    xpyd_log_event(XPYD_LOG_WARN, "event=discovery_down reason=\"watch ended: %s\" detail=\"keeping the last membership\"",
                   etcd_strerror(err));
    schedule_resync(s);
}

static void range_done(struct etcd *e, int err, cJSON *answer, void *arg)
{
    struct esync *s = arg;
    s->range = NULL;
    if (err) {
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(answer, "error");
        xpyd_log_event(XPYD_LOG_WARN, "event=discovery_down reason=\"range: %s\" detail=\"keeping the last membership; "
                       "retrying\"", cJSON_IsString(msg) ? msg->valuestring : etcd_strerror(err));
        schedule_resync(s);
        return;
    }
    s->rev = etcd_i64(cJSON_GetObjectItemCaseSensitive(answer, "header"), "revision");
    /* The answer is the whole truth: discovered endpoints it lacks are gone, other routers' loads are these. */
    char *seen = XPYD_XALLOC(calloc(s->ndisc + 1, 1));
    size_t nold = s->ndisc;
    for (size_t i = 0; i < s->npeers; i++)
        free(s->peers[i].load);
    s->npeers = 0;
    s->routers = 0;
    const cJSON *kvs = cJSON_GetObjectItemCaseSensitive(answer, "kvs");
    static char key[1024], val[VAL_MAX];
    for (const cJSON *kv = cJSON_IsArray(kvs) ? kvs->child : NULL; kv; kv = kv->next) {
        if (etcd_kv(kv, key, sizeof key, val, sizeof val) != 0 || strncmp(key, s->pfx, strlen(s->pfx)) != 0) {
            invalid("?", "a key or value that is not base64");
            continue;
        }
        const char *rest = key + strlen(s->pfx);
        if (!strncmp(rest, "routers/", 8)) {
            s->routers++;
            continue;
        }
        if (!strncmp(rest, "instances/", 10)) {
            int role;
            long port;
            char host[256];
            if (esync_instance_key(rest + 10, &role, host, sizeof host, &port) == 0) {
                struct disc *d = find_disc(s, role, host, port);
                if (d && (size_t)(d - s->disc) < nold)
                    seen[d - s->disc] = 1;
            }
        }
        on_put(s, key, val);
    }
    for (size_t i = nold; i-- > 0;) /* backwards: forget() moves the last entry into i */
        if (!seen[i] && i < s->ndisc) {
            xpyd_log_event(XPYD_LOG_INFO, "event=discovery_gone role=%s instance=%s:%d",
                           s->disc[i].role ? "decode" : "prefill", s->disc[i].host, s->disc[i].port);
            forget(s, &s->disc[i]);
        }
    free(seen);
    apply_remote(s);
    count_routers(s, 0);
    static const struct etcd_watch_cbs cbs = {on_watch_result, on_watch_end};
    s->watch = etcd_watch_prefix(s->e, s->pfx, s->rev + 1, &cbs, s);
    if (!s->watch) {
        schedule_resync(s);
        return;
    }
    s->backoff_ms = 0;
    set_up(s, 1);
    xpyd_log_event(XPYD_LOG_INFO, "event=discovery_synced revision=%" PRId64 " endpoints=%zu routers=%ld etcd=%s", s->rev,
                   s->ndisc, s->routers, etcd_current(s->e));
}

static void resync(struct esync *s)
{
    etcd_watch_cancel(s->watch);
    s->watch = NULL;
    etcd_op_cancel(s->range);
    atomic_fetch_add(&g_rt->ctr.discovery_resyncs, 1);
    s->range = etcd_range_prefix(s->e, s->pfx, range_done, s);
    if (!s->range)
        schedule_resync(s);
}

static void on_retry(evutil_socket_t fd, short ev, void *arg)
{
    resync(arg);
}

/* ---------- start, drain, stop ---------- */

struct esync *esync_start(struct event_base *base, int port)
{
    if (!g_rt->cfg.discovery[0])
        return NULL;
    struct etcd_url u;
    char err[600];
    if (etcd_url_parse(g_rt->cfg.discovery, &u, err, sizeof err) != 0) { /* checked at load: resolution changed */
        xpyd_log_event(XPYD_LOG_ERROR, "event=discovery_failed reason=\"%s\"", err);
        return NULL;
    }
    struct esync *s = XPYD_XALLOC(calloc(1, sizeof *s));
    s->base = base;
    s->e = XPYD_XALLOC(etcd_new(base, &u, u.tls ? g_rt->tls_client : NULL, g_rt->cfg.discovery_timeout_ms));
    snprintf(s->pfx, sizeof s->pfx, "%s/", u.prefix);
    s->nslots = (size_t)g_rt->cfg.max_instances;
    for (int role = 0; role < 2; role++) {
        struct name_map *m = &s->names[role];
        for (m->cap = 16; m->cap < 2 * s->nslots; m->cap *= 2)
            ;
        m->idx = XPYD_XALLOC(malloc(m->cap * sizeof *m->idx));
        for (size_t k = 0; k < m->cap; k++)
            m->idx[k] = -1;
    }
    s->rng = xpyd_now_us() ^ ((uint64_t)getpid() << 32) ^ 0x9e3779b97f4a7c15ULL;
    char host[200] = "";
    if (g_rt->cfg.router_id[0])
        snprintf(s->id, sizeof s->id, "%s", g_rt->cfg.router_id);
    else {
        gethostname(host, sizeof host - 1);
        snprintf(s->id, sizeof s->id, "%s:%d", host[0] ? host : "router", port);
    }
    const char *lh = g_rt->cfg.listen_host;
    if (!lh[0] || !strcmp(lh, "0.0.0.0") || !strcmp(lh, "::")) {
        if (!host[0])
            gethostname(host, sizeof host - 1);
        lh = host;
    }
    char hp[300], me[600];
    xpyd_hostport(lh, port, hp, sizeof hp);
    snprintf(me, sizeof me, "{\"address\":\"%s://%s\",\"version\":\"%s\"}", g_rt->tls_server ? "https" : "http", hp,
             xpyd_version());
    snprintf(s->reg_key, sizeof s->reg_key, "%srouters/%s", s->pfx, s->id);
    snprintf(s->load_key, sizeof s->load_key, "%sload/%s", s->pfx, s->id);
    s->reg = XPYD_XALLOC(etcd_reg_new(s->e, g_rt->cfg.discovery_ttl_s, NULL, NULL));
    etcd_reg_set(s->reg, s->reg_key, me);
    if (g_rt->cfg.load_sync_ms > 0)
        etcd_reg_set(s->reg, s->load_key, "{}");
    etcd_reg_active(s->reg, 1);
    s->retry = XPYD_XALLOC(event_new(base, -1, 0, on_retry, s));
    if (g_rt->cfg.load_sync_ms > 0) {
        s->load_tick = XPYD_XALLOC(event_new(base, -1, EV_PERSIST, publish_load, s));
        struct timeval tv = {g_rt->cfg.load_sync_ms / 1000, (g_rt->cfg.load_sync_ms % 1000) * 1000};
        event_add(s->load_tick, &tv);
    }
    atomic_store(&g_es, s);
    xpyd_log_event(XPYD_LOG_INFO, "event=discovery_start etcd=%s prefix=%s router_id=%s", g_rt->cfg.discovery, u.prefix,
                   s->id);
    resync(s);
    return s;
}

static void drained(void *arg)
{
    ((struct esync *)arg)->left = 1;
    xpyd_log_event(XPYD_LOG_INFO, "event=discovery_left detail=\"this router's lease is revoked\"");
}

int esync_left(const struct esync *s)
{
    return !s || s->left;
}

void esync_drain(struct esync *s)
{
    if (!s)
        return;
    if (s->load_tick)
        event_del(s->load_tick);
    etcd_reg_stop(s->reg, g_rt->cfg.discovery_timeout_ms, drained, s);
}

void esync_stop(struct esync *s)
{
    if (!s)
        return;
    atomic_store(&g_es, NULL);
    if (s->load_tick)
        event_free(s->load_tick);
    event_free(s->retry);
    etcd_reg_free(s->reg);
    etcd_op_cancel(s->range);
    etcd_watch_cancel(s->watch);
    etcd_free(s->e);
    for (size_t i = 0; i < s->npeers; i++)
        free(s->peers[i].load);
    free(s->peers);
    free(s->disc);
    free(s->names[0].idx);
    free(s->names[1].idx);
    free(s);
}
