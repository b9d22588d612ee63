/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_reply.h - complete HTTP answers for xpyd's libevhtp servers (router, simulator); see xpyd_reply.c. */
#ifndef XPYD_REPLY_H
#define XPYD_REPLY_H

#include <stddef.h>

struct evhtp_request;
struct evbuffer;

/* The standard reason phrase of status. */
const char *xpyd_status_reason(int status);
/* A whole answer (the request's headers_out are written too; HEAD: headers only). */
/* ctype NULL: no Content-Type (an answer without a body) */
void xpyd_reply(struct evhtp_request *req, int status, const char *ctype, const char *body, size_t len);
/* The same answer added to out (a buffer the caller writes), instead of the connection's output. */
void xpyd_reply_to(struct evhtp_request *req, struct evbuffer *out, int status, const char *ctype, const char *body,
                   size_t len);
void xpyd_reply_buffer(struct evhtp_request *req, int status, const char *ctype, struct evbuffer *body);
/* An error in OpenAI's shape. */
void xpyd_reply_error(struct evhtp_request *req, int status, const char *msg);
/* 1 when the request's method is in allow ("GET, HEAD"), else answers 405 with Allow and returns 0. */
int xpyd_method_allowed(struct evhtp_request *req, const char *allow);
/* The connection closes once this request's answer is sent (xpyd_reply writes "Connection: close"). */
void xpyd_close_after_reply(struct evhtp_request *req);
/* 1 when an Authorization header value is "Bearer <key>" (constant time in the key's length). */
int xpyd_bearer_value_ok(const char *authorization, const char *key);

#endif
