/* SPDX-License-Identifier: Apache-2.0 */
/* discovery.c - `--handoff mooncake`: every prefill describes its own DP ranks. Each --query-interval-ms,
 * on the router's main event loop, GET /query on every active prefill's bootstrap server answers
 * {"<dp rank>": {"engine_id": "..."}, ...}; the registry turns the answer into ranks (added, given their
 * engine ids, made ready, or taken out) and a failed query into unready ranks (rt_registry_learned). So a
 * prefill is eligible only once it answered, one that went away stops being picked, and a restarted one
 * (new engine ids) is used with its new ids from its next answer. */
#include "discovery.h"

#include "handoff.h"
#include "router.h"
#include "xpyd_util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <stdlib.h>
#include <string.h>

#define QUERY_MAX_BODY (1u << 20) /* far above any real answer (a few hundred bytes per rank) */
#define QUERY_MAX_RANKS 1024      /* as --prefill-dp */

struct target {
    struct discovery *d;
    int endpoint;          /* the prefill's HTTP endpoint (the registry's key) */
    struct up_leg *leg;    /* the query in flight, or NULL */
    int status;
    struct evbuffer *body;
};

struct discovery {
    struct event_base *base;
    struct up_thread *up;
    struct target *t;      /* by HTTP endpoint index: one query at a time per prefill */
    size_t cap;
    struct event *tick;
};

/* The /query answer into ids by rank; returns the rank count (highest rank + 1), or -1 with why set. */
static int parse_answer(const char *data, size_t len, cJSON **root, const char **ids, char *why, size_t cap)
{
    *root = cJSON_ParseWithLength(data, len);
    if (!cJSON_IsObject(*root)) {
        snprintf(why, cap, "GET /query: the answer is not a JSON object");
        return -1;
    }
    int n = 0;
    for (const cJSON *e = (*root)->child; e; e = e->next) {
        long rank;
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "engine_id");
        if (!e->string || xpyd_parse_long(e->string, 0, QUERY_MAX_RANKS - 1, &rank) != 0 || !cJSON_IsString(id) ||
            !id->valuestring[0] || strlen(id->valuestring) >= sizeof(((struct rt_live_rank *)0)->engine_id)) {
            snprintf(why, cap, "GET /query: entry '%.40s' is not \"<dp rank>\": {\"engine_id\": \"<id>\"}",
                     e->string ? e->string : "?");
            return -1;
        }
        ids[rank] = id->valuestring;
        if ((int)rank + 1 > n)
            n = (int)rank + 1;
    }
    if (n == 0) {
        snprintf(why, cap, "GET /query: the answer lists no rank");
        return -1;
    }
    return n;
}

static void q_head(struct up_leg *leg, int status, void *arg)
{
    ((struct target *)arg)->status = status;
}

static void q_body(struct up_leg *leg, const char *data, size_t len, void *arg)
{
    struct target *t = arg;
    if (evbuffer_get_length(t->body) + len <= QUERY_MAX_BODY)
        evbuffer_add(t->body, data, len);
}

static void q_done(struct up_leg *leg, int err, void *arg)
{
    struct target *t = arg;
    t->leg = NULL;
    size_t len = evbuffer_get_length(t->body);
    const char *data = len ? (const char *)evbuffer_pullup(t->body, -1) : "";
    char why[200];
    static const char *ids[QUERY_MAX_RANKS];
    memset(ids, 0, sizeof ids);
    cJSON *root = NULL;
    int n = -1;
    if (err)
        snprintf(why, sizeof why, "GET /query: %s", err == -ETIME || err == -ETIMEDOUT ? "timed out" : strerror(-err));
    else if (t->status != 200)
        snprintf(why, sizeof why, "GET /query answered %d", t->status);
    else
        n = parse_answer(data, len, &root, ids, why, sizeof why);
    rt_registry_learned(t->endpoint, ids, n, why);
    cJSON_Delete(root);
    evbuffer_drain(t->body, len);
}

static const struct up_timeouts *query_timeouts(void)
{
    static struct up_timeouts to;
    to.connect_ms = to.first_byte_ms = to.idle_ms = g_rt->cfg.query_timeout_ms;
    return &to;
}

static void on_tick(evutil_socket_t fd, short ev, void *arg)
{
    struct discovery *d = arg;
    static const struct up_leg_cbs cbs = {q_head, q_body, q_done, NULL, NULL, NULL};
    struct rt_query_target *tg = XPYD_XALLOC(calloc(d->cap, sizeof *tg));
    size_t n = rt_registry_query_targets(tg, d->cap);
    for (size_t i = 0; i < n; i++) {
        struct target *t = &d->t[tg[i].endpoint];
        if (t->leg)
            continue; /* the previous query is still running */
        if (!t->body) {
            t->d = d;
            t->endpoint = tg[i].endpoint;
            t->body = XPYD_XALLOC(evbuffer_new());
        }
        t->status = 0;
        struct evbuffer *req = XPYD_XALLOC(evbuffer_new());
        up_request_line(req, &g_rt->endpoints[tg[i].query_endpoint], "GET", "/query");
        evbuffer_add(req, "\r\n", 2);
        t->leg = up_leg_start(d->up, tg[i].query_endpoint, req, query_timeouts(), &cbs, t);
        evbuffer_free(req);
    }
    free(tg);
}

struct discovery *discovery_start(struct event_base *base)
{
    if (!g_rt->ho->t->query_prefill)
        return NULL;
    struct discovery *d = XPYD_XALLOC(calloc(1, sizeof *d));
    d->base = base;
    d->cap = g_rt->ep_cap;
    d->up = XPYD_XALLOC(up_thread_new_shared(base, g_rt->endpoints, d->cap, 1));
    if (g_rt->tls_client)
        up_thread_set_tls(d->up, g_rt->tls_client);
    d->t = XPYD_XALLOC(calloc(d->cap, sizeof *d->t));
    d->tick = XPYD_XALLOC(event_new(base, -1, EV_PERSIST, on_tick, d));
    struct timeval tv = {g_rt->cfg.query_interval_ms / 1000, (g_rt->cfg.query_interval_ms % 1000) * 1000};
    event_add(d->tick, &tv);
    event_active(d->tick, EV_TIMEOUT, 0); /* the first round right away */
    return d;
}

void discovery_stop(struct discovery *d)
{
    if (!d)
        return;
    event_free(d->tick);
    for (size_t i = 0; i < d->cap; i++) {
        up_leg_cancel(d->t[i].leg);
        if (d->t[i].body)
            evbuffer_free(d->t[i].body);
    }
    up_thread_free(d->up);
    free(d->t);
    free(d);
}
