/* SPDX-License-Identifier: Apache-2.0 */
/* loopguard.c - the router never becomes its own engine (see loopguard.h). */
#include "loopguard.h"
#include "router.h"

#include "xpyd_util.h"

#include <arpa/inet.h>
#include <evhtp/evhtp.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#define MAX_LISTENERS 4

struct listener {
    struct sockaddr_storage addr; /* the listen address (port ignored), or a wildcard */
    int port;
};
static struct listener listeners[MAX_LISTENERS];
static int nlisteners;
static char hop_id[32];

const char *rt_loop_id(void)
{
    if (!hop_id[0]) {
        uint64_t r = 0;
        if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
            r = xpyd_mix64(xpyd_now_us() ^ ((uint64_t)getpid() << 32));
        char hex[17];
        *xpyd_put_hex64(hex, r) = 0;
        snprintf(hop_id, sizeof hop_id, "xpyd-%s", hex);
    }
    return hop_id;
}

void rt_loop_listener(const char *host, int port)
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    if (nlisteners == MAX_LISTENERS || getaddrinfo(host[0] ? host : NULL, "0", &hints, &res) != 0 || !res)
        return;
    memcpy(&listeners[nlisteners].addr, res->ai_addr, res->ai_addrlen);
    listeners[nlisteners].port = port;
    nlisteners++;
    freeaddrinfo(res);
}

/* The address of sa as an IPv6 one (IPv4 mapped), and its port. */
static void as_v6(const struct sockaddr *sa, struct in6_addr *a, int *port)
{
    memset(a, 0, sizeof *a);
    *port = 0;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *s = (const struct sockaddr_in *)sa;
        a->s6_addr[10] = a->s6_addr[11] = 0xff;
        memcpy(&a->s6_addr[12], &s->sin_addr, 4);
        *port = ntohs(s->sin_port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)sa;
        *a = s->sin6_addr;
        *port = ntohs(s->sin6_port);
    }
}

static int is_v4(const struct in6_addr *a)
{
    return IN6_IS_ADDR_V4MAPPED(a);
}

static int is_any(const struct in6_addr *a)
{
    static const unsigned char v4any[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 0};
    return IN6_IS_ADDR_UNSPECIFIED(a) || memcmp(a, v4any, 16) == 0;
}

/* Loopback (127.0.0.0/8, ::1), the unspecified address (connecting to it reaches this host) or an address of
 * one of this host's interfaces. */
static int is_local(const struct in6_addr *a)
{
    if (is_any(a) || IN6_IS_ADDR_LOOPBACK(a) || (is_v4(a) && a->s6_addr[12] == 127))
        return 1;
    struct ifaddrs *ifs = NULL, *i;
    int local = 0;
    if (getifaddrs(&ifs) != 0)
        return 0;
    for (i = ifs; i && !local; i = i->ifa_next) {
        if (!i->ifa_addr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6))
            continue;
        struct in6_addr b;
        int port;
        as_v6(i->ifa_addr, &b, &port);
        local = memcmp(a, &b, sizeof b) == 0;
    }
    freeifaddrs(ifs);
    return local;
}

int rt_loop_is_self(const struct sockaddr *sa, socklen_t len)
{
    struct in6_addr a;
    int port;
    as_v6(sa, &a, &port);
    for (int k = 0; k < nlisteners; k++) {
        struct in6_addr l;
        int unused;
        as_v6((const struct sockaddr *)&listeners[k].addr, &l, &unused);
        if (port != listeners[k].port)
            continue;
        if (!is_any(&l)) {
            struct in6_addr to = a; /* connecting to the unspecified address reaches the loopback one */
            if (is_any(&a) && is_v4(&a))
                to.s6_addr[12] = 127, to.s6_addr[15] = 1;
            else if (is_any(&a))
                to = in6addr_loopback;
            if (memcmp(&to, &l, sizeof to) == 0)
                return 1;
            continue;
        }
        /* a wildcard listener: 0.0.0.0 takes IPv4 only, :: both (Linux's default dual stack) */
        if (IN6_IS_ADDR_UNSPECIFIED(&l) || is_v4(&a))
            if (is_local(&a))
                return 1;
    }
    return 0;
}

int rt_loop_check(evhtp_request_t *req, char *out, size_t cap)
{
    const char *via = evhtp_header_find(req->headers_in, RT_VIA_HEADER);
    const char *id = rt_loop_id();
    size_t idl = strlen(id);
    long hops = 0;
    int looped = 0;
    for (const char *p = via; p && *p;) {
        while (*p == ' ' || *p == ',')
            p++;
        const char *e = p;
        while (*e && *e != ',' && *e != ' ')
            e++;
        if (e > p) {
            hops++;
            looped |= (size_t)(e - p) == idl && memcmp(p, id, idl) == 0;
        }
        p = e;
    }
    if (looped || hops >= g_rt->cfg.max_hops) {
        char msg[300];
        if (looped)
            snprintf(msg, sizeof msg, "loop detected: this request already passed through this router (%s): one of "
                                      "its engine addresses leads back to it", id);
        else
            snprintf(msg, sizeof msg, "loop detected: this request passed through %ld routers (--max-hops %ld)", hops,
                     g_rt->cfg.max_hops);
        atomic_fetch_add(&g_rt->ctr.loops_refused, 1);
        xpyd_log_event(XPYD_LOG_WARN, "event=loop_refused hops=%ld via=\"%.200s\"", hops, via ? via : "");
        xpyd_reply_error(req, 508, msg);
        return -1;
    }
    int n = via && hops ? snprintf(out, cap, "%s: %s, %s\r\n", RT_VIA_HEADER, via, id)
                        : snprintf(out, cap, "%s: %s\r\n", RT_VIA_HEADER, id);
    if (n < 0 || (size_t)n >= cap) /* a longer list than a head line may be: --max-hops bounds it well below */
        snprintf(out, cap, "%s: %s\r\n", RT_VIA_HEADER, id);
    return 0;
}
