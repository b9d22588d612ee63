/* xt_wire.c - frames over blocking TCP sockets, and the target side: one thread per peer connection that
 * checks every range against the registered buffers and moves bytes straight between the socket and the
 * registered memory (no staging copy). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "xt_internal.h"

#include <endian.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <fcntl.h>
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

/* ---------- target side ---------- */

static int reply(int fd, uint32_t type, uint64_t seq, int status, const void *payload, uint32_t len)
{
    struct xt_hdr h = {XT_MAGIC, len, type, status, seq, 0, 0};
    int rc = xt_send_hdr(fd, &h);
    if (!rc && len)
        rc = xt_send_all(fd, payload, len);
    return rc;
}

/* Reads and drops n payload bytes (a refused WRITE still has to be consumed to keep the stream framed). */
static int discard(int fd, size_t n)
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

void *xt_serve_conn(void *arg)
{
    struct xt_served *sv = arg;
    xt_engine *e = sv->e;
    int fd = sv->fd;
    size_t cap = e->cfg.max_frame_bytes;
    struct xt_hdr h;
    int rc;
    while ((rc = xt_recv_hdr(fd, &h, cap)) == 0) {
        switch (h.type) {
        case XF_HELLO:
        case XF_PROBE: {
            if ((rc = discard(fd, h.len)) != 0)
                goto out;
            if (h.type == XF_PROBE) {
                rc = reply(fd, XF_ACK, h.seq, 0, NULL, 0);
                break;
            }
            char *desc = malloc(65536);
            int n = desc ? xt_describe(e, desc, 65536) : -ENOMEM;
            rc = reply(fd, XF_HELLO_ACK, h.seq, n < 0 ? n : 0, desc, n < 0 ? 0 : (uint32_t)n);
            free(desc);
            break;
        }
        case XF_READ: {
            if (h.len != 0) {
                rc = -EPROTO;
                goto out;
            }
            pthread_rwlock_rdlock(&e->reg_lock); /* held while the bytes leave: no unregister under us */
            int ok = h.size <= cap && xt_range_ok(e, h.addr, h.size);
            int st = ok ? 0 : h.size > cap ? -EMSGSIZE : -EFAULT;
            struct xt_hdr d = {XT_MAGIC, ok ? (uint32_t)h.size : 0, XF_DATA, st, h.seq, h.addr, h.size};
            rc = xt_send_hdr(fd, &d);
            if (!rc && ok)
                rc = xt_send_all(fd, (const void *)(uintptr_t)h.addr, h.size);
            pthread_rwlock_unlock(&e->reg_lock);
            if (!rc && ok)
                atomic_fetch_add(&e->bytes_served, h.size);
            break;
        }
        case XF_WRITE: {
            pthread_rwlock_rdlock(&e->reg_lock);
            int ok = h.size == h.len && xt_range_ok(e, h.addr, h.size);
            /* straight into the registered buffer, only after the range was checked */
            rc = ok ? xt_recv_all(fd, (void *)(uintptr_t)h.addr, h.len) : discard(fd, h.len);
            pthread_rwlock_unlock(&e->reg_lock);
            if (rc)
                goto out;
            if (ok)
                atomic_fetch_add(&e->bytes_served, h.size);
            else
                xt_log_error(e, "refused a WRITE outside the registered buffers", -EFAULT);
            rc = reply(fd, XF_ACK, h.seq, ok ? 0 : -EFAULT, NULL, 0); /* acked once applied */
            break;
        }
        case XF_QP: {
            char qbuf[256];
            if (h.len > sizeof qbuf) {
                rc = -EMSGSIZE;
                goto out;
            }
            if ((rc = xt_recv_all(fd, qbuf, h.len)) != 0)
                goto out;
            rc = xt_rdma_serve_qp(e, sv, &h, qbuf);
            break;
        }
        case XF_NOTIFY: {
            char buf[sizeof(struct xt_notify)];
            if (h.len > sizeof buf) {
                rc = -EMSGSIZE;
                goto out;
            }
            if ((rc = xt_recv_all(fd, buf, h.len)) != 0)
                goto out;
            struct xt_notify nt;
            memset(&nt, 0, sizeof nt);
            size_t nl = strnlen(buf, h.len);
            snprintf(nt.name, sizeof nt.name, "%.*s", (int)(nl < sizeof nt.name ? nl : sizeof nt.name - 1), buf);
            if (nl < h.len)
                snprintf(nt.msg, sizeof nt.msg, "%.*s", (int)(h.len - nl - 1), buf + nl + 1);
            pthread_mutex_lock(&e->n_mu);
            int status = 0;
            if (e->nnotes == e->capnotes) {
                size_t nc = e->capnotes ? e->capnotes * 2 : 16;
                struct xt_notify *nn = nc <= 65536 ? realloc(e->notes, nc * sizeof *nn) : NULL;
                if (nn) {
                    e->notes = nn;
                    e->capnotes = nc;
                } else {
                    status = -ENOBUFS; /* bounded: 65,536 unread notifications */
                }
            }
            if (!status)
                e->notes[e->nnotes++] = nt;
            pthread_mutex_unlock(&e->n_mu);
            if (!status)
                xt_wake(e);
            rc = reply(fd, XF_ACK, h.seq, status, NULL, 0);
            break;
        }
        default:
            rc = -EPROTO;
            goto out;
        }
        if (rc)
            break;
    }
out:
    if (rc && rc != -ECONNRESET && !atomic_load(&e->stopping))
        xt_log_error(e, "serving a peer", rc);
    shutdown(fd, SHUT_RDWR);
    xt_rdma_served_close(sv); /* the peer's QPs go with its control connection */
    sv->done = 1;
    return NULL;
}
