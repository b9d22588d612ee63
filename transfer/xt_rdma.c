/* SPDX-License-Identifier: Apache-2.0 */
/* xt_rdma.c - the RDMA transport of libxpyd_transfer: libibverbs, RC queue pairs, one-sided READ/WRITE.
 *
 * Every device in use gets a protection domain and, per worker thread, a completion queue. Registered memory
 * is registered on every device (lkey/rkey per device, published in the descriptor). Opening a segment
 * creates, for every worker and every local NIC, an RC QP paired with one of the peer's NICs (local i with
 * peer i mod n); the QP numbers, PSNs, LIDs, GIDs and MTUs are exchanged over the control connection (frame
 * XF_QP), and the QP goes INIT -> RTR -> RTS with the minimum of both MTUs. A slice is one work request on
 * the worker's QP of the NIC pair chosen round robin (slices striped over NICs and QPs); the worker polls its
 * CQ for it. A remote access error fails the slice with -EFAULT (the request's fault: no retry) and the QP is
 * rebuilt before its next use; any other error marks that NIC pair down for the segment and the slice is
 * retried on another pair. The first error of each kind is logged. With no device, "auto" uses tcp. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "xt_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

struct xt_rqp { /* one RC QP of a segment: worker x local NIC */
    struct ibv_qp *qp;
    int nic, peer_nic;
    int broken;       /* rebuilt (new handshake) before its next use */
};

struct xt_rseg { /* the RDMA side of an opened segment */
    struct xt_rqp *qps;     /* [threads * nnics] */
    int down[XT_MAX_NICS];  /* NIC pair failed: not used any more for this segment */
    int peer_nics;
    struct { uint64_t addr, len; uint32_t rkey[XT_MAX_NICS]; } *bufs;
    size_t nbufs;
    uint32_t peer_mtu[XT_MAX_NICS];
};

static const char *wc_name(int st)
{
    return ibv_wc_status_str((enum ibv_wc_status)st);
}

static int mtu_bytes(enum ibv_mtu m)
{
    return m >= IBV_MTU_256 && m <= IBV_MTU_4096 ? 128 << m : 0;
}

/* GID: the configured index, else the first IPv4-mapped one (RoCEv2, routable), else the first non-zero. */
static int pick_gid(struct ibv_context *ctx, int want, union ibv_gid *gid)
{
    if (want >= 0)
        return ibv_query_gid(ctx, 1, want, gid) == 0 ? want : -1;
    int first = -1;
    for (int i = 0; i < 16; i++) {
        union ibv_gid g;
        if (ibv_query_gid(ctx, 1, i, &g) != 0)
            break;
        static const uint8_t zero[16];
        if (!memcmp(g.raw, zero, 16))
            continue;
        static const uint8_t v4map[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (!memcmp(g.raw, v4map, 12)) {
            *gid = g;
            return i;
        }
        if (first < 0) {
            first = i;
            *gid = g;
        }
    }
    return first;
}

static int rdma_init(xt_engine *e)
{
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list || n == 0) {
        if (list)
            ibv_free_device_list(list);
        return -ENODEV;
    }
    for (int i = 0; i < n && e->nnics < XT_MAX_NICS; i++) {
        const char *name = ibv_get_device_name(list[i]);
        if (e->cfg.rdma_devices && e->cfg.rdma_devices[0]) { /* "mlx5_0,mlx5_1": only those */
            const char *p = strstr(e->cfg.rdma_devices, name);
            size_t l = strlen(name);
            if (!p || (p != e->cfg.rdma_devices && p[-1] != ',') || (p[l] && p[l] != ','))
                continue;
        }
        struct xt_nic *c = &e->nics[e->nnics];
        memset(c, 0, sizeof *c);
        snprintf(c->name, sizeof c->name, "%s", name);
        c->ctx = ibv_open_device(list[i]);
        if (!c->ctx)
            continue;
        struct ibv_port_attr pa;
        if (ibv_query_port(c->ctx, 1, &pa) != 0 || pa.state != IBV_PORT_ACTIVE ||
            !(c->pd = ibv_alloc_pd(c->ctx))) {
            xt_log_error(e, "RDMA device unusable (port not active or no PD)", -ENODEV);
            ibv_close_device(c->ctx);
            continue;
        }
        c->lid = pa.lid;
        c->mtu = pa.active_mtu;
        c->gid_index = pick_gid(c->ctx, e->cfg.gid_index, &c->gid);
        c->cqs = calloc((size_t)e->cfg.threads, sizeof *c->cqs);
        int ok = c->cqs != NULL;
        for (int w = 0; ok && w < e->cfg.threads; w++)
            ok = (c->cqs[w] = ibv_create_cq(c->ctx, 256, NULL, NULL, 0)) != NULL;
        c->target_cq = ok ? ibv_create_cq(c->ctx, 256, NULL, NULL, 0) : NULL;
        if (!ok || !c->target_cq) {
            for (int w = 0; c->cqs && w < e->cfg.threads; w++)
                if (c->cqs[w])
                    ibv_destroy_cq(c->cqs[w]);
            free(c->cqs);
            ibv_dealloc_pd(c->pd);
            ibv_close_device(c->ctx);
            continue;
        }
        e->nnics++;
    }
    ibv_free_device_list(list);
    if (!e->nnics)
        return -ENODEV;
    struct rlimit rl; /* registration pins memory: a low memlock limit fails ibv_reg_mr later */
    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < (64u << 20))
        fprintf(stderr, "xpyd_transfer[%s]: RLIMIT_MEMLOCK is %llu KiB: memory registration will fail for large "
                        "buffers (raise it: ulimit -l unlimited, or LimitMEMLOCK=infinity under systemd)\n",
                e->name, (unsigned long long)(rl.rlim_cur >> 10));
    return 0;
}

static void rdma_fini(xt_engine *e)
{
    for (int i = 0; i < e->nnics; i++) {
        struct xt_nic *c = &e->nics[i];
        for (int w = 0; w < e->cfg.threads; w++)
            ibv_destroy_cq(c->cqs[w]);
        free(c->cqs);
        ibv_destroy_cq(c->target_cq);
        ibv_dealloc_pd(c->pd);
        ibv_close_device(c->ctx);
    }
    e->nnics = 0;
}

static int rdma_reg(xt_engine *e, struct xt_region *r)
{
    for (int i = 0; i < e->nnics; i++) {
        r->mr[i] = ibv_reg_mr(e->nics[i].pd, (void *)r->addr, r->len,
                              IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
        if (!r->mr[i]) {
            int rc = errno ? -errno : -ENOMEM;
            while (--i >= 0)
                ibv_dereg_mr(r->mr[i]);
            return rc;
        }
    }
    return 0;
}

static void rdma_dereg(xt_engine *e, struct xt_region *r)
{
    for (int i = 0; i < e->nnics; i++)
        if (r->mr[i])
            ibv_dereg_mr(r->mr[i]);
}

static size_t rdma_describe_nics(xt_engine *e, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, ",\"nics\":[");
    for (int i = 0; i < e->nnics && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s{\"name\":\"%s\",\"lid\":%u,\"mtu\":%d,\"gid_index\":%d}",
                              i ? "," : "", e->nics[i].name, e->nics[i].lid, mtu_bytes(e->nics[i].mtu),
                              e->nics[i].gid_index);
    if (n < cap)
        n += (size_t)snprintf(buf + n, cap - n, "]");
    return n;
}

static size_t rdma_describe_rkeys(xt_engine *e, const struct xt_region *r, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, ",\"rkeys\":[");
    for (int i = 0; i < e->nnics && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%u", i ? "," : "", r->mr[i] ? r->mr[i]->rkey : 0);
    if (n < cap)
        n += (size_t)snprintf(buf + n, cap - n, "]");
    return n;
}

/* ---------- QP state machine ---------- */

static struct ibv_qp *qp_new(xt_engine *e, int nic, struct ibv_cq *cq)
{
    struct ibv_qp_init_attr ia;
    memset(&ia, 0, sizeof ia);
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = 64;
    ia.cap.max_recv_wr = 1;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    ia.sq_sig_all = 1;
    struct ibv_qp *qp = ibv_create_qp(e->nics[nic].pd, &ia);
    if (!qp)
        return NULL;
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
        ibv_destroy_qp(qp);
        return NULL;
    }
    return qp;
}

struct xt_qp_wire { /* XF_QP payload, both directions (little-endian fields) */
    uint32_t qpn, psn, mtu_enum, nic;
    uint16_t lid, pad;
    uint8_t gid[16];
    int32_t gid_index;
};

/* INIT -> RTR -> RTS against the peer's QP; the path MTU is the smaller of the two sides'. */
static int qp_connect(xt_engine *e, struct ibv_qp *qp, int nic, const struct xt_qp_wire *peer, uint32_t my_psn)
{
    struct xt_nic *c = &e->nics[nic];
    enum ibv_mtu mtu = c->mtu < (enum ibv_mtu)peer->mtu_enum ? c->mtu : (enum ibv_mtu)peer->mtu_enum;
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = mtu;
    a.dest_qp_num = peer->qpn;
    a.rq_psn = peer->psn;
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = 12;
    a.ah_attr.dlid = peer->lid;
    a.ah_attr.port_num = 1;
    if (peer->gid_index >= 0) { /* RoCE: routed by GID */
        a.ah_attr.is_global = 1;
        memcpy(a.ah_attr.grh.dgid.raw, peer->gid, 16);
        a.ah_attr.grh.sgid_index = (uint8_t)(c->gid_index >= 0 ? c->gid_index : 0);
        a.ah_attr.grh.hop_limit = 64;
    }
    int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                       IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (rc)
        return -rc;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = my_psn;
    a.max_rd_atomic = 16;
    rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                   IBV_QP_MAX_QP_RD_ATOMIC);
    return rc ? -rc : 0;
}

static void wire_fill(xt_engine *e, int nic, struct ibv_qp *qp, uint32_t psn, struct xt_qp_wire *w)
{
    struct xt_nic *c = &e->nics[nic];
    memset(w, 0, sizeof *w);
    w->qpn = qp->qp_num;
    w->psn = psn;
    w->mtu_enum = (uint32_t)c->mtu;
    w->nic = (uint32_t)nic;
    w->lid = c->lid;
    w->gid_index = c->gid_index;
    memcpy(w->gid, c->gid.raw, 16);
}

/* ---------- target side: QPs made on a peer's request, destroyed with its control connection ---------- */

static int rdma_serve_qp(xt_engine *e, struct xt_served *sv, const struct xt_hdr *h, const void *payload)
{
    if (h->len != sizeof(struct xt_qp_wire) || !e->nnics)
        return -EPROTO;
    const struct xt_qp_wire *peer = payload;
    int nic = (int)(h->addr % (uint64_t)e->nnics); /* the NIC the initiator paired this QP with */
    struct ibv_qp *qp = qp_new(e, nic, e->nics[nic].target_cq);
    struct xt_qp_wire mine;
    int rc = qp ? 0 : -ENOMEM;
    uint32_t psn = (uint32_t)(random() & 0xffffff);
    if (!rc)
        rc = qp_connect(e, qp, nic, peer, psn);
    if (!rc && sv->nqps < XT_SERVED_QPS)
        sv->qps[sv->nqps++] = qp;
    else if (!rc)
        rc = -ENOSPC;
    if (rc && qp)
        ibv_destroy_qp(qp);
    if (!rc)
        wire_fill(e, nic, qp, psn, &mine);
    struct xt_hdr a = {XT_MAGIC, rc ? 0 : (uint32_t)sizeof mine, XF_QP, rc, h->seq, (uint64_t)nic, 0};
    int wrc = xt_send_hdr(sv->fd, &a);
    if (!wrc && !rc)
        wrc = xt_send_all(sv->fd, &mine, sizeof mine);
    return wrc;
}

static void rdma_served_close(struct xt_served *sv)
{
    for (int i = 0; i < sv->nqps; i++)
        ibv_destroy_qp(sv->qps[i]);
    sv->nqps = 0;
}

/* ---------- initiator side ---------- */

static int parse_peer(struct xt_rseg *rs, const struct xt_desc *d)
{
    if (d->nnics < 1 || d->nnics > XT_MAX_NICS)
        return -EPROTONOSUPPORT; /* the peer speaks tcp only */
    rs->peer_nics = d->nnics;
    rs->bufs = calloc(d->nbufs + 1, sizeof *rs->bufs);
    if (!rs->bufs)
        return -ENOMEM;
    for (size_t k = 0; k < d->nbufs; k++) {
        if (d->bufs[k].nrkeys != d->nnics)
            continue;
        rs->bufs[rs->nbufs].addr = d->bufs[k].addr;
        rs->bufs[rs->nbufs].len = d->bufs[k].len;
        memcpy(rs->bufs[rs->nbufs].rkey, d->bufs[k].rkey, sizeof d->bufs[k].rkey);
        rs->nbufs++;
    }
    return 0;
}

/* Creates (or rebuilds) the QP of worker w on local NIC nic, paired with the peer over the control fd. */
static int rqp_handshake(xt_engine *e, struct xt_seg *sg, int w, int nic)
{
    struct xt_rseg *rs = sg->rdma;
    struct xt_rqp *q = &rs->qps[w * e->nnics + nic];
    if (q->qp) {
        ibv_destroy_qp(q->qp);
        q->qp = NULL;
    }
    q->nic = nic;
    q->peer_nic = nic % rs->peer_nics;
    q->broken = 0;
    struct ibv_qp *qp = qp_new(e, nic, e->nics[nic].cqs[w]);
    if (!qp)
        return -ENOMEM;
    uint32_t psn = (uint32_t)(random() & 0xffffff);
    struct xt_qp_wire mine, peer;
    wire_fill(e, nic, qp, psn, &mine);
    pthread_mutex_lock(&sg->ctl_mu);
    int fd = sg->conns[e->cfg.threads].fd;
    struct xt_hdr h = {XT_MAGIC, sizeof mine, XF_QP, 0, 0, (uint64_t)q->peer_nic, 0}, a;
    int rc = fd < 0 ? -ENOTCONN : xt_send_hdr(fd, &h);
    if (!rc)
        rc = xt_send_all(fd, &mine, sizeof mine);
    if (!rc)
        rc = xt_recv_hdr(fd, &a, 4096);
    if (!rc && (a.type != XF_QP || (a.status == 0 && a.len != sizeof peer)))
        rc = -EPROTO;
    if (!rc && a.status)
        rc = a.status < 0 ? a.status : -EPROTO;
    if (!rc)
        rc = xt_recv_all(fd, &peer, sizeof peer);
    pthread_mutex_unlock(&sg->ctl_mu);
    if (!rc)
        rc = qp_connect(e, qp, nic, &peer, psn);
    if (rc) {
        ibv_destroy_qp(qp);
        return rc;
    }
    q->qp = qp;
    return 0;
}

static void rdma_close_segment(xt_engine *e, struct xt_seg *sg);

static int rdma_open_segment(xt_engine *e, struct xt_seg *sg, const struct xt_desc *peer)
{
    struct xt_rseg *rs = calloc(1, sizeof *rs);
    if (!rs)
        return -ENOMEM;
    int rc = parse_peer(rs, peer);
    if (!rc && !(rs->qps = calloc((size_t)e->cfg.threads * (size_t)e->nnics, sizeof *rs->qps)))
        rc = -ENOMEM;
    sg->rdma = rs;
    for (int w = 0; !rc && w < e->cfg.threads; w++)
        for (int i = 0; !rc && i < e->nnics; i++)
            rc = rqp_handshake(e, sg, w, i); /* every QP is at RTS before any slice is posted */
    if (rc)
        rdma_close_segment(e, sg);
    return rc;
}

static void rdma_close_segment(xt_engine *e, struct xt_seg *sg)
{
    struct xt_rseg *rs = sg->rdma;
    if (!rs)
        return;
    for (int k = 0; rs->qps && k < e->cfg.threads * e->nnics; k++)
        if (rs->qps[k].qp)
            ibv_destroy_qp(rs->qps[k].qp);
    free(rs->qps);
    free(rs->bufs);
    free(rs);
    sg->rdma = NULL;
}

static uint32_t lkey_for(xt_engine *e, int nic, const void *p, size_t len)
{
    pthread_rwlock_rdlock(&e->reg_lock);
    uint32_t k = 0;
    for (size_t i = 0; i < e->nregions; i++) {
        const struct xt_region *r = &e->regions[i];
        if ((uintptr_t)p >= r->addr && len <= r->len && (uintptr_t)p - r->addr <= r->len - len)
            k = r->mr[nic] ? r->mr[nic]->lkey : 0;
    }
    pthread_rwlock_unlock(&e->reg_lock);
    return k;
}

static int rkey_for(const struct xt_rseg *rs, int peer_nic, uint64_t addr, uint64_t len, uint32_t *rkey)
{
    for (size_t i = 0; i < rs->nbufs; i++)
        if (addr >= rs->bufs[i].addr && len <= rs->bufs[i].len && addr - rs->bufs[i].addr <= rs->bufs[i].len - len) {
            *rkey = rs->bufs[i].rkey[peer_nic];
            return 0;
        }
    return -EFAULT; /* outside every buffer the peer published: refused before anything is posted */
}

static int post_and_wait(xt_engine *e, struct xt_rqp *q, int w, const struct xt_slice *sl, uint32_t rkey,
                         int *wc_status)
{
    uint32_t lkey = lkey_for(e, q->nic, sl->local, sl->len);
    struct ibv_sge sge = {(uintptr_t)sl->local, (uint32_t)sl->len, lkey};
    struct ibv_send_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof wr);
    static atomic_uint_fast64_t wr_ids;
    wr.wr_id = atomic_fetch_add(&wr_ids, 1) + 1;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = sl->opcode == XT_WRITE ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = sl->remote;
    wr.wr.rdma.rkey = rkey;
    int rc = ibv_post_send(q->qp, &wr, &bad);
    if (rc)
        return -rc;
    struct ibv_cq *cq = e->nics[q->nic].cqs[w];
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        struct ibv_wc wc;
        int n = ibv_poll_cq(cq, 1, &wc);
        if (n < 0)
            return -EIO;
        if (n == 1 && wc.wr_id == wr.wr_id) {
            *wc_status = wc.status;
            return 0;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000 > e->cfg.io_timeout_ms)
            return -ETIMEDOUT;
        if (n == 0)
            sched_yield();
    }
}

static int rdma_slice(xt_engine *e, struct xt_seg *sg, int w, const struct xt_slice *sl)
{
    struct xt_rseg *rs = sg->rdma;
    int tries = e->nnics;
    int start = (int)(atomic_fetch_add(&sg->rr, 1) % (unsigned)e->nnics);
    int last = -EIO;
    for (int k = 0; k < tries; k++) {
        int nic = (start + k) % e->nnics;
        if (rs->down[nic])
            continue;
        struct xt_rqp *q = &rs->qps[w * e->nnics + nic];
        uint32_t rkey;
        int rc = rkey_for(rs, q->peer_nic, sl->remote, sl->len, &rkey);
        if (rc)
            return rc;
        if ((q->broken || !q->qp) && (rc = rqp_handshake(e, sg, w, nic)) != 0) {
            rs->down[nic] = 1;
            last = rc;
            continue;
        }
        int st = IBV_WC_SUCCESS;
        rc = post_and_wait(e, q, w, sl, rkey, &st);
        if (!rc && st == IBV_WC_SUCCESS)
            return 0;
        q->broken = 1; /* a QP that reported an error is in the error state: rebuild before reuse */
        if (!rc && (st == IBV_WC_REM_ACCESS_ERR || st == IBV_WC_LOC_PROT_ERR)) {
            char what[128];
            snprintf(what, sizeof what, "RDMA %s on %s: %s", sl->opcode == XT_WRITE ? "WRITE" : "READ",
                     e->nics[nic].name, wc_name(st));
            xt_log_error(e, what, -EFAULT);
            return -EFAULT; /* the range was refused by the remote NIC: not worth another path */
        }
        char what[128];
        snprintf(what, sizeof what, "RDMA %s on %s failed (%s); trying another NIC pair",
                 sl->opcode == XT_WRITE ? "WRITE" : "READ", e->nics[nic].name, rc ? strerror(-rc) : wc_name(st));
        xt_log_error(e, what, rc ? rc : -EIO);
        rs->down[nic] = 1;
        last = rc ? rc : -EIO;
    }
    return last;
}

/* A batch of slices of one worker for one segment: each one work request, striped over the NIC pairs. */
static void rdma_slices(xt_engine *e, struct xt_seg *sg, int worker, struct xt_slice **sls, int n, int *rcs)
{
    for (int i = 0; i < n; i++)
        rcs[i] = rdma_slice(e, sg, worker, sls[i]); /* retried on another pair when one fails */
}

/* The engine's devices (r NULL), or one buffer's rkeys, as descriptor fields. */
static size_t rdma_describe(xt_engine *e, const struct xt_region *r, char *buf, size_t cap)
{
    return r ? rdma_describe_rkeys(e, r, buf, cap) : rdma_describe_nics(e, buf, cap);
}

const struct xt_transport_ops xt_transport_rdma = {
    .name = "rdma",
    .init = rdma_init,
    .fini = rdma_fini,
    .reg = rdma_reg,
    .dereg = rdma_dereg,
    .describe = rdma_describe,
    .serve_qp = rdma_serve_qp,
    .served_close = rdma_served_close,
    .open_segment = rdma_open_segment,
    .close_segment = rdma_close_segment,
    .slices = rdma_slices,
};
