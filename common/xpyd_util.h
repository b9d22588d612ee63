/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_util.h - small shared helpers: clocks, logging, hashing, host:port parsing. */
#ifndef XPYD_UTIL_H
#define XPYD_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Monotonic clock in microseconds. Any thread. */
uint64_t xpyd_now_us(void);
/* Wall clock in seconds since the epoch. Any thread. */
int64_t xpyd_wall_s(void);

enum xpyd_log_level { XPYD_LOG_NONE = 0, XPYD_LOG_ERROR, XPYD_LOG_WARN, XPYD_LOG_INFO, XPYD_LOG_DEBUG };
/* set at start-up and on a reload, read by every thread: atomic (a plain load on x86) */
extern _Atomic int xpyd_log_level;
/* Writes one line to stderr: "ts=... level=... <msg>". Any thread. */
void xpyd_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The level is tested before the call, so a line below --log-level costs one comparison (the request path
 * logs its state transitions at debug). */
#define XLOG_AT(lvl, ...)                   \
    do {                                    \
        if ((lvl) <= xpyd_log_level)        \
            xpyd_log((lvl), __VA_ARGS__);   \
    } while (0)
#define XLOG_ERR(...) XLOG_AT(XPYD_LOG_ERROR, __VA_ARGS__)
#define XLOG_WARN(...) XLOG_AT(XPYD_LOG_WARN, __VA_ARGS__)
#define XLOG_INFO(...) XLOG_AT(XPYD_LOG_INFO, __VA_ARGS__)
#define XLOG_DEBUG(...) XLOG_AT(XPYD_LOG_DEBUG, __VA_ARGS__)

/* A structured event line (health transitions, reloads, failures, ...): written whatever --log-level (unless
 * none), so operators always see what happened, but tagged with its true level (info for routine events,
 * warn for degradations, error for failures), so alerts on level=error see only errors. */
void xpyd_log_event(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Parses a log level name (error|warn|info|debug); returns -1 when unknown. */
int xpyd_log_level_parse(const char *s);

/* FNV-1a 64-bit over bytes, chained from h (start with XPYD_FNV_INIT). */
#define XPYD_FNV_INIT 14695981039346656037ULL
uint64_t xpyd_fnv64(uint64_t h, const void *data, size_t len);
/* SplitMix64 step: a good 64-bit mixer for deterministic pseudo-random streams (inline: the simulator's KV
 * bytes call it once per 8 bytes). */
static inline uint64_t xpyd_mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Parses "host:port", "[v6]:port" or "host" (port left as is) into host (NUL-terminated, without
 * brackets, at most hostcap-1 bytes) and *port. Returns 0, or -EINVAL on a malformed string or a host that
 * xpyd_host_valid refuses. */
int xpyd_parse_hostport(const char *s, char *host, size_t hostcap, int *port);
/* 1 when host can name an engine: 1-255 bytes of a DNS name or an IPv4 address (letters, digits, '.', '-', '_')
 * or an IPv6 address (hex digits, ':', '.', with a "%zone" of those name characters). Nothing else resolves, and
 * a host is written into Host headers, logs and JSON: spaces, quotes, control bytes, non-ASCII are refused. */
int xpyd_host_valid(const char *host);

/* Formats host:port for messages, labels and Host headers, bracketing IPv6 addresses ([::1]:8100).
 * Returns buf. */
const char *xpyd_hostport(const char *host, int port, char *buf, size_t cap);

/* Formatting on the request path without printf (a vfprintf call costs more than the rest of a header line):
 * v in decimal, or in 16 lower-case hex digits, at p (room for 20 / 16 bytes, no NUL); return the end. */
char *xpyd_put_u64(char *p, uint64_t v);
char *xpyd_put_hex64(char *p, uint64_t v);

/* Strict integer parsing: the whole string must be a number in [lo, hi]. 0 or -EINVAL/-ERANGE. */
int xpyd_parse_long(const char *s, long lo, long hi, long *out);
int xpyd_parse_double(const char *s, double lo, double hi, double *out);

/* Sets TCP_NODELAY on a connected TCP socket (streams are many small writes). Ignores errors. */
void xpyd_tcp_nodelay(int fd);

/* Raises the soft open-files limit to the hard limit (servers hold many sockets). Returns the new soft limit. */
long xpyd_raise_nofile(void);

/* Out-of-memory policy for executables: print and abort. Returns p otherwise. */
void *xpyd_check_alloc(void *p);
#define XPYD_XALLOC(p) xpyd_check_alloc(p)

/* A growable byte array that keeps its room between uses (len = 0 empties it): for bytes written and consumed
 * over and over, where an evbuffer would allocate and free a chain each time. Out of memory aborts
 * (xpyd_check_alloc). {0} is an empty one; free(b->p) when done. */
struct xpyd_bytes {
    char *p;
    size_t len, cap;
};
/* Room for n more bytes at b->p + b->len (the caller then adds n to b->len); the first room is 512 bytes. */
char *xpyd_bytes_room(struct xpyd_bytes *b, size_t n);
void xpyd_bytes_add(struct xpyd_bytes *b, const void *data, size_t n);
/* Empties b, keeping its room when it is at most keep bytes (a rare large use does not stay held). */
void xpyd_bytes_reset(struct xpyd_bytes *b, size_t keep);

#endif
