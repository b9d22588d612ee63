/* SPDX-License-Identifier: Apache-2.0 */
/* xt_frame.c - the frame format on the wire: a fixed header then `len` payload bytes, over blocking TCP
 * sockets with timeouts; connecting to a peer. A leaf: every other transfer file uses it. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "xt_internal.h"

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int xt_send_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 ? (errno == EAGAIN ? -ETIMEDOUT : -errno) : -EPIPE;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int xt_recv_all(int fd, void *buf, size_t n)
{
    char *p = buf;
    while (n > 0) {
        ssize_t r = recv(fd, p, n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return errno == EAGAIN ? -ETIMEDOUT : -errno;
        if (r == 0)
            return -ECONNRESET; /* the peer went away mid-frame */
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

int xt_send_hdr(int fd, const struct xt_hdr *h)
{
    struct xt_hdr w = {htole32(XT_MAGIC), htole32(h->len), htole32(h->type), (int32_t)htole32((uint32_t)h->status),
                       htole64(h->seq), htole64(h->addr), htole64(h->size)};
    return xt_send_all(fd, &w, sizeof w);
}

int xt_recv_hdr(int fd, struct xt_hdr *h, size_t max_len)
{
    struct xt_hdr r;
    int rc = xt_recv_all(fd, &r, sizeof r);
    if (rc)
        return rc;
    h->magic = le32toh(r.magic);
    h->len = le32toh(r.len);
    h->type = le32toh(r.type);
    h->status = (int32_t)le32toh((uint32_t)r.status);
    h->seq = le64toh(r.seq);
    h->addr = le64toh(r.addr);
    h->size = le64toh(r.size);
    if (h->magic != XT_MAGIC || h->type < XF_HELLO || h->type > XF_QP)
        return -EPROTO;
    if (h->len > max_len)
        return -EMSGSIZE; /* size-capped: a peer cannot make us buffer or stream more than a frame's worth */
    return 0;
}

void xt_set_timeouts(int fd, int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int xt_connect(const char *host, int port, int timeout_ms)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    if (getaddrinfo(host, ps, &hints, &res) != 0 || !res)
        return -EHOSTUNREACH;
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        freeaddrinfo(res);
        return -errno;
    }
    int rc = connect(fd, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    if (rc < 0 && errno != EINPROGRESS) {
        rc = -errno;
        close(fd);
        return rc;
    }
    if (rc < 0) {
        struct pollfd p = {fd, POLLOUT, 0};
        int err = 0;
        socklen_t el = sizeof err;
        rc = poll(&p, 1, timeout_ms);
        if (rc <= 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0 || err) {
            close(fd);
            return rc == 0 ? -ETIMEDOUT : err ? -err : -ECONNREFUSED;
        }
    }
    int fl = fcntl(fd, F_GETFL); /* blocking from here on, bounded by SO_RCVTIMEO/SO_SNDTIMEO */
    fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    xt_set_timeouts(fd, timeout_ms);
    return fd;
}

int xt_frame_reply(int fd, uint32_t type, uint64_t seq, int status, const void *payload, uint32_t len)
{
    struct xt_hdr h = {XT_MAGIC, len, type, status, seq, 0, 0};
    int rc = xt_send_hdr(fd, &h);
    if (!rc && len)
        rc = xt_send_all(fd, payload, len);
    return rc;
}

/* Reads and drops n payload bytes (a refused WRITE still has to be consumed to keep the stream framed). */
int xt_frame_discard(int fd, size_t n)
{
    char buf[16384];
    while (n > 0) {
        size_t k = n < sizeof buf ? n : sizeof buf;
        int rc = xt_recv_all(fd, buf, k);
        if (rc)
            return rc;
        n -= k;
    }
    return 0;
}

