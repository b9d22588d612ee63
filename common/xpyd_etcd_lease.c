/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_etcd_lease.c - registrations on etcd: a lease granted, kept alive and granted again, its keys put and put
 * again, revoked on the way out (see xpyd_etcd_lease.h). */
#include "xpyd_etcd_lease.h"

#include "xpyd_util.h"

#include <cjson/cJSON.h>
#include <event2/event.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct reg_key {
    struct etcd_reg *r;
    struct reg_key *next;
    char *key, *val;
    int dirty;
    struct etcd_op *op;
};

struct etcd_reg {
    struct etcd *e;
    long ttl_s;
    int on, held;
    int64_t lease;
    struct etcd_op *grant, *ka, *revoke;
    struct reg_key *keys;
    struct event *tick;
    long backoff_ms;
    uint64_t rng;
    int failing;     /* a failure was logged; the next success logs the recovery */
    void (*on_state)(int held, void *arg);
    void *arg;
    void (*stop_done)(void *arg);
    void *stop_arg;
    struct event *stop_timer;
};

static void reg_arm(struct etcd_reg *r, long ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    event_add(r->tick, &tv);
}

/* A retry delay: doubling from 100 ms up to a third of the TTL, each drawn at random in [d/2, d]. */
static long reg_backoff(struct etcd_reg *r)
{
    long max = r->ttl_s * 1000 / 3;
    r->backoff_ms = r->backoff_ms ? r->backoff_ms * 2 : 100;
    if (r->backoff_ms > max)
        r->backoff_ms = max;
    r->rng ^= r->rng << 13, r->rng ^= r->rng >> 7, r->rng ^= r->rng << 17;
    return r->backoff_ms / 2 + (long)(r->rng % (uint64_t)(r->backoff_ms / 2 + 1));
}

static void reg_set_held(struct etcd_reg *r, int held)
{
    if (r->held == held)
        return;
    r->held = held;
    if (r->on_state)
        r->on_state(held, r->arg);
}

static void reg_put_all(struct etcd_reg *r);

static void reg_check_held(struct etcd_reg *r)
{
    if (!r->lease)
        return;
    for (struct reg_key *k = r->keys; k; k = k->next)
        if (k->dirty || k->op)
            return;
    reg_set_held(r, 1);
}

static void reg_lost(struct etcd_reg *r);

/* etcd's answer says our lease is gone (expired while we could not reach it, or revoked). */
static int lease_gone(const cJSON *answer)
{
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(answer, "error");
    return cJSON_IsString(msg) && strstr(msg->valuestring, "lease not found") != NULL;
}

static void put_done(struct etcd *e, int err, cJSON *answer, void *arg)
{
    struct reg_key *k = arg;
    struct etcd_reg *r = k->r;
    k->op = NULL;
    if (err) {
        k->dirty = 1;
        if (lease_gone(answer))
            reg_lost(r);
        return; /* otherwise the next tick puts it again */
    }
    if (k->dirty && r->lease)
        reg_put_all(r);
    reg_check_held(r);
}

static void reg_put_all(struct etcd_reg *r)
{
    for (struct reg_key *k = r->keys; k && r->lease; k = k->next)
        if (k->dirty && !k->op) {
            k->dirty = 0;
            k->op = etcd_put(r->e, k->key, k->val, strlen(k->val), r->lease, put_done, k);
            if (!k->op)
                k->dirty = 1;
        }
}

/* One line per streak of failures (a registrar retrying every few hundred ms is one line), one on recovery. */
static void reg_failed(struct etcd_reg *r, const char *what, int err, const cJSON *answer)
{
    if (r->failing++)
        return;
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(answer, "error");
    xpyd_log_event(XPYD_LOG_WARN, "event=etcd_unreachable op=%s etcd=%s reason=\"%s\" detail=\"retrying\"", what,
                   etcd_current(r->e), cJSON_IsString(msg) ? msg->valuestring : etcd_strerror(err));
}

static void reg_ok(struct etcd_reg *r)
{
    if (!r->failing)
        return;
    r->failing = 0;
    xpyd_log_event(XPYD_LOG_INFO, "event=etcd_reachable etcd=%s", etcd_current(r->e));
}

static void grant_done(struct etcd *e, int err, cJSON *answer, void *arg)
{
    struct etcd_reg *r = arg;
    r->grant = NULL;
    int64_t id = err ? 0 : etcd_i64(answer, "ID");
    if (!id) {
        reg_failed(r, "lease_grant", err ? err : -EPROTO, answer);
        reg_arm(r, reg_backoff(r));
        return;
    }
    reg_ok(r);
    r->lease = id;
    r->backoff_ms = 0;
    for (struct reg_key *k = r->keys; k; k = k->next)
        k->dirty = 1;
    reg_put_all(r);
    reg_check_held(r); /* no keys: held at once */
    reg_arm(r, r->ttl_s * 1000 / 3);
}

static void reg_grant(struct etcd_reg *r)
{
    if (r->grant || !r->on)
        return;
    char body[64];
    snprintf(body, sizeof body, "{\"TTL\":\"%ld\"}", r->ttl_s);
    r->grant = etcd_call(r->e, "/v3/lease/grant", body, grant_done, r);
    if (!r->grant)
        reg_arm(r, reg_backoff(r));
}

/* etcd no longer has our lease (expired while we could not reach it): the keys are gone; start again. */
static void reg_lost(struct etcd_reg *r)
{
    xpyd_log_event(XPYD_LOG_WARN, "event=etcd_lease_lost lease=%" PRIx64 " detail=\"granting a new one\"", (uint64_t)r->lease);
    r->lease = 0;
    for (struct reg_key *k = r->keys; k; k = k->next) {
        etcd_op_cancel(k->op);
        k->op = NULL;
        k->dirty = 1;
    }
    etcd_op_cancel(r->ka);
    r->ka = NULL;
    reg_set_held(r, 0);
    reg_grant(r);
}

static void ka_done(struct etcd *e, int err, cJSON *answer, void *arg)
{
    struct etcd_reg *r = arg;
    r->ka = NULL;
    if (err) {
        if (lease_gone(answer))
            reg_lost(r);
        else
            reg_failed(r, "lease_keepalive", err, answer);
        return; /* unreachable: the next tick tries again */
    }
    reg_ok(r);
    const cJSON *res = cJSON_GetObjectItemCaseSensitive(answer, "result");
    if (etcd_i64(res ? res : answer, "TTL") <= 0)
        reg_lost(r);
}

static void reg_tick(evutil_socket_t fd, short ev, void *arg)
{
    struct etcd_reg *r = arg;
    if (!r->on)
        return;
    if (!r->lease) {
        reg_grant(r);
        return;
    }
    if (!r->ka) {
        char body[64];
        snprintf(body, sizeof body, "{\"ID\":\"%" PRId64 "\"}", r->lease);
        r->ka = etcd_call(r->e, "/v3/lease/keepalive", body, ka_done, r);
        etcd_count_keepalive(r->e);
    }
    reg_put_all(r); /* puts that failed */
    reg_arm(r, r->ttl_s * 1000 / 3);
}

struct etcd_reg *etcd_reg_new(struct etcd *e, long ttl_s, void (*on_state)(int held, void *arg), void *arg)
{
    struct etcd_reg *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->e = e;
    r->ttl_s = ttl_s < 2 ? 2 : ttl_s;
    r->on_state = on_state;
    r->arg = arg;
    r->rng = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ULL ^ (uint64_t)getpid() ^ (uint64_t)(uintptr_t)r;
    if (!r->rng)
        r->rng = 1;
    r->tick = event_new(etcd_base(e), -1, 0, reg_tick, r);
    if (!r->tick) {
        free(r);
        return NULL;
    }
    return r;
}

void etcd_reg_set(struct etcd_reg *r, const char *key, const char *value)
{
    struct reg_key *k = r->keys;
    while (k && strcmp(k->key, key) != 0)
        k = k->next;
    if (!k) {
        k = XPYD_XALLOC(calloc(1, sizeof *k));
        k->r = r;
        k->key = XPYD_XALLOC(strdup(key));
        k->next = r->keys;
        r->keys = k;
    } else if (strcmp(k->val, value) == 0) {
        return;
    }
    free(k->val);
    k->val = XPYD_XALLOC(strdup(value));
    k->dirty = 1;
    if (r->lease)
        reg_put_all(r);
}

int etcd_reg_held(const struct etcd_reg *r)
{
    return r->held;
}

static void revoke_done(struct etcd *e, int err, cJSON *answer, void *arg)
{
    struct etcd_reg *r = arg;
    r->revoke = NULL;
    if (r->stop_done) {
        void (*done)(void *) = r->stop_done;
        r->stop_done = NULL;
        if (r->stop_timer)
            event_del(r->stop_timer);
        done(r->stop_arg);
    }
}

void etcd_reg_active(struct etcd_reg *r, int on)
{
    if (on) {
        if (!r->on) {
            r->on = 1;
            r->backoff_ms = 0;
            reg_grant(r);
        }
        return;
    }
    if (!r->on)
        return;
    r->on = 0;
    event_del(r->tick);
    etcd_op_cancel(r->grant);
    etcd_op_cancel(r->ka);
    r->grant = r->ka = NULL;
    for (struct reg_key *k = r->keys; k; k = k->next) {
        etcd_op_cancel(k->op);
        k->op = NULL;
        k->dirty = 1;
    }
    if (r->lease) {
        char body[64];
        snprintf(body, sizeof body, "{\"ID\":\"%" PRId64 "\"}", r->lease);
        etcd_op_cancel(r->revoke);
        r->revoke = etcd_call(r->e, "/v3/lease/revoke", body, revoke_done, r);
        r->lease = 0;
    }
    reg_set_held(r, 0);
}

static void stop_timeout(evutil_socket_t fd, short ev, void *arg)
{
    struct etcd_reg *r = arg;
    etcd_op_cancel(r->revoke);
    r->revoke = NULL;
    revoke_done(r->e, -ETIMEDOUT, NULL, r);
}

void etcd_reg_stop(struct etcd_reg *r, long timeout_ms, void (*done)(void *arg), void *arg)
{
    etcd_reg_active(r, 0);
    r->stop_done = done;
    r->stop_arg = arg;
    if (!r->revoke) {
        revoke_done(r->e, 0, NULL, r);
        return;
    }
    if (!r->stop_timer)
        r->stop_timer = XPYD_XALLOC(event_new(etcd_base(r->e), -1, 0, stop_timeout, r));
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    event_add(r->stop_timer, &tv);
}

void etcd_reg_free(struct etcd_reg *r)
{
    if (!r)
        return;
    event_free(r->tick);
    if (r->stop_timer)
        event_free(r->stop_timer);
    etcd_op_cancel(r->grant);
    etcd_op_cancel(r->ka);
    etcd_op_cancel(r->revoke);
    while (r->keys) {
        struct reg_key *k = r->keys;
        r->keys = k->next;
        etcd_op_cancel(k->op);
        free(k->key);
        free(k->val);
        free(k);
    }
    free(r);
}
