/* metadata.c - a Mooncake-compatible metadata store served by the router (PROTOCOLS.md §6):
 * GET|PUT|DELETE /metadata?key=<K>, the value as the body. Transfer engines register segment descriptors
 * with it (keys such as mooncake/ram/<segment>, mooncake/rpc_meta/<server>). In memory, bounded
 * (--metadata-max-keys, --metadata-max-value-bytes); reads guarded by --api-key like the client endpoints,
 * writes by --metadata-write-key or --admin-key. The store itself is metadata_store.c. */
#include "router.h"
#include "xpyd_reply.h"
#include "metadata_store.h"

#include "xpyd_oai.h"
#include "xpyd_util.h"

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

static void on_metadata(evhtp_request_t *req, void *arg)
{
    htp_method m = evhtp_request_get_method(req);
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
