/* SPDX-License-Identifier: Apache-2.0 */
/* fake_verbs.c - a test double for libibverbs, written for xpyd (no RDMA hardware here). Linked instead of
 * -libverbs into a test build of libxpyd_transfer, it emulates FAKE_VERBS_NICS devices (default 2) of one
 * fabric inside the process, strictly:
 *   - QPs follow the state machine RESET -> INIT -> RTR -> RTS with the attribute masks the spec requires for
 *     each RC transition (a missing or extra bit: EINVAL); ibv_post_send before RTS: EINVAL;
 *   - an RDMA READ/WRITE checks the local SGE against the lkey's MR (bounds, LOCAL_WRITE for reads) and the
 *     remote range against the peer QP's PD and rkey (bounds, REMOTE_READ/WRITE): a violation completes with
 *     IBV_WC_LOC_PROT_ERR / IBV_WC_REM_ACCESS_ERR and moves the QP to ERR, after which every WR completes with
 *     IBV_WC_WR_FLUSH_ERR;
 *   - ibv_post_send / ibv_poll_cq are reached through context->ops (they are inline in verbs.h), ibv_reg_mr
 *     through the real symbol the macro calls;
 *   - a device can be failed (fake_verbs_fail_device): its WRs then complete with IBV_WC_RETRY_EXC_ERR;
 *   - live QPs, MRs, CQs, PDs and contexts are counted (fake_verbs_live) so tests see leaks.
 * Data moves with memcpy at post time (both sides live in this process); the completion is queued on the
 * send CQ. */
#include "fake_verbs.h"

/* the real symbols behind verbs.h's macros */
#undef ibv_query_port
#undef ibv_reg_mr

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FV_MAX_DEV 4
#define FV_CQ_CAP 4096

struct fv_cq {
    struct ibv_cq cq;
    pthread_mutex_t mu;
    struct ibv_wc wc[FV_CQ_CAP];
    int head, n;
};

struct fv_qp {
    struct ibv_qp qp;
    int dev;
    uint32_t dest_qpn;
    enum ibv_mtu mtu;
    int access;
    struct fv_qp *next;
};

struct fv_mr {
    struct ibv_mr mr;
    int access;
    struct fv_mr *next;
};

static pthread_mutex_t G = PTHREAD_MUTEX_INITIALIZER;
static struct ibv_device devs[FV_MAX_DEV];
static struct ibv_device *dev_list[FV_MAX_DEV + 1];
static int ndevs = -1;
static int failed[FV_MAX_DEV];
static struct fv_qp *qps;
static struct fv_mr *mrs;
static uint32_t next_qpn = 0x100, next_key = 0x1000;
static atomic_int live_qp, live_mr, live_cq, live_pd, live_ctx;
static atomic_int posts_before_rts;
static enum ibv_mtu port_mtu[FV_MAX_DEV] = {IBV_MTU_4096, IBV_MTU_4096, IBV_MTU_4096, IBV_MTU_4096};

static void init_devs(void);

struct fv_ctx { /* a context remembers its port's MTU as it was when opened */
    struct ibv_context ctx;
    enum ibv_mtu mtu;
};

void fake_verbs_set_port_mtu(const char *name, enum ibv_mtu mtu)
{
    pthread_mutex_lock(&G);
    init_devs();
    for (int i = 0; i < ndevs; i++)
        if (!strcmp(devs[i].name, name))
            port_mtu[i] = mtu;
    pthread_mutex_unlock(&G);
}


static int fv_poll_cq(struct ibv_cq *cq, int num, struct ibv_wc *wc);
static int fv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
static int fv_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);

static void init_devs(void)
{
    if (ndevs >= 0)
        return;
    const char *env = getenv("FAKE_VERBS_NICS");
    ndevs = env ? atoi(env) : 2;
    if (ndevs < 0 || ndevs > FV_MAX_DEV)
        ndevs = 2;
    for (int i = 0; i < ndevs; i++) {
        snprintf(devs[i].name, sizeof devs[i].name, "fake_%d", i);
        dev_list[i] = &devs[i];
    }
    dev_list[ndevs] = NULL;
}

void fake_verbs_fail_device(const char *name, int fail)
{
    pthread_mutex_lock(&G);
    init_devs();
    for (int i = 0; i < ndevs; i++)
        if (!strcmp(devs[i].name, name))
            failed[i] = fail;
    pthread_mutex_unlock(&G);
}

void fake_verbs_live(struct fake_verbs_counts *c)
{
    c->qps = atomic_load(&live_qp);
    c->mrs = atomic_load(&live_mr);
    c->cqs = atomic_load(&live_cq);
    c->pds = atomic_load(&live_pd);
    c->contexts = atomic_load(&live_ctx);
    c->posts_before_rts = atomic_load(&posts_before_rts);
}

/* ---- devices ---- */

struct ibv_device **ibv_get_device_list(int *num)
{
    pthread_mutex_lock(&G);
    init_devs();
    pthread_mutex_unlock(&G);
    if (num)
        *num = ndevs;
    struct ibv_device **l = calloc((size_t)ndevs + 1, sizeof *l);
    if (l)
        memcpy(l, dev_list, (size_t)ndevs * sizeof *l);
    return l;
}

void ibv_free_device_list(struct ibv_device **list)
{
    free(list);
}

const char *ibv_get_device_name(struct ibv_device *device)
{
    return device->name;
}

struct ibv_context *ibv_open_device(struct ibv_device *device)
{
    struct fv_ctx *fc = calloc(1, sizeof *fc);
    if (!fc)
        return NULL;
    struct ibv_context *c = &fc->ctx;
    c->device = device;
    pthread_mutex_lock(&G);
    fc->mtu = port_mtu[(struct ibv_device *)device - devs];
    pthread_mutex_unlock(&G);
    c->ops.poll_cq = fv_poll_cq;
    c->ops.post_send = fv_post_send;
    c->ops.post_recv = fv_post_recv;
    c->abi_compat = NULL; /* not an extended context: verbs.h falls back to the plain calls */
    atomic_fetch_add(&live_ctx, 1);
    return c;
}

int ibv_close_device(struct ibv_context *c)
{
    free(c);
    atomic_fetch_sub(&live_ctx, 1);
    return 0;
}

static int dev_index(struct ibv_context *c)
{
    return (int)((struct ibv_device *)c->device - devs);
}

int ibv_query_port(struct ibv_context *c, uint8_t port, struct _compat_ibv_port_attr *out)
{
    if (port != 1)
        return EINVAL;
    struct ibv_port_attr *a = (struct ibv_port_attr *)out;
    memset(a, 0, sizeof *a);
    a->state = IBV_PORT_ACTIVE;
    a->lid = (uint16_t)(dev_index(c) + 1);
    a->active_mtu = ((struct fv_ctx *)c)->mtu;
    a->max_mtu = IBV_MTU_4096;
    a->link_layer = IBV_LINK_LAYER_ETHERNET;
    return 0;
}

int ibv_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *gid)
{
    if (port != 1 || index < 0 || index > 3)
        return EINVAL;
    memset(gid, 0, sizeof *gid);
    if (index == 0) { /* link-local (RoCEv1 style) */
        gid->raw[0] = 0xfe;
        gid->raw[1] = 0x80;
        gid->raw[15] = (uint8_t)(dev_index(c) + 1);
    } else if (index == 1) { /* IPv4-mapped: routable RoCEv2 */
        gid->raw[10] = gid->raw[11] = 0xff;
        gid->raw[12] = 10;
        gid->raw[15] = (uint8_t)(dev_index(c) + 1);
    }
    return 0;
}

/* ---- PD, MR, CQ ---- */

struct ibv_pd *ibv_alloc_pd(struct ibv_context *c)
{
    struct ibv_pd *pd = calloc(1, sizeof *pd);
    if (pd) {
        pd->context = c;
        atomic_fetch_add(&live_pd, 1);
    }
    return pd;
}

int ibv_dealloc_pd(struct ibv_pd *pd)
{
    free(pd);
    atomic_fetch_sub(&live_pd, 1);
    return 0;
}

struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
    struct fv_mr *m = calloc(1, sizeof *m);
    if (!m) {
        errno = ENOMEM;
        return NULL;
    }
    m->mr.context = pd->context;
    m->mr.pd = pd;
    m->mr.addr = addr;
    m->mr.length = length;
    m->access = access;
    pthread_mutex_lock(&G);
    m->mr.lkey = next_key++;
    m->mr.rkey = next_key++;
    m->next = mrs;
    mrs = m;
    pthread_mutex_unlock(&G);
    atomic_fetch_add(&live_mr, 1);
    return &m->mr;
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned int access)
{
    return ibv_reg_mr(pd, addr, length, (int)access);
}

int ibv_dereg_mr(struct ibv_mr *mr)
{
    pthread_mutex_lock(&G);
    for (struct fv_mr **pp = &mrs; *pp; pp = &(*pp)->next)
        if (&(*pp)->mr == mr) {
            struct fv_mr *m = *pp;
            *pp = m->next;
            free(m);
            break;
        }
    pthread_mutex_unlock(&G);
    atomic_fetch_sub(&live_mr, 1);
    return 0;
}

struct ibv_cq *ibv_create_cq(struct ibv_context *c, int cqe, void *ctx, struct ibv_comp_channel *ch, int vec)
{
    struct fv_cq *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    q->cq.context = c;
    q->cq.cqe = cqe;
    pthread_mutex_init(&q->mu, NULL);
    atomic_fetch_add(&live_cq, 1);
    return &q->cq;
}

int ibv_destroy_cq(struct ibv_cq *cq)
{
    struct fv_cq *q = (struct fv_cq *)cq;
    pthread_mutex_destroy(&q->mu);
    free(q);
    atomic_fetch_sub(&live_cq, 1);
    return 0;
}

static void cq_push(struct ibv_cq *cq, uint64_t wr_id, enum ibv_wc_status st, enum ibv_wc_opcode op, uint32_t len,
                    uint32_t qpn)
{
    struct fv_cq *q = (struct fv_cq *)cq;
    pthread_mutex_lock(&q->mu);
    if (q->n < FV_CQ_CAP) {
        struct ibv_wc *w = &q->wc[(q->head + q->n) % FV_CQ_CAP];
        memset(w, 0, sizeof *w);
        w->wr_id = wr_id;
        w->status = st;
        w->opcode = op;
        w->byte_len = len;
        w->qp_num = qpn;
        q->n++;
    }
    pthread_mutex_unlock(&q->mu);
}

static int fv_poll_cq(struct ibv_cq *cq, int num, struct ibv_wc *wc)
{
    struct fv_cq *q = (struct fv_cq *)cq;
    pthread_mutex_lock(&q->mu);
    int k = 0;
    while (k < num && q->n > 0) {
        wc[k++] = q->wc[q->head];
        q->head = (q->head + 1) % FV_CQ_CAP;
        q->n--;
    }
    pthread_mutex_unlock(&q->mu);
    return k;
}

/* ---- QPs ---- */

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *ia)
{
    if (ia->qp_type != IBV_QPT_RC || !ia->send_cq) {
        errno = EINVAL;
        return NULL;
    }
    struct fv_qp *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    q->qp.context = pd->context;
    q->qp.pd = pd;
    q->qp.send_cq = ia->send_cq;
    q->qp.recv_cq = ia->recv_cq;
    q->qp.state = IBV_QPS_RESET;
    q->qp.qp_type = IBV_QPT_RC;
    q->dev = dev_index(pd->context);
    pthread_mutex_lock(&G);
    q->qp.qp_num = next_qpn++;
    q->next = qps;
    qps = q;
    pthread_mutex_unlock(&G);
    atomic_fetch_add(&live_qp, 1);
    return &q->qp;
}

int ibv_destroy_qp(struct ibv_qp *qp)
{
    pthread_mutex_lock(&G);
    for (struct fv_qp **pp = &qps; *pp; pp = &(*pp)->next)
        if (&(*pp)->qp == qp) {
            struct fv_qp *q = *pp;
            *pp = q->next;
            free(q);
            break;
        }
    pthread_mutex_unlock(&G);
    atomic_fetch_sub(&live_qp, 1);
    return 0;
}

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask)
{
    struct fv_qp *q = (struct fv_qp *)qp;
    if (!(mask & IBV_QP_STATE))
        return EINVAL;
    enum ibv_qp_state from = qp->state, to = a->qp_state;
    int need;
    if (to == IBV_QPS_RESET || to == IBV_QPS_ERR) {
        qp->state = to;
        return 0;
    }
    if (from == IBV_QPS_RESET && to == IBV_QPS_INIT)
        need = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    else if (from == IBV_QPS_INIT && to == IBV_QPS_RTR)
        need = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    else if (from == IBV_QPS_RTR && to == IBV_QPS_RTS)
        need = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
               IBV_QP_MAX_QP_RD_ATOMIC;
    else
        return EINVAL; /* not a transition of the RC state machine */
    if ((mask & need) != need)
        return EINVAL;
    if (to == IBV_QPS_INIT) {
        if (a->port_num != 1)
            return EINVAL;
        q->access = a->qp_access_flags;
    }
    if (to == IBV_QPS_RTR) {
        if (a->path_mtu < IBV_MTU_256 || a->path_mtu > IBV_MTU_4096 || a->ah_attr.port_num != 1)
            return EINVAL;
        q->dest_qpn = a->dest_qp_num;
        q->mtu = a->path_mtu;
    }
    qp->state = to;
    return 0;
}

enum ibv_mtu fake_verbs_max_path_mtu(void)
{
    enum ibv_mtu m = 0;
    pthread_mutex_lock(&G);
    for (struct fv_qp *q = qps; q; q = q->next)
        if (q->qp.state >= IBV_QPS_RTR && q->mtu > m)
            m = q->mtu;
    pthread_mutex_unlock(&G);
    return m;
}

static struct fv_qp *qp_by_num(uint32_t n)
{
    for (struct fv_qp *q = qps; q; q = q->next)
        if (q->qp.qp_num == n)
            return q;
    return NULL;
}

static struct fv_mr *mr_by(struct ibv_pd *pd, uint32_t key, int remote)
{
    for (struct fv_mr *m = mrs; m; m = m->next)
        if (m->mr.pd == pd && (remote ? m->mr.rkey : m->mr.lkey) == key)
            return m;
    return NULL;
}

static int in_mr(const struct fv_mr *m, uint64_t addr, uint64_t len)
{
    uint64_t a = (uint64_t)(uintptr_t)m->mr.addr;
    return addr >= a && len <= m->mr.length && addr - a <= m->mr.length - len;
}

static int fv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    struct fv_qp *q = (struct fv_qp *)qp;
    for (; wr; wr = wr->next) {
        if (qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_ERR) {
            atomic_fetch_add(&posts_before_rts, 1);
            if (bad)
                *bad = wr;
            return EINVAL; /* posting to a QP that is not ready to send */
        }
        if (wr->num_sge != 1 || (wr->opcode != IBV_WR_RDMA_READ && wr->opcode != IBV_WR_RDMA_WRITE)) {
            if (bad)
                *bad = wr;
            return EINVAL;
        }
        enum ibv_wc_opcode op = wr->opcode == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE;
        enum ibv_wc_status st = IBV_WC_SUCCESS;
        pthread_mutex_lock(&G);
        struct fv_qp *peer = qp_by_num(q->dest_qpn);
        struct fv_mr *lm = mr_by(qp->pd, wr->sg_list[0].lkey, 0);
        uint64_t len = wr->sg_list[0].length;
        if (qp->state == IBV_QPS_ERR)
            st = IBV_WC_WR_FLUSH_ERR;
        else if (failed[q->dev] || !peer || failed[peer->dev] || peer->qp.state < IBV_QPS_RTR ||
                 peer->dest_qpn != qp->qp_num)
            st = IBV_WC_RETRY_EXC_ERR; /* nobody answers on that path */
        else if (!lm || !in_mr(lm, wr->sg_list[0].addr, len) ||
                 (op == IBV_WC_RDMA_READ && !(lm->access & IBV_ACCESS_LOCAL_WRITE)))
            st = IBV_WC_LOC_PROT_ERR;
        else {
            struct fv_mr *rm = mr_by(peer->qp.pd, wr->wr.rdma.rkey, 1);
            int need = op == IBV_WC_RDMA_READ ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
            if (!rm || !in_mr(rm, wr->wr.rdma.remote_addr, len) || !(rm->access & need) || !(peer->access & need))
                st = IBV_WC_REM_ACCESS_ERR;
            else if (op == IBV_WC_RDMA_READ)
                memcpy((void *)(uintptr_t)wr->sg_list[0].addr, (void *)(uintptr_t)wr->wr.rdma.remote_addr, len);
            else
                memcpy((void *)(uintptr_t)wr->wr.rdma.remote_addr, (void *)(uintptr_t)wr->sg_list[0].addr, len);
        }
        if (st != IBV_WC_SUCCESS && st != IBV_WC_WR_FLUSH_ERR)
            qp->state = IBV_QPS_ERR; /* an error completion takes the QP to ERR: later WRs are flushed */
        pthread_mutex_unlock(&G);
        if ((wr->send_flags & IBV_SEND_SIGNALED) || st != IBV_WC_SUCCESS)
            cq_push(qp->send_cq, wr->wr_id, st, op, st == IBV_WC_SUCCESS ? (uint32_t)len : 0, qp->qp_num);
    }
    return 0;
}

static int fv_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    if (bad)
        *bad = wr;
    return EINVAL; /* the transport never posts receives (one-sided only) */
}

const char *ibv_wc_status_str(enum ibv_wc_status st)
{
    switch (st) {
    case IBV_WC_SUCCESS: return "success";
    case IBV_WC_LOC_PROT_ERR: return "local protection error";
    case IBV_WC_WR_FLUSH_ERR: return "Work Request Flushed Error";
    case IBV_WC_REM_ACCESS_ERR: return "remote access error";
    case IBV_WC_RETRY_EXC_ERR: return "transport retry counter exceeded";
    default: return "other error";
    }
}
