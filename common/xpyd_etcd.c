/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_etcd.c - etcd v3 over its JSON gateway: calls with failover, watch streams, lease-held registrations.
 * See xpyd_etcd.h for the contract. Wire facts (etcd 3.4, checked against a running etcd-server):
 *   - every RPC is POST /v3/<service>/<method> with the request message as JSON; keys and values are base64,
 *     int64 fields are JSON strings ("revision":"5"); absent fields are zero;
 *   - a unary answer is the response message; an error is a non-200 status with {"error","code","message"};
 *   - streaming RPCs (watch, lease keep-alive) answer chunked, one {"result": <message>} per line; the request
 *     body is the first (and here only) request message: a keep-alive answers once, a watch stays open;
 *   - a watch whose start revision was compacted answers created, then canceled with compact_revision. */
#include "xpyd_etcd.h"

#include "xpyd_util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define ETCD_MAX_ANSWER (64u << 20) /* a range over thousands of keys stays far below this */
#define ETCD_MAX_LINE (64u << 20)   /* one watch message (etcd's own limit on a request is 1.5 MiB) */

struct etcd {
    struct event_base *base;
    struct up_thread *up;
    struct up_endpoint eps[ETCD_MAX_ENDPOINTS];
    size_t n, cur;
    char prefix[ETCD_MAX_PREFIX];
    char cur_name[300];
    struct up_timeouts to;
    struct etcd_op *ops;        /* calls in flight (etcd_free cancels them) */
    struct etcd_watch *watches;
    struct etcd_stats st;
};

struct etcd_op {
    struct etcd *e;
    struct etcd_op *prev, *next;
    char path[64];
    char *body;
    size_t blen;
    etcd_cb cb;
    void *arg;
    struct up_leg *leg;
    int ep, tries, status;
    struct evbuffer *answer;
};

struct etcd_watch {
    struct etcd *e;
    struct etcd_watch *prev, *next;
    struct up_leg *leg;
    struct etcd_watch_cbs cbs;
    void *arg;
    struct evbuffer *buf;
    int ep, status, in_cb, dead;
};

/* ---------- helpers ---------- */

int etcd_b64(const void *in, size_t len, char *out, size_t cap)
{
    if (cap < 4 * ((len + 2) / 3) + 1 || len > (size_t)1 << 30)
        return -1;
    return EVP_EncodeBlock((unsigned char *)out, (const unsigned char *)in, (int)len);
}

int etcd_unb64(const char *in, char *out, size_t cap)
{
    size_t len = strlen(in);
    if (len % 4 || len / 4 * 3 + 1 > cap || len > (size_t)1 << 30)
        return -1;
    if (len == 0) {
        out[0] = 0;
        return 0;
    }
    int n = EVP_DecodeBlock((unsigned char *)out, (const unsigned char *)in, (int)len);
    if (n < 0)
        return -1;
    n -= (in[len - 1] == '=') + (in[len - 2] == '='); /* EVP_DecodeBlock counts the padding as zero bytes */
    out[n] = 0;
    return n;
}

int64_t etcd_i64(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (cJSON_IsNumber(v)) /* in range, or 0 like any malformed value (a cast beyond int64 is undefined) */
        return v->valuedouble > -9.2e18 && v->valuedouble < 9.2e18 ? (int64_t)v->valuedouble : 0;
    if (!cJSON_IsString(v))
        return 0;
    char *end;
    errno = 0;
    long long x = strtoll(v->valuestring, &end, 10);
    return errno || end == v->valuestring || *end ? 0 : (int64_t)x;
}

int etcd_kv(const cJSON *kv, char *key, size_t kcap, char *val, size_t vcap)
{
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(kv, "key");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(kv, "value");
    if (!cJSON_IsString(k) || etcd_unb64(k->valuestring, key, kcap) <= 0 || strlen(key) == 0)
        return -1;
    if (!v) { /* a DELETE event's kv has no value */
        val[0] = 0;
        return 0;
    }
    return cJSON_IsString(v) && etcd_unb64(v->valuestring, val, vcap) >= 0 ? 0 : -1;
}

const char *etcd_strerror(int err)
{
    switch (-err) {
    case ETIMEDOUT:
    case ETIME:
        return "timed out";
    case UP_ETLS:
        return "TLS failed (certificate refused or not trusted; see event=tls_handshake_failed)";
    case EPROTO:
        return "etcd answered with an error";
    case E2BIG:
        return "a message beyond any etcd sends";
    case 0:
        return "closed by etcd";
    default:
        return strerror(-err);
    }
}

/* The end of the range of every key starting with prefix: the prefix with its last byte plus one. */
static void prefix_end(const char *prefix, char *out, size_t cap)
{
    size_t n = strlen(prefix);
    snprintf(out, cap, "%s", prefix);
    while (n > 0 && (unsigned char)out[n - 1] == 0xff)
        out[--n] = 0;
    if (n > 0)
        out[n - 1] = (char)((unsigned char)out[n - 1] + 1);
}

int etcd_url_parse(const char *url, struct etcd_url *out, char *err, size_t cap)
{
    memset(out, 0, sizeof *out);
    const char *p;
    if (!strncmp(url, "etcd://", 7))
        p = url + 7;
    else if (!strncmp(url, "etcds://", 8)) {
        p = url + 8;
        out->tls = 1;
    } else {
        snprintf(err, cap, "'%s': use etcd://host:port[,host:port...]/prefix (or etcds:// for https)", url);
        return -1;
    }
    const char *slash = strchr(p, '/');
    if (!slash || !slash[1]) {
        snprintf(err, cap, "'%s': the cluster prefix is missing (etcd://host:port/prefix)", url);
        return -1;
    }
    snprintf(out->prefix, sizeof out->prefix, "%s", slash + 1);
    size_t pl = strlen(out->prefix);
    while (pl > 0 && out->prefix[pl - 1] == '/')
        out->prefix[--pl] = 0;
    if (pl == 0 || strlen(slash + 1) >= sizeof out->prefix) {
        snprintf(err, cap, "'%s': the prefix must be 1-%zu bytes", url, sizeof out->prefix - 1);
        return -1;
    }
    char hosts[1024];
    size_t hl = (size_t)(slash - p);
    if (hl == 0 || hl >= sizeof hosts) {
        snprintf(err, cap, "'%s': no etcd endpoint", url);
        return -1;
    }
    memcpy(hosts, p, hl);
    hosts[hl] = 0;
    char *save = NULL;
    for (char *h = strtok_r(hosts, ",", &save); h; h = strtok_r(NULL, ",", &save)) {
        if (out->n == ETCD_MAX_ENDPOINTS) {
            snprintf(err, cap, "'%s': at most %d endpoints", url, ETCD_MAX_ENDPOINTS);
            return -1;
        }
        struct up_endpoint *ep = &out->eps[out->n];
        int port = 2379; /* etcd's client port when none is written */
        if (xpyd_parse_hostport(h, ep->host, sizeof ep->host, &port) != 0) {
            snprintf(err, cap, "'%s': bad endpoint '%s' (host:port, [v6]:port or host)", url, h);
            return -1;
        }
        ep->tls = out->tls;
        if (up_endpoint_resolve(ep, ep->host, port) != 0) {
            snprintf(err, cap, "'%s': cannot resolve '%s'", url, ep->host);
            return -1;
        }
        out->n++;
    }
    if (out->n == 0) {
        snprintf(err, cap, "'%s': no etcd endpoint", url);
        return -1;
    }
    return 0;
}

int etcd_next_result(struct evbuffer *buf, size_t max, cJSON **msg)
{
    *msg = NULL;
    for (;;) {
        size_t n;
        char *line = evbuffer_readln(buf, &n, EVBUFFER_EOL_LF);
        if (!line)
            return evbuffer_get_length(buf) > max ? -E2BIG : 0;
        if (n == 0 || (n == 1 && line[0] == '\r')) {
            free(line);
            continue;
        }
        cJSON *m = cJSON_ParseWithLength(line, n);
        free(line);
        if (!cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(m, "result"))) {
            cJSON_Delete(m);
            return -EPROTO;
        }
        *msg = m;
        return 1;
    }
}

/* ---------- the client ---------- */

static void set_current(struct etcd *e, size_t i)
{
    e->cur = i % e->n;
    xpyd_hostport(e->eps[e->cur].host, e->eps[e->cur].port, e->cur_name, sizeof e->cur_name);
}

struct etcd *etcd_new(struct event_base *base, const struct etcd_url *url, struct ssl_ctx_st *tls, long timeout_ms)
{
    struct etcd *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->base = base;
    e->n = url->n;
    memcpy(e->eps, url->eps, sizeof e->eps);
    snprintf(e->prefix, sizeof e->prefix, "%s", url->prefix);
    e->up = up_thread_new(base, e->eps, e->n, 4);
    if (!e->up) {
        free(e);
        return NULL;
    }
    if (tls)
        up_thread_set_tls(e->up, tls);
    e->to.connect_ms = e->to.first_byte_ms = e->to.idle_ms = timeout_ms;
    set_current(e, 0);
    return e;
}

const char *etcd_prefix(const struct etcd *e)
{
    return e->prefix;
}

const char *etcd_current(const struct etcd *e)
{
    return e->cur_name;
}

struct event_base *etcd_base(const struct etcd *e)
{
    return e->base;
}

void etcd_count_keepalive(struct etcd *e)
{
    e->st.keepalives++;
}

void etcd_get_stats(const struct etcd *e, struct etcd_stats *out)
{
    *out = e->st;
}

/* A failure on endpoint ep: later calls go to the next one (unless another failure moved on already). */
static void fail_over(struct etcd *e, int ep)
{
    if ((size_t)ep != e->cur || e->n < 2)
        return;
    set_current(e, e->cur + 1);
    e->st.failovers++;
    xpyd_log_event(XPYD_LOG_WARN, "event=etcd_failover to=%s", e->cur_name);
}

static struct evbuffer *post(struct etcd *e, int ep, const char *path, const char *body, size_t len)
{
    struct evbuffer *b = evbuffer_new();
    if (!b)
        return NULL;
    up_request_line(b, &e->eps[ep], "POST", path);
    evbuffer_add_printf(b, "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n", len);
    evbuffer_add(b, body, len);
    return b;
}

static void op_free(struct etcd_op *op)
{
    struct etcd *e = op->e;
    if (op->prev)
        op->prev->next = op->next;
    else
        e->ops = op->next;
    if (op->next)
        op->next->prev = op->prev;
    if (op->answer)
        evbuffer_free(op->answer);
    free(op->body);
    free(op);
}

static void op_head(struct up_leg *leg, int status, void *arg)
{
    ((struct etcd_op *)arg)->status = status;
}

static void op_body(struct up_leg *leg, const char *data, size_t len, void *arg)
{
    struct etcd_op *op = arg;
    if (evbuffer_get_length(op->answer) + len <= ETCD_MAX_ANSWER)
        evbuffer_add(op->answer, data, len);
}

static int op_send(struct etcd_op *op);

static void op_done(struct up_leg *leg, int err, void *arg)
{
    struct etcd_op *op = arg;
    struct etcd *e = op->e;
    op->leg = NULL;
    if (err == 0 && op->status >= 500) /* the gateway up but the member unable (no leader, shutting down) */
        err = -EIO;
    if (err) {
        fail_over(e, op->ep);
        if (++op->tries < (int)e->n && op_send(op) == 0)
            return;
        e->st.failures++;
        op->cb(e, err, NULL, op->arg);
        op_free(op);
        return;
    }
    size_t len = evbuffer_get_length(op->answer);
    cJSON *answer = cJSON_ParseWithLength(len ? (const char *)evbuffer_pullup(op->answer, -1) : "", len);
    if (op->status == 200 && answer) {
        e->st.calls++;
        e->st.last_ok_us = xpyd_now_us();
    }
    else
        e->st.failures++;
    op->cb(e, op->status == 200 && answer ? 0 : -EPROTO, answer, op->arg);
    cJSON_Delete(answer);
    op_free(op);
}

static int op_send(struct etcd_op *op)
{
    static const struct up_leg_cbs cbs = {op_head, op_body, op_done, NULL, NULL, NULL};
    struct etcd *e = op->e;
    op->ep = (int)e->cur;
    op->status = 0;
    evbuffer_drain(op->answer, evbuffer_get_length(op->answer));
    struct evbuffer *req = post(e, op->ep, op->path, op->body, op->blen);
    if (!req)
        return -ENOMEM;
    op->leg = up_leg_start(e->up, op->ep, req, &e->to, &cbs, op);
    evbuffer_free(req);
    return op->leg ? 0 : -ENOMEM;
}

struct etcd_op *etcd_call(struct etcd *e, const char *path, const char *json, etcd_cb cb, void *arg)
{
    struct etcd_op *op = calloc(1, sizeof *op);
    if (!op)
        return NULL;
    op->e = e;
    snprintf(op->path, sizeof op->path, "%s", path);
    op->blen = strlen(json);
    op->body = strdup(json);
    op->answer = evbuffer_new();
    op->cb = cb;
    op->arg = arg;
    op->next = e->ops;
    if (e->ops)
        e->ops->prev = op;
    e->ops = op;
    if (!op->body || !op->answer || op_send(op) != 0) {
        op_free(op);
        return NULL;
    }
    return op;
}

void etcd_op_cancel(struct etcd_op *op)
{
    if (!op)
        return;
    up_leg_cancel(op->leg);
    op_free(op);
}

static char *b64_dup(const char *s, size_t len)
{
    size_t cap = 4 * ((len + 2) / 3) + 1;
    char *out = malloc(cap);
    if (out && etcd_b64(s, len, out, cap) < 0) {
        free(out);
        return NULL;
    }
    return out;
}

struct etcd_op *etcd_range_prefix(struct etcd *e, const char *prefix, etcd_cb cb, void *arg)
{
    char end[ETCD_MAX_PREFIX + 300];
    prefix_end(prefix, end, sizeof end);
    char *k = b64_dup(prefix, strlen(prefix)), *r = b64_dup(end, strlen(end));
    cJSON *o = cJSON_CreateObject();
    struct etcd_op *op = NULL;
    if (k && r && o && cJSON_AddStringToObject(o, "key", k) && cJSON_AddStringToObject(o, "range_end", r)) {
        char *body = cJSON_PrintUnformatted(o);
        if (body)
            op = etcd_call(e, "/v3/kv/range", body, cb, arg);
        free(body);
    }
    cJSON_Delete(o);
    free(k);
    free(r);
    return op;
}

struct etcd_op *etcd_put(struct etcd *e, const char *key, const char *value, size_t vlen, int64_t lease, etcd_cb cb,
                         void *arg)
{
    char *k = b64_dup(key, strlen(key)), *v = b64_dup(value, vlen);
    cJSON *o = cJSON_CreateObject();
    struct etcd_op *op = NULL;
    char ls[32];
    snprintf(ls, sizeof ls, "%" PRId64, lease);
    if (k && v && o && cJSON_AddStringToObject(o, "key", k) && cJSON_AddStringToObject(o, "value", v) &&
        (!lease || cJSON_AddStringToObject(o, "lease", ls))) {
        char *body = cJSON_PrintUnformatted(o);
        if (body && (op = etcd_call(e, "/v3/kv/put", body, cb, arg)))
            e->st.writes++;
        free(body);
    }
    cJSON_Delete(o);
    free(k);
    free(v);
    return op;
}

struct etcd_op *etcd_delete(struct etcd *e, const char *key, etcd_cb cb, void *arg)
{
    char *k = b64_dup(key, strlen(key));
    struct etcd_op *op = NULL;
    if (k) {
        char body[1024];
        if ((size_t)snprintf(body, sizeof body, "{\"key\":\"%s\"}", k) < sizeof body &&
            (op = etcd_call(e, "/v3/kv/deleterange", body, cb, arg)))
            e->st.writes++;
    }
    free(k);
    return op;
}

/* ---------- watches ---------- */

static void watch_unlink_free(struct etcd_watch *w)
{
    struct etcd *e = w->e;
    if (w->prev)
        w->prev->next = w->next;
    else
        e->watches = w->next;
    if (w->next)
        w->next->prev = w->prev;
    evbuffer_free(w->buf);
    free(w);
}

static void w_head(struct up_leg *leg, int status, void *arg)
{
    ((struct etcd_watch *)arg)->status = status;
}

/* Ends the watch from inside its leg's callbacks: on_end, then the leg is stopped. */
static void watch_end(struct etcd_watch *w, int err)
{
    w->in_cb = 1;
    w->cbs.on_end(w->e, err, w->arg);
    w->in_cb = 0;
    w->dead = 1;
}

static void w_body(struct up_leg *leg, const char *data, size_t len, void *arg)
{
    struct etcd_watch *w = arg;
    if (w->dead)
        return;
    if (w->status != 200) { /* an error answer: collected whole, reported at the end */
        if (evbuffer_get_length(w->buf) + len <= 65536)
            evbuffer_add(w->buf, data, len);
        return;
    }
    evbuffer_add(w->buf, data, len);
    cJSON *msg;
    int rc;
    while (!w->dead && (rc = etcd_next_result(w->buf, ETCD_MAX_LINE, &msg)) != 0) {
        if (rc < 0) { /* {"error": ...} in the stream, garbage, or a line beyond any real message */
            watch_end(w, rc);
            break;
        }
        w->e->st.last_ok_us = xpyd_now_us();
        w->in_cb = 1;
        w->cbs.on_result(w->e, cJSON_GetObjectItemCaseSensitive(msg, "result"), w->arg);
        w->in_cb = 0;
        cJSON_Delete(msg);
    }
    if (w->dead) { /* ended or cancelled from a callback: stop the leg now that its callback is done with us */
        up_leg_cancel(w->leg);
        watch_unlink_free(w);
    }
}

static void w_done(struct up_leg *leg, int err, void *arg)
{
    struct etcd_watch *w = arg;
    w->leg = NULL;
    if (err || w->status != 200)
        fail_over(w->e, w->ep);
    if (!err && w->status != 200)
        err = w->status >= 500 ? -EIO : -EPROTO;
    w->in_cb = 1; /* an etcd_watch_cancel from on_end only marks it: it is freed once, here */
    w->cbs.on_end(w->e, err, w->arg);
    watch_unlink_free(w);
}

struct etcd_watch *etcd_watch_prefix(struct etcd *e, const char *prefix, int64_t start_rev,
                                     const struct etcd_watch_cbs *cbs, void *arg)
{
    static const struct up_leg_cbs lcbs = {w_head, w_body, w_done, NULL, NULL, NULL};
    char end[ETCD_MAX_PREFIX + 300];
    prefix_end(prefix, end, sizeof end);
    char *k = b64_dup(prefix, strlen(prefix)), *r = b64_dup(end, strlen(end));
    struct etcd_watch *w = calloc(1, sizeof *w);
    char *body = NULL;
    if (k && r && w && (w->buf = evbuffer_new())) {
        size_t cap = strlen(k) + strlen(r) + 200;
        body = malloc(cap);
        if (body)
            snprintf(body, cap,
                     "{\"create_request\":{\"key\":\"%s\",\"range_end\":\"%s\",\"start_revision\":\"%" PRId64
                     "\",\"progress_notify\":true}}",
                     k, r, start_rev);
    }
    free(k);
    free(r);
    if (!body) {
        if (w && w->buf)
            evbuffer_free(w->buf);
        free(w);
        return NULL;
    }
    w->e = e;
    w->cbs = *cbs;
    w->arg = arg;
    w->ep = (int)e->cur;
    struct evbuffer *req = post(e, w->ep, "/v3/watch", body, strlen(body));
    free(body);
    /* Events may be minutes apart: no idle limit on the stream (a dead etcd is found by the connection's
     * end, or by the caller's own calls failing, e.g. the lease keep-alive). */
    struct up_timeouts to = {e->to.connect_ms, e->to.first_byte_ms, 0};
    w->leg = req ? up_leg_start(e->up, w->ep, req, &to, &lcbs, w) : NULL;
    if (req)
        evbuffer_free(req);
    if (!w->leg) {
        evbuffer_free(w->buf);
        free(w);
        return NULL;
    }
    w->next = e->watches;
    if (e->watches)
        e->watches->prev = w;
    e->watches = w;
    return w;
}

void etcd_watch_cancel(struct etcd_watch *w)
{
    if (!w)
        return;
    if (w->in_cb) { /* from one of its own callbacks: w_body finishes the job */
        w->dead = 1;
        return;
    }
    up_leg_cancel(w->leg);
    watch_unlink_free(w);
}

void etcd_free(struct etcd *e)
{
    if (!e)
        return;
    while (e->ops)
        etcd_op_cancel(e->ops);
    while (e->watches)
        etcd_watch_cancel(e->watches);
    up_thread_free(e->up);
    free(e);
}
