/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_etcd.h - etcd v3 through its JSON gateway (POST /v3/..., base64 keys and values, 64-bit numbers as
 * strings), over xpyd's own HTTP client: no gRPC stack. Everything runs on one event loop (the caller's).
 *
 * Three layers, each usable alone:
 *   - calls: one POST with failover across the endpoints of the URL (the current endpoint is kept while it
 *     answers; a transport failure or a 5xx moves to the next one, and the call is tried once per endpoint);
 *   - watches: one streaming POST /v3/watch; every {"result": ...} message is handed over as it arrives;
 *   - registrations (struct etcd_reg): keys held under one lease that is granted, kept alive every TTL/3 and
 *     granted again (with the keys put again) when etcd lost it; turned off, the lease is revoked so the keys
 *     vanish at once; if the process dies, they vanish when the TTL runs out.
 * Contract (as xpyd_http_client): a callback never fires after its cancel function returned, and
 * etcd_free() cancels everything without callbacks. */
#ifndef XPYD_ETCD_H
#define XPYD_ETCD_H

#include "xpyd_http_client.h"

#include <stddef.h>
#include <stdint.h>

struct event_base;
struct cJSON;
struct etcd;
struct etcd_op;
struct etcd_watch;

#define ETCD_MAX_ENDPOINTS 16
#define ETCD_MAX_PREFIX 200

/* etcd://host1:2379,host2:2379/prefix (http) or etcds://... (https); IPv6 as [::1]:2379. The prefix is
 * everything after the first '/', without a trailing '/', and may not be empty. */
struct etcd_url {
    struct up_endpoint eps[ETCD_MAX_ENDPOINTS];
    size_t n;
    int tls;
    char prefix[ETCD_MAX_PREFIX];
};
/* 0, or -1 with the reason in err. Resolves the hosts. */
int etcd_url_parse(const char *url, struct etcd_url *out, char *err, size_t cap);

/* timeout_ms bounds each call (connect and answer). tls: the client context for etcds:// (NULL otherwise). */
struct etcd *etcd_new(struct event_base *base, const struct etcd_url *url, struct ssl_ctx_st *tls, long timeout_ms);
void etcd_free(struct etcd *e);
const char *etcd_prefix(const struct etcd *e);
/* The endpoint calls go to now, "host:port". */
const char *etcd_current(const struct etcd *e);

/* What was done against etcd (for metrics and the cost report). */
struct etcd_stats {
    uint64_t calls, failures; /* unary calls answered / failed (after every endpoint was tried) */
    uint64_t writes;          /* puts and deletes */
    uint64_t keepalives;      /* lease keep-alives sent */
    uint64_t failovers;       /* moves to the next endpoint */
    uint64_t last_ok_us;      /* xpyd_now_us() of etcd's last good answer or watch message; 0: never */
};
void etcd_get_stats(const struct etcd *e, struct etcd_stats *out);
/* The event loop e runs on; a keep-alive counted in its stats (xpyd_etcd_lease.c). */
struct event_base *etcd_base(const struct etcd *e);
void etcd_count_keepalive(struct etcd *e);

/* ---------- calls ---------- */

/* err 0: answer is the parsed JSON body of a 200 (freed after the callback returns); -EPROTO: etcd answered
 * with an error (answer holds {"error", "code", ...} when it was JSON); other negative errno: no endpoint
 * answered (connect refused, timeout, 5xx). */
typedef void (*etcd_cb)(struct etcd *e, int err, struct cJSON *answer, void *arg);
/* POST path (e.g. "/v3/kv/range") with the JSON body. NULL (and no callback) only on OOM. */
struct etcd_op *etcd_call(struct etcd *e, const char *path, const char *json, etcd_cb cb, void *arg);
void etcd_op_cancel(struct etcd_op *op);

/* Ready-made bodies. key/value are bytes (base64 is done here). */
struct etcd_op *etcd_range_prefix(struct etcd *e, const char *prefix, etcd_cb cb, void *arg);
struct etcd_op *etcd_put(struct etcd *e, const char *key, const char *value, size_t vlen, int64_t lease, etcd_cb cb,
                         void *arg);
struct etcd_op *etcd_delete(struct etcd *e, const char *key, etcd_cb cb, void *arg);

/* ---------- watches ---------- */

/* on_result: one message's "result" object (header, events, created, canceled, compact_revision).
 * on_end: the stream ended (err 0: etcd closed it; negative errno otherwise); the watch is gone afterwards. */
struct etcd_watch_cbs {
    void (*on_result)(struct etcd *e, const struct cJSON *result, void *arg);
    void (*on_end)(struct etcd *e, int err, void *arg);
};
/* Watches every key under prefix from start_rev (0: from now). NULL on OOM (no callback then). */
struct etcd_watch *etcd_watch_prefix(struct etcd *e, const char *prefix, int64_t start_rev,
                                     const struct etcd_watch_cbs *cbs, void *arg);
void etcd_watch_cancel(struct etcd_watch *w);

/* ---------- helpers ---------- */

/* The next message of a streaming answer (one JSON object per line) buffered in buf: 1 with *msg (the whole
 * message; free it with cJSON_Delete; its "result" is an object), 0 when no whole line is buffered yet,
 * -EPROTO for a line that is not {"result": {...}} (an error message or garbage), -E2BIG when more than
 * max bytes are buffered without a line end. Blank lines are skipped. */
struct evbuffer;
int etcd_next_result(struct evbuffer *buf, size_t max, struct cJSON **msg);

/* What a call's or a watch's negative err means, for logs. */
const char *etcd_strerror(int err);
/* Base64 of len bytes into out (NUL-terminated); the length, or -1 when cap is too small. */
int etcd_b64(const void *in, size_t len, char *out, size_t cap);
/* Bytes of base64 text into out (NUL-terminated); the length, or -1 when invalid or cap is too small. */
int etcd_unb64(const char *in, char *out, size_t cap);
/* A 64-bit field given as a JSON string (the gateway's int64) or number; 0 when absent or malformed. */
int64_t etcd_i64(const struct cJSON *o, const char *name);
/* One kv of an answer or event: key into key (NUL-terminated), value into val (NUL-terminated, may be
 * empty). 0, or -1 when a field is missing, not base64, or too long for the buffers. */
int etcd_kv(const struct cJSON *kv, char *key, size_t kcap, char *val, size_t vcap);

#endif
