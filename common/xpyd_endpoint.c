/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_endpoint.c - an engine's address resolved once (up_endpoint_resolve) and the request line every request to
 * it starts with (see xpyd_http_client.h). */
#include "xpyd_http_client.h"

#include "xpyd_util.h"

#include <errno.h>
#include <event2/buffer.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

int up_endpoint_resolve(struct up_endpoint *ep, const char *host, int port)
{
    /* host may be ep->host itself (etcd_url_parse fills it first): copied before ep is written, since an
     * snprintf from a buffer into itself is undefined (glibc left it empty, and the empty name turned the
     * TLS name check off: SSL_set1_host(ssl, "")) */
    char name[sizeof ep->host];
    if (!host || strlen(host) >= sizeof name)
        return -EINVAL;
    memcpy(name, host, strlen(host) + 1);
    host = name;
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    if (getaddrinfo(host, ps, &hints, &res) != 0 || !res)
        return -EINVAL;
    memcpy(&ep->addr, res->ai_addr, res->ai_addrlen);
    ep->addrlen = (socklen_t)res->ai_addrlen;
    freeaddrinfo(res);
    snprintf(ep->host, sizeof ep->host, "%s", host);
    ep->port = port;
    xpyd_hostport(ep->host, port, ep->hostport, sizeof ep->hostport);
    return 0;
}

void up_request_line(struct evbuffer *b, const struct up_endpoint *ep, const char *method, const char *path)
{
    evbuffer_add(b, method, strlen(method)); /* pieces, without printf: this runs for every request */
    evbuffer_add(b, " ", 1);
    evbuffer_add(b, path, strlen(path));
    evbuffer_add(b, " HTTP/1.1\r\nHost: ", 17);
    evbuffer_add(b, ep->hostport, strlen(ep->hostport));
    evbuffer_add(b, "\r\n", 2);
}
