/* SPDX-License-Identifier: Apache-2.0 */
/* etcd_parse.h - what --discovery reads from etcd, checked without router state (etcd_sync.c applies it;
 * tests/fuzz/fuzz_etcd.c fuzzes it). */
#ifndef XPYD_ETCD_PARSE_H
#define XPYD_ETCD_PARSE_H

#include <stddef.h>
#include <stdint.h>

/* "<prefill|decode>/<host>:<port>" (host may be [v6]) into its parts; 0 or -1. */
int esync_instance_key(const char *rest, int *role, char *host, size_t hcap, long *port);
/* An instance's value (a strict JSON object of the admin API's fields but role, host and port: admin_parse.h)
 * with the key's role, host and port put in: a body for rt_admin_parse_instance (malloc'd). NULL with err set
 * when the value is empty, not a JSON object, or names a field it may not. */
char *esync_instance_body(int role, const char *host, long port, const char *val, char *err, size_t cap);
/* A router's published load {"prefill"|"decode": {"<host:port>/<dp rank>": [tokens, requests]}}: on_rank for
 * each well-formed entry in order (tokens 0..1e15, requests 0..1e9; a repeated name: the last call stays);
 * returns the count of malformed entries, or -1 when the value is not a strict JSON object of those two keys,
 * with the reason in err either way. */
int esync_parse_load(const char *val, void (*on_rank)(int role, const char *name, int64_t tokens, int64_t requests,
                                                      void *arg),
                     void *arg, char *err, size_t cap);

#endif
