/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_reply.c - complete HTTP answers written by xpyd's servers (the router and the simulator), not by
 * libevhtp's evhtp_send_reply, so that they control the status line and framing: the reason phrase is the
 * standard one for every status (libevhtp's table says "UNKNOWN" for 429 and others), HEAD answers carry the
 * headers of the GET answer and no body, and "Connection: close" is written exactly when the connection will
 * close. What libevhtp needs afterwards is what evhtp_send_reply does: the request is marked finished and the
 * bytes are queued on the connection's bufferevent; libevhtp's write callback then ends the request
 * (keep-alive or close). Also the bearer-token comparison both servers' keys use. */
#include "xpyd_reply.h"

#include "xpyd_oai.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <evhtp/evhtp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const char *xpyd_status_reason(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    case 507: return "Insufficient Storage";
    case 508: return "Loop Detected";
    default:
        return status < 200 ? "Informational" : status < 300 ? "Success" : status < 400 ? "Redirection"
               : status < 500 ? "Client Error" : "Server Error";
    }
}

static int add_out_header(evhtp_kv_t *kv, void *arg)
{
    struct evbuffer *b = arg;
    if (!kv->key || !kv->val || !strcasecmp(kv->key, "Content-Length") || !strcasecmp(kv->key, "Content-Type") ||
        !strcasecmp(kv->key, "Connection") || !strcasecmp(kv->key, "Transfer-Encoding"))
        return 0;
    evbuffer_add_printf(b, "%s: %s\r\n", kv->key, kv->val);
    return 0;
}

void xpyd_reply(evhtp_request_t *req, int status, const char *ctype, const char *body, size_t len)
{
    struct bufferevent *bev = req->conn ? req->conn->bev : NULL;
    if (bev)
        xpyd_reply_to(req, bufferevent_get_output(bev), status, ctype, body, len);
}

void xpyd_reply_to(evhtp_request_t *req, struct evbuffer *out, int status, const char *ctype, const char *body,
                   size_t len)
{
    int v10 = req->proto == EVHTP_PROTO_10;
    int keep = (req->flags & EVHTP_REQ_FLAG_KEEPALIVE) != 0;
    struct evbuffer *b = evbuffer_new();
    if (!b)
        abort();
    evbuffer_add_printf(b, "HTTP/1.%d %d %s\r\n", v10 ? 0 : 1, status, xpyd_status_reason(status));
    evhtp_headers_for_each(req->headers_out, add_out_header, b);
    if (ctype) /* NULL: no body to type */
        evbuffer_add_printf(b, "Content-Type: %s\r\n", ctype);
    evbuffer_add_printf(b, "Content-Length: %zu\r\n", len);
    if (!keep)
        evbuffer_add_printf(b, "Connection: close\r\n");
    else if (v10)
        evbuffer_add_printf(b, "Connection: keep-alive\r\n");
    evbuffer_add(b, "\r\n", 2);
    if (req->method != htp_method_HEAD && len)
        evbuffer_add(b, body, len);
    req->flags |= EVHTP_REQ_FLAG_FINISHED;
    evbuffer_add_buffer(out, b);
    evbuffer_free(b);
}

void xpyd_reply_error(evhtp_request_t *req, int status, const char *msg)
{
    char *body = xpyd_oai_error_json(status, NULL, msg, NULL);
    xpyd_reply(req, status, "application/json", body, strlen(body));
    free(body);
}

void xpyd_reply_buffer(evhtp_request_t *req, int status, const char *ctype, struct evbuffer *body)
{
    size_t n = body ? evbuffer_get_length(body) : 0;
    xpyd_reply(req, status, ctype, n ? (const char *)evbuffer_pullup(body, -1) : "", n);
}

int xpyd_method_allowed(evhtp_request_t *req, const char *allow)
{
    const char *m = htparser_get_methodstr_m(req->method);
    size_t ml = m ? strlen(m) : 0;
    for (const char *p = allow; m && *p;) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == ml && !strncmp(p, m, n))
            return 1;
        p += n;
        while (*p == ',' || *p == ' ')
            p++;
    }
    evhtp_headers_add_header(req->headers_out, evhtp_header_new("Allow", allow, 0, 1));
    char msg[160];
    snprintf(msg, sizeof msg, "Method Not Allowed: use %s", allow);
    xpyd_reply_error(req, 405, msg);
    return 0;
}

/* libevhtp 1.2.18's evhtp_request_set_keepalive(req, 0) does not clear the flag; clearing it directly makes
 * xpyd_reply write "Connection: close" and libevhtp close the connection once the answer is sent. */
void xpyd_close_after_reply(evhtp_request_t *req)
{
    req->flags &= (uint16_t)~EVHTP_REQ_FLAG_KEEPALIVE;
}

int xpyd_bearer_value_ok(const char *h, const char *key)
{
    const char *got = h && strncasecmp(h, "Bearer ", 7) == 0 ? h + 7 : "";
    size_t kl = strlen(key), gl = strlen(got);
    unsigned diff = (unsigned)(kl ^ gl);
    for (size_t i = 0; i < kl; i++) /* constant time in the key's length, whatever was sent */
        diff |= (unsigned char)key[i] ^ (unsigned char)(i < gl ? got[i] : 0);
    return diff == 0;
}

