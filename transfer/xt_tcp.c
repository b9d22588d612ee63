/* SPDX-License-Identifier: Apache-2.0 */
/* xt_tcp.c - the tcp transport: slices as frames over the worker's own persistent connection to the peer,
 * pipelined (requests back to back, answers read in order). Also the connections every transport's control
 * traffic uses. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "xt_internal.h"

#include <errno.h>
#include <unistd.h>

/* The worker's connection to the segment's peer, made on first use. */
int xt_conn_fd(xt_engine *e, struct xt_seg *sg, int slot)
{
    struct xt_conn *c = &sg->conns[slot];
    if (c->fd < 0)
        c->fd = xt_connect(sg->host, sg->port, e->cfg.io_timeout_ms);
    return c->fd;
}

void xt_conn_drop(struct xt_seg *sg, int slot)
{
    if (sg->conns[slot].fd >= 0) {
        close(sg->conns[slot].fd);
        sg->conns[slot].fd = -1;
    }
}

static int do_slice_once(xt_engine *e, struct xt_seg *sg, int slot, const struct xt_slice *sl)
{
    int fd = xt_conn_fd(e, sg, slot);
    if (fd < 0)
        return fd;
    struct xt_hdr h = {XT_MAGIC, sl->opcode == XT_WRITE ? (uint32_t)sl->len : 0,
                       sl->opcode == XT_WRITE ? XF_WRITE : XF_READ, 0, 0, sl->remote, sl->len};
    int rc = xt_send_hdr(fd, &h);
    if (!rc && sl->opcode == XT_WRITE)
        rc = xt_send_all(fd, sl->local, sl->len);
    struct xt_hdr a;
    if (!rc)
        rc = xt_recv_hdr(fd, &a, e->cfg.max_frame_bytes);
    if (rc)
        return rc;
    if (a.type != (sl->opcode == XT_WRITE ? XF_ACK : XF_DATA))
        return -EPROTO;
    if (a.status)
        return a.status < 0 ? a.status : -EPROTO; /* e.g. -EFAULT: outside the peer's buffers; frame done */
    if (sl->opcode == XT_READ) {
        if (a.len != sl->len)
            return -EPROTO;
        rc = xt_recv_all(fd, sl->local, sl->len);
    }
    return rc;
}

/* tcp: sends every slice's request (and WRITE payload) back to back, then reads the answers in order, so the
 * connection never idles waiting for an ack (the target serves one connection in order). rcs[i] gets each
 * slice's result; a slice whose answer did not arrive is retried alone on a fresh connection. */
static void tcp_slices(xt_engine *e, struct xt_seg *sg, int slot, struct xt_slice **sls, int n, int *rcs)
{
    int fd = xt_conn_fd(e, sg, slot), sent = 0, done = 0, rc = fd < 0 ? fd : 0;
    for (; !rc && sent < n; sent++) {
        const struct xt_slice *sl = sls[sent];
        struct xt_hdr h = {XT_MAGIC, sl->opcode == XT_WRITE ? (uint32_t)sl->len : 0,
                           sl->opcode == XT_WRITE ? XF_WRITE : XF_READ, 0, (uint64_t)sent, sl->remote, sl->len};
        rc = xt_send_hdr(fd, &h);
        if (!rc && sl->opcode == XT_WRITE)
            rc = xt_send_all(fd, sl->local, sl->len);
    }
    for (; !rc && done < sent; done++) {
        const struct xt_slice *sl = sls[done];
        struct xt_hdr a;
        rc = xt_recv_hdr(fd, &a, e->cfg.max_frame_bytes);
        if (!rc && (a.type != (sl->opcode == XT_WRITE ? XF_ACK : XF_DATA) || a.seq != (uint64_t)done))
            rc = -EPROTO;
        if (rc)
            break;
        if (a.status) {
            rcs[done] = a.status < 0 ? a.status : -EPROTO; /* e.g. -EFAULT: the frame is complete, go on */
            continue;
        }
        if (sl->opcode == XT_READ && a.len != sl->len) {
            rc = -EPROTO;
            break;
        }
        rcs[done] = sl->opcode == XT_READ ? xt_recv_all(fd, sl->local, sl->len) : 0;
        if (rcs[done]) {
            rc = rcs[done];
            break;
        }
    }
    if (done == n)
        return;
    xt_conn_drop(sg, slot); /* the connection is suspect: each unanswered slice once more on a fresh one */
    for (int i = done; i < n; i++) {
        rcs[i] = do_slice_once(e, sg, slot, sls[i]);
        if (rcs[i] && rcs[i] != -EFAULT)
            xt_conn_drop(sg, slot);
    }
}

/* The tcp transport copies with the CPU: GPU memory (recognised by the CUDA driver, when one is installed)
 * is refused at registration with -EFAULT instead of faulting at the first transfer. */
static int tcp_reg(xt_engine *e, struct xt_region *r)
{
    return xt_is_device_memory((const void *)r->addr) ? -EFAULT : 0;
}

const struct xt_transport_ops xt_transport_tcp = {
    .name = "tcp",
    .reg = tcp_reg,
    .slices = tcp_slices,
};
