/* SPDX-License-Identifier: Apache-2.0 */
/* loopguard.h - the router never becomes its own engine. An engine address that is one of the router's own
 * listeners is refused wherever engines come from (start-up, SIGHUP reload, admin API, etcd); and every request
 * the router sends an engine carries its hop id in X-Xpyd-Via, so a loop through other routers (two that list
 * each other, a router behind a NAT address) ends where it first comes back: 508 in OpenAI's error shape. */
#ifndef XPYD_LOOPGUARD_H
#define XPYD_LOOPGUARD_H

#include <stddef.h>
#include <sys/socket.h>

struct evhtp_request;

#define RT_VIA_HEADER "X-Xpyd-Via"

/* This process's hop id ("xpyd-" and 16 hex digits, random at start). */
const char *rt_loop_id(void);
/* The listeners, once bound (host as configured, the bound port). Before this no address is "self". */
void rt_loop_listener(const char *host, int port);
/* 1 when sa (an engine's resolved address) is one of this router's listeners: the same address and port, or a
 * local address (loopback, an interface's) on the port of a wildcard listener. */
int rt_loop_is_self(const struct sockaddr *sa, socklen_t len);
/* An incoming request that may be forwarded to engines: 0, with the X-Xpyd-Via line this router sends on
 * ("X-Xpyd-Via: <hops so far>, <own id>\r\n") written into out; or, when the request already passed through
 * this router or through --max-hops routers, -1 after answering 508. */
int rt_loop_check(struct evhtp_request *req, char *out, size_t cap);

#endif
