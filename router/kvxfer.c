/* SPDX-License-Identifier: Apache-2.0 */
/* kvxfer.c - the router's side of `--handoff xpyd`: it owns a libxpyd_transfer engine and, when a request
 * dies between prefill and decode (no decode took the KV), tells the prefill's engine to release the blocks
 * by a notification "release <key>" on the prefill's segment (named in the kv_transfer_params the prefill
 * returned: xpyd_segment, xpyd_key). The notifications go out from one helper thread with its own queue, so
 * a slow or dead prefill never blocks an event loop; the engine keeps each prefill's segment open. */
#include "handoff.h"
#include "router.h"

#include "xpyd_transfer.h"
#include "xpyd_util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVX_QUEUE_MAX 65536 /* releases waiting to be sent; beyond, dropped (the engine's lease expiry frees) */

struct kvx_item {
    struct kvx_item *next;
    char segment[300];
    char key[256];
};

static struct {
    xt_engine *engine;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    struct kvx_item *head, *tail;
    size_t queued;
    int stopping, started;
} K = {.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static void *release_loop(void *arg)
{
    pthread_mutex_lock(&K.mu);
    for (;;) {
        while (!K.head && !K.stopping)
            pthread_cond_wait(&K.cond, &K.mu);
        if (!K.head)
            break;
        struct kvx_item *it = K.head;
        K.head = it->next;
        if (!K.head)
            K.tail = NULL;
        K.queued--;
        pthread_mutex_unlock(&K.mu);
        char msg[300];
        snprintf(msg, sizeof msg, "release %s", it->key);
        xt_segment s;
        int rc = xt_open_segment(K.engine, it->segment, &s); /* the engine keeps peers open */
        if (!rc && (rc = xt_send_notify(K.engine, s, msg)) != 0)
            xt_close_segment(K.engine, s); /* reconnect next time */
        atomic_fetch_add(rc ? &g_rt->ctr.kv_release_failures : &g_rt->ctr.kv_releases, 1);
        if (rc)
            xpyd_log_event(XPYD_LOG_WARN, "event=kv_release_failed segment=%s key=%s error=\"%s\"", it->segment, it->key,
                           strerror(-rc));
        free(it);
        pthread_mutex_lock(&K.mu);
    }
    pthread_mutex_unlock(&K.mu);
    return NULL;
}

int rt_kvxfer_start(void)
{
    if (!g_rt->ho->t->kvxfer)
        return 0;
    struct xt_config c = {.name = "xpyd-router", .transport = "tcp", .threads = 1,
                          .io_timeout_ms = (int)g_rt->cfg.connect_timeout_ms};
    int rc = xt_engine_create(&c, &K.engine);
    if (rc) {
        fprintf(stderr, "xpyd_router: cannot start the transfer engine: %s\n", strerror(-rc));
        return -1;
    }
    if (pthread_create(&K.th, NULL, release_loop, NULL) != 0) {
        xt_engine_destroy(K.engine);
        K.engine = NULL;
        return -1;
    }
    K.started = 1;
    return 0;
}

void rt_kvxfer_stop(void)
{
    if (!K.started)
        return;
    pthread_mutex_lock(&K.mu);
    K.stopping = 1;
    pthread_cond_broadcast(&K.cond);
    pthread_mutex_unlock(&K.mu);
    pthread_join(K.th, NULL);
    for (struct kvx_item *it = K.head, *n; it; it = n) {
        n = it->next;
        free(it);
    }
    xt_engine_destroy(K.engine);
    K.started = 0;
}

int rt_kvxfer_release(const char *kv_params)
{
    if (!K.started || !kv_params)
        return -EINVAL;
    cJSON *kv = cJSON_Parse(kv_params); /* the text kept since the prefill answered (rewrite.h) */
    const cJSON *seg = cJSON_GetObjectItemCaseSensitive(kv, "xpyd_segment");
    const cJSON *key = cJSON_GetObjectItemCaseSensitive(kv, "xpyd_key");
    struct kvx_item *it = NULL;
    if (!cJSON_IsString(seg) || !cJSON_IsString(key) || strlen(seg->valuestring) >= 300 ||
        strlen(key->valuestring) >= 256 || !(it = calloc(1, sizeof *it))) {
        cJSON_Delete(kv);
        return it ? -ENOMEM : -EINVAL;
    }
    snprintf(it->segment, sizeof it->segment, "%s", seg->valuestring);
    snprintf(it->key, sizeof it->key, "%s", key->valuestring);
    cJSON_Delete(kv);
    pthread_mutex_lock(&K.mu);
    if (K.queued >= KVX_QUEUE_MAX) {
        pthread_mutex_unlock(&K.mu);
        free(it);
        atomic_fetch_add(&g_rt->ctr.kv_release_failures, 1);
        return -ENOBUFS;
    }
    if (K.tail)
        K.tail->next = it;
    else
        K.head = it;
    K.tail = it;
    K.queued++;
    pthread_cond_signal(&K.cond);
    pthread_mutex_unlock(&K.mu);
    return 0;
}
