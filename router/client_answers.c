/* SPDX-License-Identifier: Apache-2.0 */
/* client_answers.c - what the client connection guard (client_conn.c) answers itself, without a route: over
 * --max-connections, a body over --max-body-bytes or over the body memory, `OPTIONS *`, and a TLS handshake that
 * failed (plain HTTP sent to the TLS port gets a plain 400; every failure is counted, one log line per peer). */
#include "client_answers.h"

#include "access_log.h"
#include "router.h"
#include "xpyd_reply.h"
#include "xpyd_tls.h"
#include "xpyd_util.h"

#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <evhtp/evhtp.h>
#include <openssl/err.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

void rt_answer_over_capacity(evhtp_request_t *req, void *arg)
{
    evhtp_headers_add_header(req->headers_out, evhtp_header_new("Retry-After", "1", 0, 0));
    xpyd_close_after_reply(req);
    xpyd_reply_error(req, 503, "the router is at --max-connections; retry later");
}

void rt_answer_too_large(evhtp_request_t *req, void *arg)
{
    char msg[160];
    snprintf(msg, sizeof msg, "request body exceeds the limit of %ld bytes (--max-body-bytes)", g_rt->cfg.max_body_bytes);
    xpyd_reply_error(req, 413, msg);
}

void rt_answer_body_memory(evhtp_request_t *req, void *arg)
{
    char msg[200];
    snprintf(msg, sizeof msg, "the router holds as many request body bytes as it may (--max-body-memory-bytes %ld); "
                              "retry shortly", g_rt->cfg.max_body_memory_bytes);
    evhtp_headers_add_header(req->headers_out, evhtp_header_new("Retry-After", "1", 0, 0));
    xpyd_reply_error(req, 503, msg);
}

/* "OPTIONS *": what the router as a whole answers to (HAProxy's and other front ends' health checks send it).
 * The answer is a 200 with no body, the connection kept as the client asked. */
void rt_answer_asterisk(evhtp_request_t *req, void *arg)
{
    evhtp_headers_add_header(req->headers_out, evhtp_header_new("Allow", "GET, HEAD, POST, PUT, DELETE", 0, 0));
    xpyd_reply(req, 200, NULL, NULL, 0);
}

/* Peers whose failed handshake was logged, so a client retrying in a loop is one line (a small table of
 * address hashes; a collision only skips a line). The counter counts every failure. */
static atomic_uint_fast64_t tls_logged[256];

void rt_client_tls_failed(evhtp_connection_t *c, struct bufferevent *bev)
{
    char why[300] = "", one[256];
    unsigned long e, first = 0;
    while ((e = bufferevent_get_openssl_error(bev)) != 0) {
        if (!first)
            first = e;
        ERR_error_string_n(e, one, sizeof one);
        const char *r = strrchr(one, ':');
        size_t n = strlen(why);
        snprintf(why + n, sizeof why - n, "%s%s", n ? "; " : "", r ? r + 1 : one);
    }
    if (!first)
        return; /* connected and closed without a word: a TCP check, not a failed handshake */
    atomic_fetch_add(&g_rt->ctr.tls_handshake_failures[0], 1);
    if (xpyd_tls_is_plain_http(first)) { /* plain HTTP sent to the TLS port: say so, in plain HTTP, and close */
        static const char body[] = "{\"error\":{\"message\":\"this port speaks HTTPS: use https:// (plain HTTP "
                                   "was sent to a TLS listener)\",\"type\":\"BadRequestError\",\"param\":null,"
                                   "\"code\":400}}";
        char msg[512];
        int n = snprintf(msg, sizeof msg, "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
                                          "Content-Length: %zu\r\nConnection: close\r\n\r\n%s", sizeof body - 1, body);
        if (n > 0 && send(c->sock, msg, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
            (void)0; /* best effort: the connection closes either way */
    }
    char peer[128];
    rt_client_addr_of(c, peer, sizeof peer);
    char *colon = strrchr(peer, ':'); /* one line per address, whatever its port */
    if (colon)
        *colon = '\0';
    uint64_t h = xpyd_fnv64(XPYD_FNV_INIT, peer, strlen(peer));
    if (atomic_exchange(&tls_logged[h & 255], h) != h)
        xpyd_log_event(XPYD_LOG_WARN, "event=tls_handshake_failed side=client peer=%s reason=\"%s\"", peer, why);
}
