/* SPDX-License-Identifier: Apache-2.0 */
/* metadata.c - a Mooncake-compatible metadata store served by the router (PROTOCOLS.md §6):
 * GET|PUT|DELETE /metadata?key=<K>, the value as the body. Transfer engines register segment descriptors
 * with it (keys such as mooncake/ram/<segment>, mooncake/rpc_meta/<server>). In memory, bounded
 * (--metadata-max-keys, --metadata-max-value-bytes; the store itself is metadata_store.c), or with
 * --metadata-backend etcd in the --discovery cluster under the same keys (one etcd client per worker thread,
 * the request paused until etcd answers). Reads guarded by --api-key like the client endpoints, writes by
 * --metadata-write-key or --admin-key. */
#include "router.h"
#include "xpyd_reply.h"
#include "metadata_store.h"

#include "xpyd_oai.h"
#include "xpyd_etcd.h"
#include "xpyd_util.h"

#include <cjson/cJSON.h>

#include <event2/buffer.h>
#include <evhtp/evhtp.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct md_store *store;

static void store_init(void)
{
    store = md_store_new();
}

static struct md_store *the_store(void)
{
    pthread_once(&once, store_init);
    return store;
}

size_t rt_metadata_count(void)
{
    return md_count(the_store());
}

/* Writes hold transfer-engine segment descriptors: only the --metadata-write-key or the --admin-key may. */
static int write_allowed(evhtp_request_t *req)
{
    const struct rt_config *c = &g_rt->cfg;
    if (!c->metadata_write_key[0] && !c->admin_key[0]) {
        xpyd_reply_error(req, 403, "metadata writes are off: start the router with --metadata-write-key or --admin-key");
        return 0;
    }
    if ((c->metadata_write_key[0] && rt_bearer_ok(req, c->metadata_write_key)) ||
        (c->admin_key[0] && rt_bearer_ok(req, c->admin_key)))
        return 1;
    evhtp_headers_add_header(req->headers_out, evhtp_header_new("WWW-Authenticate", "Bearer", 0, 0));
    xpyd_reply_error(req, 401, "invalid or missing key: metadata writes need Authorization: Bearer <metadata write key>");
    return 0;
}

static void copy_value(void *arg, const void *val, size_t len)
{
    evbuffer_add(arg, val, len);
}

/* ---------- --metadata-backend etcd ---------- */

struct md_call {
    evhtp_request_t *req; /* NULL once the client went away */
    int method;           /* htp_method_GET, _DELETE, _PUT */
};

static void md_fini(void *arg)
{
    ((struct md_call *)arg)->req = NULL;
}

static struct etcd *thread_etcd(void)
{
    struct rthread *t = rt_thread_self();
    if (!t->etcd) {
        struct etcd_url u;
        char err[600];
        if (etcd_url_parse(g_rt->cfg.discovery, &u, err, sizeof err) != 0)
            return NULL;
        t->etcd = etcd_new(t->base, &u, u.tls ? g_rt->tls_client : NULL, g_rt->cfg.discovery_timeout_ms);
    }
    return t->etcd;
}

static void md_etcd_done(struct etcd *e, int err, cJSON *answer, void *arg)
{
    struct md_call *c = arg;
    evhtp_request_t *req = c->req;
    int method = c->method;
    free(c);
    if (!req)
        return;
    rt_client_set_owner(req, NULL, NULL);
    if (err == -EPROTO || (err == 0 && !answer)) {
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(answer, "error");
        char why[300];
        snprintf(why, sizeof why, "the etcd metadata backend refused the request: %.200s",
                 cJSON_IsString(msg) ? msg->valuestring : "unreadable answer");
        xpyd_reply_error(req, 502, why);
    } else if (err) {
        xpyd_reply_error(req, 503, "the etcd metadata backend is unreachable");
    } else if (method == htp_method_GET) {
        const cJSON *kv = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(answer, "kvs"), 0);
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(kv, "value"); /* absent: an empty value */
        size_t cap = cJSON_IsString(v) ? strlen(v->valuestring) / 4 * 3 + 1 : 1;
        char *val = XPYD_XALLOC(malloc(cap));
        int n = cJSON_IsString(v) ? etcd_unb64(v->valuestring, val, cap) : 0;
        if (!kv)
            xpyd_reply_error(req, 404, "no such metadata key");
        else if (n < 0)
            xpyd_reply_error(req, 502, "the etcd metadata backend answered a value that is not base64");
        else
            xpyd_reply(req, 200, "application/json", val, (size_t)n);
        free(val);
    } else if (method == htp_method_DELETE) {
        if (etcd_i64(answer, "deleted") > 0)
            xpyd_reply(req, 200, "application/json", "{\"deleted\":true}", 16);
        else
            xpyd_reply_error(req, 404, "no such metadata key");
    } else {
        xpyd_reply(req, 200, "application/json", "{\"stored\":true}", 15);
    }
    evhtp_request_resume(req);
}

static void md_etcd(evhtp_request_t *req, int method, const char *key)
{
    struct etcd *e = thread_etcd();
    struct md_call *c = e ? calloc(1, sizeof *c) : NULL;
    if (!c) {
        xpyd_reply_error(req, 503, "the etcd metadata backend is unavailable");
        return;
    }
    c->req = req;
    c->method = method;
    struct etcd_op *op;
    if (method == htp_method_GET) {
        char k[4 * MD_KEY_MAX / 3 + 8], body[4 * MD_KEY_MAX / 3 + 32];
        etcd_b64(key, strlen(key), k, sizeof k);
        snprintf(body, sizeof body, "{\"key\":\"%s\"}", k);
        op = etcd_call(e, "/v3/kv/range", body, md_etcd_done, c);
    } else if (method == htp_method_DELETE) {
        op = etcd_delete(e, key, md_etcd_done, c);
    } else {
        size_t len = evbuffer_get_length(req->buffer_in);
        op = etcd_put(e, key, len ? (const char *)evbuffer_pullup(req->buffer_in, -1) : "", len, 0, md_etcd_done, c);
    }
    if (!op) {
        free(c);
        xpyd_reply_error(req, 503, "the etcd metadata backend is unavailable");
        return;
    }
    rt_client_set_owner(req, md_fini, c);
    evhtp_request_pause(req);
}

static void on_metadata(evhtp_request_t *req, void *arg)
{
    htp_method m = req->method;
    if (!xpyd_method_allowed(req, "GET, HEAD, PUT, POST, DELETE"))
        return;
    if (m == htp_method_GET || m == htp_method_HEAD ? !rt_authorized(req) : !write_allowed(req))
        return;
    const char *raw = req->uri && req->uri->query ? evhtp_kv_find(req->uri->query, "key") : NULL;
    char key[MD_KEY_MAX + 1];
    if (md_key_decode(raw, key) != 0) {
        xpyd_reply_error(req, 400, "use /metadata?key=<key> (1-1024 bytes once decoded, no NUL)");
        return;
    }
    if (g_rt->cfg.metadata_backend == 1) {
        size_t len = evbuffer_get_length(req->buffer_in);
        if (m != htp_method_GET && m != htp_method_HEAD && m != htp_method_DELETE &&
            len > (size_t)g_rt->cfg.metadata_max_value_bytes) {
            xpyd_reply_error(req, 413, "metadata value larger than --metadata-max-value-bytes");
            return;
        }
        md_etcd(req, m == htp_method_HEAD ? htp_method_GET : m == htp_method_POST ? htp_method_PUT : m, key);
        return;
    }
    struct md_store *st = the_store();
    if (m == htp_method_GET || m == htp_method_HEAD) {
        struct evbuffer *b = XPYD_XALLOC(evbuffer_new());
        if (md_get(st, key, copy_value, b) != 0)
            xpyd_reply_error(req, 404, "no such metadata key");
        else
            xpyd_reply_buffer(req, 200, "application/json", b);
        evbuffer_free(b);
        return;
    }
    if (m == htp_method_DELETE) {
        if (md_del(st, key) != 0)
            xpyd_reply_error(req, 404, "no such metadata key");
        else
            xpyd_reply(req, 200, "application/json", "{\"deleted\":true}", 16);
        return;
    }
    size_t len = evbuffer_get_length(req->buffer_in); /* PUT or POST */
    int rc = md_put(st, key, len ? evbuffer_pullup(req->buffer_in, -1) : (const unsigned char *)"", len,
                    (size_t)g_rt->cfg.metadata_max_keys, (size_t)g_rt->cfg.metadata_max_value_bytes);
    if (rc == -E2BIG)
        xpyd_reply_error(req, 413, "metadata value larger than --metadata-max-value-bytes");
    else if (rc == -ENOSPC)
        xpyd_reply_error(req, 507, "metadata store full (--metadata-max-keys)");
    else
        xpyd_reply(req, 200, "application/json", "{\"stored\":true}", 15);
}

void rt_metadata_handlers(evhtp_t *htp)
{
    evhtp_set_cb(htp, "/metadata", on_metadata, NULL);
}
