/* SPDX-License-Identifier: Apache-2.0 */
/* admin_parse.h - the body of POST /admin/instances, read and checked without router state (registry.c
 * applies it; tests/fuzz/fuzz_admin.c fuzzes it). The rule for every JSON the router is given (client bodies,
 * admin bodies, etcd values): strict JSON (RFC 8259, nothing after the value), a repeated key read as its last
 * occurrence; admin bodies and etcd values also refuse a field they do not know. */
#ifndef XPYD_ADMIN_PARSE_H
#define XPYD_ADMIN_PARSE_H

#include <stddef.h>

struct jv;

struct rt_admin_defaults {
    long dp, tp, max_inflight; /* the pool's, per role (0 prefill, 1 decode) */
};

struct rt_admin_instance {
    int role; /* 0 prefill, 1 decode */
    char host[256];
    long port, dp, tp, weight, max_inflight, max_model_len, bootstrap_port;
    int tls; /* "tls": true: the engine speaks https */
    char kv_events[300]; /* "kv_events": "tcp://HOST:PORT" of its rank 0's KV events (rank r on PORT + r), "" */
};

/* {"role","host","port"[,"tls","dp","tp","weight","max_inflight","max_model_len","bootstrap_port"]}: 0 and *out
 * filled (absent fields from defaults[role]; bootstrap_port 0 when absent: the configuration's default), or -1 with the reason in err
 * (a 400 message). dp_internal: the ranks share one port (else port + dp - 1 must be a port). */
int rt_admin_parse_instance(const char *json, size_t len, const struct rt_admin_defaults defaults[2], int dp_internal,
                            struct rt_admin_instance *out, char *err, size_t cap);

/* json[0..len) is one strict JSON object whose keys are all in known (NULL-terminated): 0 and *obj its view,
 * or -1 with the reason in err, what naming the text ("the body", "the value"). */
int rt_admin_check_object(const char *json, size_t len, const char *const known[], const char *what, struct jv *obj,
                          char *err, size_t cap);

#endif
