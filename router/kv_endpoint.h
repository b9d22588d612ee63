/* SPDX-License-Identifier: Apache-2.0 */
/* kv_endpoint.h - "tcp://HOST:PORT" endpoints of engines' KV-event publishers: checked (0 or -1), made from a host
 * and a port, and rank r's from its rank 0's (PORT + r, as vLLM offsets a DP rank's endpoint). */
#ifndef XPYD_KV_ENDPOINT_H
#define XPYD_KV_ENDPOINT_H

#include <stddef.h>

int rt_kv_endpoint_check(const char *ep);
void rt_kv_endpoint_make(const char *host, int port, char *out, size_t cap);
void rt_kv_endpoint_rank(const char *base, int rank, char *out, size_t cap);
/* Rank r's: from its host's own endpoint (given, "" none), else the flag's port (0 none) on host. */
void rt_kv_endpoint_for(const char *given, const char *host, long port, int rank, char *out, size_t cap);

#endif
