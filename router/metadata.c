/* metadata.c - a Mooncake-compatible metadata store served by the router (PROTOCOLS.md §6):
 * GET|PUT|DELETE /metadata?key=<K>, the value as the body. Transfer engines register segment descriptors
 * with it (keys such as mooncake/ram/<segment>, mooncake/rpc_meta/<server>). In memory, bounded
 * (--metadata-max-keys, --metadata-max-value-bytes), guarded by --api-key like the client endpoints. */
#include "router.h"

#include "xpyd_oai.h"
#include "xpyd_util.h"

#include <event2/buffer.h>
#include <evhtp/evhtp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define MD_BUCKETS 4096
#define MD_KEY_MAX 1024

struct md_entry {
    struct md_entry *next;
    char *key;
    char *val;
    size_t len;
};

static struct {
    pthread_mutex_t mu;
    struct md_entry *b[MD_BUCKETS];
    size_t n;
} M = {.mu = PTHREAD_MUTEX_INITIALIZER};

static struct md_entry **slot(const char *key)
{
    struct md_entry **pp = &M.b[xpyd_fnv64(XPYD_FNV_INIT, key, strlen(key)) % MD_BUCKETS];
    while (*pp && strcmp((*pp)->key, key) != 0)
        pp = &(*pp)->next;
    return pp;
}

size_t rt_metadata_count(void)
{
    pthread_mutex_lock(&M.mu);
    size_t n = M.n;
    pthread_mutex_unlock(&M.mu);
    return n;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Writes hold transfer-engine segment descriptors: only the --metadata-write-key or the --admin-key may. */
static int write_allowed(evhtp_request_t *req)
{
    const struct rt_config *c = &g_rt->cfg;
    if (!c->metadata_write_key[0] && !c->admin_key[0]) {
        rt_reply_error(req, 403, "metadata writes are off: start the router with --metadata-write-key or --admin-key");
        return 0;
    }
    if ((c->metadata_write_key[0] && rt_bearer_ok(req, c->metadata_write_key)) ||
        (c->admin_key[0] && rt_bearer_ok(req, c->admin_key)))
        return 1;
    evhtp_headers_add_header(req->headers_out, evhtp_header_new("WWW-Authenticate", "Bearer", 0, 0));
    rt_reply_error(req, 401, "invalid or missing key: metadata writes need Authorization: Bearer <metadata write key>");
    return 0;
}

static void on_metadata(evhtp_request_t *req, void *arg)
{
    htp_method m = evhtp_request_get_method(req);
    if (!rt_method_allowed(req, "GET, HEAD, PUT, POST, DELETE"))
        return;
    if (m == htp_method_GET || m == htp_method_HEAD ? !rt_authorized(req) : !write_allowed(req))
        return;
    const char *raw = req->uri && req->uri->query ? evhtp_kv_find(req->uri->query, "key") : NULL;
    if (!raw || !raw[0] || strlen(raw) > MD_KEY_MAX) {
        rt_reply_error(req, 400, "use /metadata?key=<key> (1-1024 bytes)");
        return;
    }
    char key[MD_KEY_MAX + 1];
    size_t kl = 0;
    for (const char *c = raw; *c && kl < MD_KEY_MAX; c++) { /* %xx and + decoded */
        int hi, lo;
        if (*c == '%' && (hi = hexval(c[1])) >= 0 && (lo = hexval(c[2])) >= 0) {
            key[kl++] = (char)(hi * 16 + lo);
            c += 2;
        } else {
            key[kl++] = *c == '+' ? ' ' : *c;
        }
    }
    key[kl] = 0;
    if (strlen(key) != kl) {
        rt_reply_error(req, 400, "a metadata key cannot contain NUL");
        return;
    }
    pthread_mutex_lock(&M.mu);
    struct md_entry **pp = slot(key);
    if (m == htp_method_GET || m == htp_method_HEAD) {
        if (!*pp) {
            pthread_mutex_unlock(&M.mu);
            rt_reply_error(req, 404, "no such metadata key");
            return;
        }
        struct evbuffer *b = XPYD_XALLOC(evbuffer_new());
        evbuffer_add(b, (*pp)->val, (*pp)->len);
        pthread_mutex_unlock(&M.mu);
        rt_reply_buffer(req, 200, "application/json", b);
        evbuffer_free(b);
        return;
    }
    if (m == htp_method_DELETE) {
        struct md_entry *e = *pp;
        if (e) {
            *pp = e->next;
            M.n--;
        }
        pthread_mutex_unlock(&M.mu);
        if (!e) {
            rt_reply_error(req, 404, "no such metadata key");
            return;
        }
        free(e->key);
        free(e->val);
        free(e);
        rt_reply(req, 200, "application/json", "{\"deleted\":true}", 16);
        return;
    }
    if (m == htp_method_PUT || m == htp_method_POST) {
        size_t len = evbuffer_get_length(req->buffer_in);
        if ((long)len > g_rt->cfg.metadata_max_value_bytes) {
            pthread_mutex_unlock(&M.mu);
            rt_reply_error(req, 413, "metadata value larger than --metadata-max-value-bytes");
            return;
        }
        if (!*pp && (long)M.n >= g_rt->cfg.metadata_max_keys) {
            pthread_mutex_unlock(&M.mu);
            rt_reply_error(req, 507, "metadata store full (--metadata-max-keys)");
            return;
        }
        char *val = XPYD_XALLOC(malloc(len ? len : 1));
        evbuffer_copyout(req->buffer_in, val, len);
        if (*pp) {
            free((*pp)->val);
        } else {
            struct md_entry *e = XPYD_XALLOC(calloc(1, sizeof *e));
            e->key = XPYD_XALLOC(strdup(key));
            *pp = e;
            M.n++;
        }
        (*pp)->val = val;
        (*pp)->len = len;
        pthread_mutex_unlock(&M.mu);
        rt_reply(req, 200, "application/json", "{\"stored\":true}", 15);
        return;
    }
    pthread_mutex_unlock(&M.mu);
}

void rt_metadata_handlers(evhtp_t *htp)
{
    evhtp_set_cb(htp, "/metadata", on_metadata, NULL);
}
