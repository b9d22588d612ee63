/* SPDX-License-Identifier: Apache-2.0 */
/* client_answers.h - the answers the client connection guard gives itself (client_answers.c): libevhtp request
 * callbacks (req->cb) and a failed TLS handshake's handling. */
#ifndef XPYD_CLIENT_ANSWERS_H
#define XPYD_CLIENT_ANSWERS_H

#include <evhtp/evhtp.h>

struct bufferevent;

/* 503 + Retry-After, and the connection closes: the router is at --max-connections. */
void rt_answer_over_capacity(evhtp_request_t *req, void *arg);
/* 413: the body is over --max-body-bytes (read and discarded). */
void rt_answer_too_large(evhtp_request_t *req, void *arg);
/* 503 + Retry-After: the bodies held at once are at --max-body-memory-bytes. */
void rt_answer_body_memory(evhtp_request_t *req, void *arg);
/* "OPTIONS *": 200 with Allow, no body. */
void rt_answer_asterisk(evhtp_request_t *req, void *arg);
/* A client's TLS handshake failed on connection c: counted, logged once per peer address; plain HTTP sent to the
 * TLS port is answered with a plain 400 before the connection closes. */
void rt_client_tls_failed(evhtp_connection_t *c, struct bufferevent *bev);

#endif
