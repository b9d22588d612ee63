/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_util.c - clocks, logging, hashing and parsing helpers shared by every xpyd binary. */
#include "xpyd_util.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/resource.h>

_Atomic int xpyd_log_level = XPYD_LOG_INFO;

uint64_t xpyd_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

int64_t xpyd_wall_s(void)
{
    return (int64_t)time(NULL);
}

static const char *const level_names[] = {"none", "error", "warn", "info", "debug"};

int xpyd_log_level_parse(const char *s)
{
    for (int i = 0; i < 5; i++)
        if (strcmp(s, level_names[i]) == 0)
            return i;
    return -1;
}

static void log_line(int level, const char *fmt, va_list ap)
{
    char line[2048];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ level=%s ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
                     level_names[level]);
    if (n > 0 && (size_t)n < sizeof line)
        vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    fprintf(stderr, "%s\n", line);
}

void xpyd_log(int level, const char *fmt, ...)
{
    if (level > xpyd_log_level || level <= XPYD_LOG_NONE)
        return;
    va_list ap;
    va_start(ap, fmt);
    log_line(level, fmt, ap);
    va_end(ap);
}

/* Printed whatever the level (under its own level name), unless logging is off. (It used to lower the global
 * level around an xpyd_log call: two threads doing so at once could leave the level at debug for good.) */
void xpyd_log_event(int level, const char *fmt, ...)
{
    if (xpyd_log_level <= XPYD_LOG_NONE)
        return;
    if (level < XPYD_LOG_ERROR || level > XPYD_LOG_DEBUG)
        level = XPYD_LOG_INFO;
    va_list ap;
    va_start(ap, fmt);
    log_line(level, fmt, ap);
    va_end(ap);
}

uint64_t xpyd_fnv64(uint64_t h, const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    return h;
}

static int name_char(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
           c == '_';
}

int xpyd_host_valid(const char *host)
{
    size_t n = host ? strlen(host) : 0;
    if (n == 0 || n > 255)
        return 0;
    if (strchr(host, ':')) { /* IPv6, perhaps with a zone */
        const char *c = host;
        for (; *c && *c != '%'; c++)
            if (!isxdigit((unsigned char)*c) && *c != ':' && *c != '.')
                return 0;
        if (*c == '%' && !c[1])
            return 0;
        for (c += *c == '%'; *c; c++)
            if (!name_char((unsigned char)*c))
                return 0;
        return 1;
    }
    for (const char *c = host; *c; c++)
        if (!name_char((unsigned char)*c))
            return 0;
    return 1;
}

int xpyd_parse_hostport(const char *s, char *host, size_t hostcap, int *port)
{
    const char *hs = s, *he, *colon = NULL;
    if (!s || !*s || hostcap == 0)
        return -EINVAL;
    if (*s == '[') {
        hs = s + 1;
        he = strchr(hs, ']');
        if (!he)
            return -EINVAL;
        if (he[1] == ':')
            colon = he + 1;
        else if (he[1] != '\0')
            return -EINVAL;
    } else {
        colon = strrchr(s, ':');
        if (colon && strchr(s, ':') != colon)
            return -EINVAL; /* bare IPv6 without brackets is ambiguous */
        he = colon ? colon : s + strlen(s);
    }
    size_t hl = (size_t)(he - hs);
    if (hl == 0 || hl >= hostcap)
        return -EINVAL;
    memcpy(host, hs, hl);
    host[hl] = '\0';
    if (!xpyd_host_valid(host))
        return -EINVAL;
    if (colon) {
        long p;
        if (xpyd_parse_long(colon + 1, 1, 65535, &p) != 0)
            return -EINVAL;
        *port = (int)p;
    }
    return 0;
}

const char *xpyd_hostport(const char *host, int port, char *buf, size_t cap)
{
    snprintf(buf, cap, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
    return buf;
}

char *xpyd_put_u64(char *p, uint64_t v)
{
    char tmp[20];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *p++ = tmp[--n];
    return p;
}

char *xpyd_put_hex64(char *p, uint64_t v)
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 15; i >= 0; i--, v >>= 4)
        p[i] = hex[v & 15];
    return p + 16;
}

int xpyd_parse_long(const char *s, long lo, long hi, long *out)
{
    if (!s || !*s)
        return -EINVAL;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end)
        return -EINVAL;
    if (v < lo || v > hi)
        return -ERANGE;
    *out = v;
    return 0;
}

int xpyd_parse_double(const char *s, double lo, double hi, double *out)
{
    if (!s || !*s)
        return -EINVAL;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end)
        return -EINVAL;
    if (!(v >= lo && v <= hi))
        return -ERANGE;
    *out = v;
    return 0;
}

void *xpyd_check_alloc(void *p)
{
    if (!p) {
        fprintf(stderr, "xpyd: out of memory\n");
        abort();
    }
    return p;
}

char *xpyd_bytes_room(struct xpyd_bytes *b, size_t n)
{
    if (n > SIZE_MAX / 2 - b->len)
        xpyd_check_alloc(NULL);
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 512;
        while (cap < b->len + n)
            cap *= 2;
        b->p = xpyd_check_alloc(realloc(b->p, cap));
        b->cap = cap;
    }
    return b->p + b->len;
}

void xpyd_bytes_reset(struct xpyd_bytes *b, size_t keep)
{
    b->len = 0;
    if (b->cap > keep) {
        free(b->p);
        b->p = NULL;
        b->cap = 0;
    }
}

void xpyd_bytes_add(struct xpyd_bytes *b, const void *data, size_t n)
{
    if (n) {
        memcpy(xpyd_bytes_room(b, n), data, n);
        b->len += n;
    }
}

void xpyd_tcp_nodelay(int fd)
{
    int one = 1;
    if (fd >= 0)
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

long xpyd_raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return -1;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    return (long)rl.rlim_cur;
}
