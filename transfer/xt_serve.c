/* SPDX-License-Identifier: Apache-2.0 */
/* xt_serve.c - the target side: the listener and one thread per peer connection, which checks every range
 * against the registered buffers and moves bytes straight between the socket and the registered memory (no
 * staging copy); QP handshakes go to the transport (rdma). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "xt_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void *serve_conn(void *arg)
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
            if ((rc = xt_frame_discard(fd, h.len)) != 0)
                goto out;
            if (h.type == XF_PROBE) {
                rc = xt_frame_reply(fd, XF_ACK, h.seq, 0, NULL, 0);
                break;
            }
            char *desc = malloc(65536);
            int n = desc ? xt_describe(e, desc, 65536) : -ENOMEM;
            rc = xt_frame_reply(fd, XF_HELLO_ACK, h.seq, n < 0 ? n : 0, desc, n < 0 ? 0 : (uint32_t)n);
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
            rc = ok ? xt_recv_all(fd, (void *)(uintptr_t)h.addr, h.len) : xt_frame_discard(fd, h.len);
            pthread_rwlock_unlock(&e->reg_lock);
            if (rc)
                goto out;
            if (ok)
                atomic_fetch_add(&e->bytes_served, h.size);
            else
                xt_log_error(e, "refused a WRITE outside the registered buffers", -EFAULT);
            rc = xt_frame_reply(fd, XF_ACK, h.seq, ok ? 0 : -EFAULT, NULL, 0); /* acked once applied */
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
            if (e->tp->serve_qp) {
                rc = e->tp->serve_qp(e, sv, &h, qbuf);
            } else { /* this side speaks tcp only */
                struct xt_hdr a = {XT_MAGIC, 0, XF_QP, -EPROTONOSUPPORT, h.seq, h.addr, 0};
                rc = xt_send_hdr(fd, &a);
            }
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
            rc = xt_frame_reply(fd, XF_ACK, h.seq, status, NULL, 0);
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
    if (e->tp->served_close)
        e->tp->served_close(sv); /* the peer's QPs go with its control connection */
    sv->done = 1;
    return NULL;
}

static void reap_served(xt_engine *e, int all)
{
    pthread_mutex_lock(&e->conns_mu);
    for (struct xt_served **pp = &e->served; *pp;) {
        struct xt_served *sv = *pp;
        if (all)
            shutdown(sv->fd, SHUT_RDWR);
        if (all || sv->done) {
            *pp = sv->next;
            pthread_mutex_unlock(&e->conns_mu);
            pthread_join(sv->th, NULL);
            close(sv->fd);
            free(sv);
            pthread_mutex_lock(&e->conns_mu);
        } else {
            pp = &sv->next;
        }
    }
    pthread_mutex_unlock(&e->conns_mu);
}

static void *accept_loop(void *arg)
{
    xt_engine *e = arg;
    struct pollfd p[2] = {{e->lfd, POLLIN, 0}, {e->wake[0], POLLIN, 0}};
    while (!atomic_load(&e->stopping)) {
        if (poll(p, 2, 1000) <= 0) {
            reap_served(e, 0);
            continue;
        }
        if (p[1].revents)
            break;
        int fd = accept4(e->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        struct timeval tv = {e->cfg.io_timeout_ms / 1000, (e->cfg.io_timeout_ms % 1000) * 1000};
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv); /* the next frame may be far off: no RCVTIMEO */
        int one = 1, idle = 5, intvl = 2, cnt = 3;       /* a vanished host is noticed in ~11 s */
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
        struct xt_served *sv = calloc(1, sizeof *sv);
        if (!sv) {
            close(fd);
            continue;
        }
        sv->e = e;
        sv->fd = fd;
        if (pthread_create(&sv->th, NULL, serve_conn, sv) != 0) {
            close(fd);
            free(sv);
            continue;
        }
        pthread_mutex_lock(&e->conns_mu);
        sv->next = e->served;
        e->served = sv;
        pthread_mutex_unlock(&e->conns_mu);
        reap_served(e, 0);
    }
    return NULL;
}

static int listen_on(xt_engine *e)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    memset(&ss, 0, sizeof ss);
    if (strchr(e->host, ':')) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)e->cfg.listen_port);
        if (inet_pton(AF_INET6, e->host, &a->sin6_addr) != 1)
            return -EINVAL;
        sl = sizeof *a;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)e->cfg.listen_port);
        if (inet_pton(AF_INET, e->host, &a->sin_addr) != 1)
            return -EINVAL;
        sl = sizeof *a;
    }
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd < 0)
        return -errno;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&ss, sl) < 0 || listen(fd, 128) < 0) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    e->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                             : ((struct sockaddr_in *)&ss)->sin_port);
    e->lfd = fd;
    return 0;
}

int xt_serve_start(xt_engine *e)
{
    int rc = listen_on(e);
    if (!rc && pipe2(e->wake, O_CLOEXEC) < 0)
        rc = -errno;
    if (!rc && pthread_create(&e->accept_th, NULL, accept_loop, e) != 0)
        rc = -EAGAIN;
    if (rc) {
        if (e->lfd >= 0)
            close(e->lfd);
        if (e->wake[0] >= 0) {
            close(e->wake[0]);
            close(e->wake[1]);
        }
        e->lfd = e->wake[0] = e->wake[1] = -1;
    }
    return rc;
}

void xt_serve_stop(xt_engine *e)
{
    if (write(e->wake[1], "x", 1) < 0) {
    }
    pthread_join(e->accept_th, NULL);
    reap_served(e, 1);
    close(e->lfd);
    close(e->wake[0]);
    close(e->wake[1]);
}
