/* SPDX-License-Identifier: Apache-2.0 */
/* etcd_parse.c - keys and values of the --discovery layout (docs/PROTOCOLS.md#etcd); see etcd_parse.h. Values
 * are read as admin bodies are (admin_parse.h): strict JSON, the last of a repeated key, unknown fields refused. */
#include "etcd_parse.h"

#include "admin_parse.h"
#include "json_view.h"
#include "xpyd_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* what an instance's value may say (the key says who it is: role, host and port) */
static const char *const value_fields[] = {"dp",           "tp",           "weight", "max_inflight",
                                           "max_model_len", "bootstrap_port", "tls",   "kv_events", NULL};
static const char *const load_fields[] = {"prefill", "decode", NULL};

int esync_instance_key(const char *rest, int *role, char *host, size_t hcap, long *port)
{
    const char *slash = strchr(rest, '/');
    if (!slash)
        return -1;
    size_t rl = (size_t)(slash - rest);
    if (rl == 7 && !strncmp(rest, "prefill", 7))
        *role = 0;
    else if (rl == 6 && !strncmp(rest, "decode", 6))
        *role = 1;
    else
        return -1;
    int p = 0; /* a port is required */
    if (xpyd_parse_hostport(slash + 1, host, hcap, &p) != 0 || p == 0) /* (a host xpyd_host_valid takes) */
        return -1;
    *port = p;
    return 0;
}

char *esync_instance_body(int role, const char *host, long port, const char *val, char *err, size_t cap)
{
    struct jv o;
    size_t n = strlen(val);
    if (!n) {
        snprintf(err, cap, "the value is empty: it must be a JSON object ({} for the pool's defaults)");
        return NULL;
    }
    if (rt_admin_check_object(val, n, value_fields, "the value", &o, err, cap) != 0)
        return NULL;
    /* the value's members as they are, after the key's role, host and port (a host of printable ASCII with no
     * quote or backslash: esync_instance_key) */
    const char *in = o.p + 1, *end = o.p + o.n - 1;
    while (in < end && (*in == ' ' || *in == '\t' || *in == '\n' || *in == '\r'))
        in++;
    size_t cap_body = (size_t)(end - in) + strlen(host) + 80;
    char *body = XPYD_XALLOC(malloc(cap_body));
    int w = snprintf(body, cap_body, "{\"role\":\"%s\",\"host\":\"%s\",\"port\":%ld%s%.*s}", role ? "decode" : "prefill",
                     host, port, in < end ? "," : "", (int)(end - in), in);
    if (w < 0 || (size_t)w >= cap_body) {
        free(body);
        snprintf(err, cap, "the value is too large");
        return NULL;
    }
    return body;
}

int esync_parse_load(const char *val, void (*on_rank)(int role, const char *name, int64_t tokens, int64_t requests,
                                                      void *arg),
                     void *arg, char *err, size_t cap)
{
    struct jv o;
    err[0] = 0;
    if (rt_admin_check_object(val, strlen(val), load_fields, "the value", &o, err, cap) != 0)
        return -1;
    int bad = 0;
    for (int role = 0; role < 2; role++) {
        struct jv m = jv_get(o, role ? "decode" : "prefill"), k, e;
        if (!m.p)
            continue;
        if (jv_type(m) != JV_OBJECT) {
            bad++;
            continue;
        }
        struct jv_iter it;
        jv_iter_init(&it, m);
        while (jv_next(&it, &k, &e)) { /* in order: of a repeated name, the last entry is the one that stays */
            struct jv_iter ai;
            struct jv t = {0}, r = {0}, extra;
            double tv = -1, rv = -1;
            int pair = 0;
            if (jv_type(e) == JV_ARRAY) {
                jv_iter_init(&ai, e);
                pair = jv_next(&ai, NULL, &t) && jv_next(&ai, NULL, &r) && !jv_next(&ai, NULL, &extra);
            }
            char *name = jv_str_dup(k);
            if (!pair || jv_double(t, &tv) || jv_double(r, &rv) || !(tv >= 0) || !(rv >= 0) || tv > 1e15 ||
                rv > 1e9 || strlen(name) != jv_str_len(k))
                bad++;
            else
                on_rank(role, name, (int64_t)tv, (int64_t)rv, arg);
            free(name);
        }
    }
    if (bad)
        snprintf(err, cap, "%d rank load%s not [tokens, requests]", bad, bad > 1 ? "s are" : " is");
    return bad;
}
