/* SPDX-License-Identifier: Apache-2.0 */
/* admin_parse.c - POST /admin/instances body (see admin_parse.h). Read as the router reads every JSON it is
 * given (json_view.h): strict JSON, one object and nothing after it, a repeated key read as its last
 * occurrence (Python's json, what clients' bodies get), an unknown field refused by name. */
#include "admin_parse.h"

#include "json_view.h"
#include "kv_endpoint.h"
#include "xpyd_util.h"

#include <stdio.h>
#include <string.h>

static const char *const fields[] = {"role",          "host",          "port",           "tls", "dp", "tp", "weight",
                                     "max_inflight",  "max_model_len", "bootstrap_port", "kv_events", NULL};

static int json_long(struct jv o, const char *k, long lo, long hi, long def, long *out, char *err, size_t cap)
{
    struct jv v = jv_get(o, k);
    double d;
    if (!v.p) {
        *out = def;
        return 0;
    }
    /* range first: converting an out-of-range double to an integer is undefined behaviour */
    if (jv_double(v, &d) != 0 || d < (double)lo || d > (double)hi || d != (double)(long)d) {
        snprintf(err, cap, "'%s' must be an integer in [%ld, %ld]", k, lo, hi);
        return -1;
    }
    *out = (long)d;
    return 0;
}

int rt_admin_check_object(const char *json, size_t len, const char *const known[], const char *what, struct jv *obj,
                          char *err, size_t cap)
{
    const char *why = NULL;
    size_t at = 0;
    if (len == 0) {
        snprintf(err, cap, "%s is empty: it must be a JSON object", what);
        return -1;
    }
    if (jv_check(json, len, &why, &at) != 0) {
        snprintf(err, cap, "%s is not valid JSON: %s at byte %zu", what, why ? why : "malformed", at);
        return -1;
    }
    *obj = jv_at(json, json + len);
    if (jv_type(*obj) != JV_OBJECT) {
        snprintf(err, cap, "%s must be a JSON object", what);
        return -1;
    }
    struct jv_iter it;
    struct jv k, v;
    jv_iter_init(&it, *obj);
    while (jv_next(&it, &k, &v)) {
        int i = 0;
        while (known[i] && !jv_str_eq(k, known[i], strlen(known[i])))
            i++;
        if (!known[i]) {
            char name[64];
            size_t n = jv_str_len(k);
            if (n < sizeof name) {
                jv_str_decode(k, name);
                name[n] = 0;
            } else {
                snprintf(name, sizeof name, "(a %zu-byte name)", n);
            }
            int w = snprintf(err, cap, "unknown field '%s' (known:", name);
            for (int j = 0; known[j] && w > 0 && (size_t)w < cap; j++)
                w += snprintf(err + w, cap - (size_t)w, " %s", known[j]);
            if (w > 0 && (size_t)w < cap)
                snprintf(err + w, cap - (size_t)w, ")");
            return -1;
        }
    }
    return 0;
}

int rt_admin_parse_instance(const char *json, size_t len, const struct rt_admin_defaults defaults[2], int dp_internal,
                            struct rt_admin_instance *out, char *err, size_t cap)
{
    memset(out, 0, sizeof *out);
    err[0] = 0;
    struct jv o;
    if (rt_admin_check_object(json, len, fields, "the body", &o, err, cap) != 0)
        return -1;
    struct jv jr = jv_get(o, "role"), jh = jv_get(o, "host"), jt = jv_get(o, "tls");
    int role = jv_str_eq(jr, "prefill", 7) ? 0 : jv_str_eq(jr, "decode", 6) ? 1 : -1;
    size_t hl = jv_type(jh) == JV_STRING ? jv_str_len(jh) : 0;
    if (role < 0)
        snprintf(err, cap, "'role' must be \"prefill\" or \"decode\"");
    else if (!hl || hl > 255)
        snprintf(err, cap, "'host' must be a non-empty string of at most 255 bytes");
    else if (!json_long(o, "port", 1, 65535, 0, &out->port, err, cap) && out->port == 0)
        snprintf(err, cap, "'port' is required");
    if (err[0])
        return -1;
    jv_str_decode(jh, out->host);
    out->host[hl] = 0;
    if (memchr(out->host, 0, hl) || !xpyd_host_valid(out->host)) {
        snprintf(err, cap, "'host' must be a host name or an IP address (letters, digits, '.', '-', '_'; an IPv6 "
                           "address without brackets)");
        return -1;
    }
    const struct rt_admin_defaults *d = &defaults[role];
    if (json_long(o, "dp", 1, 1024, d->dp, &out->dp, err, cap) || json_long(o, "tp", 1, 1024, d->tp, &out->tp, err, cap) ||
        json_long(o, "weight", 1, 1000000, 1, &out->weight, err, cap) ||
        json_long(o, "max_inflight", 0, 1000000, d->max_inflight, &out->max_inflight, err, cap) ||
        json_long(o, "max_model_len", 0, 1L << 40, 0, &out->max_model_len, err, cap) ||
        json_long(o, "bootstrap_port", 0, 65535, 0, &out->bootstrap_port, err, cap))
        return -1;
    if (!dp_internal && out->port + out->dp - 1 > 65535) {
        snprintf(err, cap, "port + dp - 1 is above 65535");
        return -1;
    }
    if (jt.p && jv_type(jt) != JV_TRUE && jv_type(jt) != JV_FALSE) {
        snprintf(err, cap, "'tls' must be true or false");
        return -1;
    }
    out->tls = jv_type(jt) == JV_TRUE;
    out->role = role;
    struct jv kv = jv_get(o, "kv_events"); /* its rank 0's KV-event publisher, rank r on its port + r */
    out->kv_events[0] = 0;
    if (kv.p) {
        size_t kl = jv_type(kv) == JV_STRING ? jv_str_len(kv) : 0;
        if (kl && kl < sizeof out->kv_events)
            jv_str_decode(kv, out->kv_events);
        if (!kl || kl >= sizeof out->kv_events || (out->kv_events[kl] = 0, rt_kv_endpoint_check(out->kv_events))) {
            snprintf(err, cap, "'kv_events' must be \"tcp://HOST:PORT\" (the engine's KV-event publisher)");
            return -1;
        }
    }
    return 0;
}
