/* SPDX-License-Identifier: Apache-2.0 */
/* kv_endpoint.c - KV-event endpoints as the topology, the flags and the admin API give them (kv_endpoint.h). */
#include "kv_endpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int rt_kv_endpoint_check(const char *ep)
{
    const char *colon = strrchr(ep, ':');
    char *end;
    long port = colon ? strtol(colon + 1, &end, 10) : 0;
    return strncmp(ep, "tcp://", 6) || !colon || colon - ep <= 6 || *end || port < 1 || port > 65535 ? -1 : 0;
}

void rt_kv_endpoint_make(const char *host, int port, char *out, size_t cap)
{
    if (strchr(host, ':')) /* an IPv6 address */
        snprintf(out, cap, "tcp://[%s]:%d", host, port);
    else
        snprintf(out, cap, "tcp://%s:%d", host, port);
}

void rt_kv_endpoint_rank(const char *base, int rank, char *out, size_t cap)
{
    const char *colon = strrchr(base, ':');
    long port = strtol(colon + 1, NULL, 10) + rank;
    snprintf(out, cap, "%.*s:%ld", (int)(colon - base), base, port > 65535 ? 65535 : port);
}

void rt_kv_endpoint_for(const char *given, const char *host, long port, int rank, char *out, size_t cap)
{
    out[0] = 0;
    if (given[0])
        rt_kv_endpoint_rank(given, rank, out, cap);
    else if (port > 0)
        rt_kv_endpoint_make(host, (int)port + rank, out, cap);
}
