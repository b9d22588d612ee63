/* SPDX-License-Identifier: Apache-2.0 */
/* xt_engine.c - libxpyd_transfer core: engine life cycle, peer segments, batches cut into slices that worker
 * threads move through the segment's transport (xt_tcp.c, xt_rdma.c, behind struct xt_transport_ops) over
 * per-peer persistent connections (one per worker, so a large request is striped over `threads` streams),
 * notifications. Registered memory and the descriptor: xt_mem.c; the serving side: xt_serve.c. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "xt_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* ---------- workers ---------- */

static struct xt_seg *seg_get(xt_engine *e, xt_segment s)
{
    return s >= 0 && (size_t)s < e->nsegs && e->segs[s]->used == 1 ? e->segs[s] : NULL;
}

static void finish_slice(xt_engine *e, const struct xt_slice *sl, int rc)
{
    pthread_mutex_lock(&e->mu);
    struct xt_batchs *b = e->batches[sl->batch]; /* never moves; its tasks live until freed (not while pending) */
    pthread_mutex_unlock(&e->mu);
    struct xt_task *t = &b->tasks[sl->task];
    if (rc) {
        int zero = 0;
        atomic_compare_exchange_strong(&t->error, &zero, rc);
    } else {
        atomic_fetch_add(&t->transferred, sl->len);
        atomic_fetch_add(&e->bytes_initiated, sl->len);
    }
    if (atomic_fetch_sub(&t->remaining, 1) == 1) {
        pthread_mutex_lock(&e->mu);
        t->state = atomic_load(&t->error) ? XT_FAILED : XT_COMPLETED;
        b->pending--;
        pthread_cond_broadcast(&e->cond);
        pthread_mutex_unlock(&e->mu);
        xt_wake(e);
    }
}

static void *worker(void *arg)
{
    xt_engine *e = arg;
    int slot = atomic_fetch_add(&e->next_slot, 1); /* this worker's own connection to every peer */
    struct xt_slice *sls[XT_PIPELINE];
    int rcs[XT_PIPELINE];
    pthread_mutex_lock(&e->q_mu);
    for (;;) {
        while (!e->q_head && !atomic_load(&e->stopping))
            pthread_cond_wait(&e->q_cond, &e->q_mu);
        if (!e->q_head)
            break;
        int n = 0; /* consecutive slices for the same peer travel together */
        do {
            sls[n++] = e->q_head;
            e->q_head = e->q_head->next;
        } while (n < XT_PIPELINE && e->q_head && e->q_head->seg == sls[0]->seg);
        if (!e->q_head)
            e->q_tail = NULL;
        pthread_mutex_unlock(&e->q_mu);
        pthread_mutex_lock(&e->mu);
        struct xt_seg *sg = seg_get(e, sls[0]->seg);
        pthread_mutex_unlock(&e->mu);
        for (int i = 0; i < n; i++)
            rcs[i] = -EBADF;
        if (sg)
            sg->tp->slices(e, sg, slot, sls, n, rcs);
        for (int i = 0; i < n; i++) {
            struct xt_slice *sl = sls[i];
            if (sg) {
                if (rcs[i])
                    xt_log_error(e, sl->opcode == XT_WRITE ? "WRITE slice" : "READ slice", rcs[i]);
                if (sl->opcode == XT_WRITE && atomic_fetch_sub(&sg->inflight_writes, 1) == 1) {
                    pthread_mutex_lock(&e->mu);
                    pthread_cond_broadcast(&e->cond);
                    pthread_mutex_unlock(&e->mu);
                }
                atomic_fetch_sub(&sg->inflight, 1);
            }
            finish_slice(e, sl, rcs[i]);
            free(sl);
        }
        pthread_mutex_lock(&e->q_mu);
    }
    pthread_mutex_unlock(&e->q_mu);
    return NULL;
}

/* ---------- engine ---------- */

int xt_engine_create(const struct xt_config *cfg, xt_engine **out)
{
    if (!cfg || !cfg->name || !out || strlen(cfg->name) >= 64)
        return -EINVAL;
    const char *tr = cfg->transport ? cfg->transport : "auto";
    if (strcmp(tr, "tcp") != 0 && strcmp(tr, "auto") != 0 && strcmp(tr, "rdma") != 0)
        return -EPROTONOSUPPORT;
    xt_engine *e = calloc(1, sizeof *e);
    if (!e)
        return -ENOMEM;
    e->cfg = *cfg;
    if (e->cfg.threads <= 0)
        e->cfg.threads = 4;
    if (e->cfg.threads > 64)
        e->cfg.threads = 64;
    if (!e->cfg.slice_bytes)
        e->cfg.slice_bytes = 1 << 20;
    if (!e->cfg.max_frame_bytes)
        e->cfg.max_frame_bytes = e->cfg.slice_bytes + 65536;
    if (e->cfg.max_frame_bytes < e->cfg.slice_bytes)
        e->cfg.max_frame_bytes = e->cfg.slice_bytes;
    if (e->cfg.io_timeout_ms <= 0)
        e->cfg.io_timeout_ms = 10000;
    if (!e->cfg.gid_index_set)
        e->cfg.gid_index = -1;
    snprintf(e->name, sizeof e->name, "%s", cfg->name);
    snprintf(e->host, sizeof e->host, "%s", cfg->listen_host ? cfg->listen_host : "127.0.0.1");
    e->lfd = e->wake[0] = e->wake[1] = -1;
    e->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (e->evfd < 0) {
        free(e);
        return -errno;
    }
    pthread_rwlock_init(&e->reg_lock, NULL);
    pthread_mutex_init(&e->conns_mu, NULL);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cond, NULL);
    pthread_mutex_init(&e->q_mu, NULL);
    pthread_cond_init(&e->q_cond, NULL);
    pthread_mutex_init(&e->n_mu, NULL);
    int rc = 0;
    e->tp = &xt_transport_tcp;
    if (strcmp(tr, "tcp") != 0) {
        rc = xt_transport_rdma.init(e);
        if (rc == 0)
            e->tp = &xt_transport_rdma;
        else if (strcmp(tr, "auto") == 0)
            rc = 0; /* no usable RDMA device: tcp (said below) */
    }
    if (!rc)
        rc = xt_serve_start(e);
    if (rc) {
        if (e->tp->fini)
            e->tp->fini(e);
        close(e->evfd);
        free(e);
        return rc;
    }
    e->workers = calloc((size_t)e->cfg.threads, sizeof *e->workers);
    for (int i = 0; e->workers && i < e->cfg.threads; i++)
        pthread_create(&e->workers[i], NULL, worker, e);
    if (strcmp(tr, "auto") == 0 && e->cfg.verbose)
        fprintf(stderr, "xpyd_transfer[%s]: transport %s%s\n", e->name, e->tp->name,
                e->tp != &xt_transport_tcp ? "" : " (no usable RDMA device: ibv_get_device_list found none)");
    *out = e;
    return 0;
}

void xt_engine_destroy(xt_engine *e)
{
    if (!e)
        return;
    atomic_store(&e->stopping, 1);
    pthread_mutex_lock(&e->q_mu);
    pthread_cond_broadcast(&e->q_cond);
    pthread_mutex_unlock(&e->q_mu);
    for (int i = 0; e->workers && i < e->cfg.threads; i++)
        pthread_join(e->workers[i], NULL);
    free(e->workers);
    xt_serve_stop(e);
    close(e->evfd);
    for (struct xt_slice *s = e->q_head, *n; s; s = n) {
        n = s->next;
        free(s);
    }
    for (size_t i = 0; i < e->nsegs; i++) {
        struct xt_seg *sg = e->segs[i];
        if (sg->used == 1) {
            if (sg->tp->close_segment)
                sg->tp->close_segment(e, sg);
            for (int k = 0; k <= e->cfg.threads; k++)
                xt_conn_drop(sg, k);
            free(sg->conns);
            free(sg->peer_desc);
            pthread_mutex_destroy(&sg->ctl_mu);
        }
        free(sg);
    }
    free(e->segs);
    for (size_t i = 0; i < e->nbatches; i++) {
        free(e->batches[i]->tasks);
        free(e->batches[i]);
    }
    free(e->batches);
    for (size_t i = 0; e->tp->dereg && i < e->nregions; i++)
        e->tp->dereg(e, &e->regions[i]);
    if (e->tp->fini)
        e->tp->fini(e);
    free(e->regions);
    free(e->notes);
    pthread_rwlock_destroy(&e->reg_lock);
    free(e);
}

int xt_engine_port(const xt_engine *e)
{
    return e ? e->port : -EINVAL;
}

const char *xt_engine_transport(const xt_engine *e)
{
    return e ? e->tp->name : "tcp";
}

void xt_engine_counters(xt_engine *e, uint64_t *out_init, uint64_t *out_served)
{
    if (out_init)
        *out_init = atomic_load(&e->bytes_initiated);
    if (out_served)
        *out_served = atomic_load(&e->bytes_served);
}

/* ---------- segments ---------- */

static int exchange(xt_engine *e, int fd, uint32_t type, const void *payload, uint32_t len, struct xt_hdr *ack,
                    char **reply)
{
    struct xt_hdr h = {XT_MAGIC, len, type, 0, 0, 0, 0};
    int rc = xt_send_hdr(fd, &h);
    if (!rc && len)
        rc = xt_send_all(fd, payload, len);
    if (!rc)
        rc = xt_recv_hdr(fd, ack, 1 << 20);
    if (rc)
        return rc;
    char *buf = malloc((size_t)ack->len + 1);
    if (!buf)
        return -ENOMEM;
    rc = xt_recv_all(fd, buf, ack->len);
    buf[ack->len] = 0;
    if (reply && !rc)
        *reply = buf;
    else
        free(buf);
    return rc ? rc : ack->status;
}

/* Appends one zeroed object of size sz to a growing array of pointers (objects never move once made:
 * workers hold pointers to them). Returns it, or NULL on OOM. Caller holds e->mu. */
static void *grow_one(void ***arr, size_t *n, size_t sz)
{
    void **na = realloc(*arr, (*n + 1) * sizeof *na);
    if (!na)
        return NULL;
    *arr = na;
    void *one = calloc(1, sz);
    if (one)
        na[(*n)++] = one;
    return one;
}

int xt_open_segment(xt_engine *e, const char *peer, xt_segment *out)
{
    if (!e || !peer || !out)
        return -EINVAL;
    const char *colon = strrchr(peer, ':');
    long port = colon ? strtol(colon + 1, NULL, 10) : 0;
    if (!colon || port <= 0 || port > 65535 || colon - peer >= 256)
        return -EINVAL;
    char host[256];
    snprintf(host, sizeof host, "%.*s", (int)(colon - peer), peer);
    if (host[0] == '[') { /* [::1]:port */
        memmove(host, host + 1, strlen(host));
        host[strcspn(host, "]")] = 0;
    }
    pthread_mutex_lock(&e->mu); /* a peer already open: the same segment (Mooncake's openSegment is idempotent) */
    for (size_t k = 0; k < e->nsegs; k++)
        if (e->segs[k]->used == 1 && e->segs[k]->port == (int)port && !strcmp(e->segs[k]->host, host)) {
            pthread_mutex_unlock(&e->mu);
            *out = (xt_segment)k;
            return 0;
        }
    pthread_mutex_unlock(&e->mu);
    int fd = xt_connect(host, (int)port, e->cfg.io_timeout_ms);
    if (fd < 0)
        return fd;
    char mine[65536];
    int n = xt_describe(e, mine, sizeof mine);
    struct xt_hdr ack;
    char *desc = NULL;
    int rc = n < 0 ? n : exchange(e, fd, XF_HELLO, mine, (uint32_t)n, &ack, &desc);
    if (!rc && ack.type != XF_HELLO_ACK)
        rc = -EPROTO;
    if (rc) {
        close(fd);
        free(desc);
        return rc;
    }
    pthread_mutex_lock(&e->mu);
    size_t i = 0;
    while (i < e->nsegs && e->segs[i]->used)
        i++;
    if (i == e->nsegs && !grow_one((void ***)&e->segs, &e->nsegs, sizeof(struct xt_seg))) {
        pthread_mutex_unlock(&e->mu);
        close(fd);
        free(desc);
        return -ENOMEM;
    }
    struct xt_seg *sg = e->segs[i];
    memset(sg, 0, sizeof *sg);
    sg->used = 2; /* reserved while the handshake runs; usable (1) once it is done */
    sg->conns = calloc((size_t)e->cfg.threads + 1, sizeof *sg->conns);
    if (!sg->conns) {
        sg->used = 0;
        pthread_mutex_unlock(&e->mu);
        close(fd);
        free(desc);
        return -ENOMEM;
    }
    for (int k = 0; k <= e->cfg.threads; k++)
        sg->conns[k].fd = -1;
    sg->conns[e->cfg.threads].fd = fd; /* the control connection: handshake, notifications */
    snprintf(sg->host, sizeof sg->host, "%s", host);
    sg->port = (int)port;
    struct xt_desc pd;
    rc = xt_desc_parse(desc, &pd);
    /* slices never exceed what the peer accepts in one frame (it says so in its descriptor) */
    sg->max_slice = e->cfg.slice_bytes;
    if (!rc && pd.max_frame >= 4096 && pd.max_frame < sg->max_slice)
        sg->max_slice = (size_t)pd.max_frame;
    sg->peer_desc = desc;
    sg->tp = &xt_transport_tcp;
    pthread_mutex_init(&sg->ctl_mu, NULL);
    pthread_mutex_unlock(&e->mu);
    if (!rc && pd.rdma && e->tp->open_segment) { /* both sides have RDMA: QPs up to RTS now */
        rc = e->tp->open_segment(e, sg, &pd);
        if (!rc)
            sg->tp = e->tp;
    }
    xt_desc_free(&pd);
    if (rc) {
        xt_log_error(e, "segment handshake", rc);
        close(sg->conns[e->cfg.threads].fd);
        free(sg->conns);
        free(sg->peer_desc);
        pthread_mutex_destroy(&sg->ctl_mu);
        pthread_mutex_lock(&e->mu);
        sg->used = 0;
        pthread_mutex_unlock(&e->mu);
        return rc;
    }
    pthread_mutex_lock(&e->mu);
    sg->used = 1;
    pthread_mutex_unlock(&e->mu);
    *out = (xt_segment)i;
    return 0;
}

int xt_close_segment(xt_engine *e, xt_segment s)
{
    pthread_mutex_lock(&e->mu);
    struct xt_seg *sg = seg_get(e, s);
    if (!sg || atomic_load(&sg->inflight) > 0) {
        pthread_mutex_unlock(&e->mu);
        return sg ? -EBUSY : -EINVAL;
    }
    sg->used = 0;
    pthread_mutex_unlock(&e->mu);
    if (sg->tp->close_segment)
        sg->tp->close_segment(e, sg);
    for (int k = 0; k <= e->cfg.threads; k++)
        xt_conn_drop(sg, k);
    free(sg->conns);
    free(sg->peer_desc);
    pthread_mutex_destroy(&sg->ctl_mu);
    return 0;
}

int xt_peer_descriptor(xt_engine *e, xt_segment s, char *buf, size_t cap)
{
    pthread_mutex_lock(&e->mu);
    struct xt_seg *sg = seg_get(e, s);
    int n = sg ? snprintf(buf, cap, "%s", sg->peer_desc) : -EINVAL;
    pthread_mutex_unlock(&e->mu);
    return n >= 0 && (size_t)n >= cap ? -ENOSPC : n;
}

/* ---------- batches ---------- */

static struct xt_batchs *batch_get(xt_engine *e, xt_batch b)
{
    return b >= 0 && (size_t)b < e->nbatches && e->batches[b]->used ? e->batches[b] : NULL;
}

int xt_alloc_batch(xt_engine *e, size_t max, xt_batch *out)
{
    if (!e || !out || !max || max > (1u << 24))
        return -EINVAL;
    struct xt_task *tasks = calloc(max, sizeof *tasks);
    if (!tasks)
        return -ENOMEM;
    pthread_mutex_lock(&e->mu);
    size_t i = 0;
    while (i < e->nbatches && e->batches[i]->used)
        i++;
    if (i == e->nbatches && !grow_one((void ***)&e->batches, &e->nbatches, sizeof(struct xt_batchs))) {
        pthread_mutex_unlock(&e->mu);
        free(tasks);
        return -ENOMEM;
    }
    struct xt_batchs *b = e->batches[i];
    memset(b, 0, sizeof *b);
    b->used = 1;
    b->max = max;
    b->tasks = tasks;
    pthread_mutex_unlock(&e->mu);
    *out = (xt_batch)i;
    return 0;
}

int xt_submit(xt_engine *e, xt_batch bid, const struct xt_request *reqs, size_t n)
{
    if (!e || (!reqs && n))
        return -EINVAL;
    for (size_t i = 0; i < n; i++) /* all or nothing: every request is checked before any moves */
        if ((reqs[i].opcode != XT_READ && reqs[i].opcode != XT_WRITE) || !reqs[i].length ||
            !xt_local_ok(e, reqs[i].local, reqs[i].length))
            return -EINVAL;
    pthread_mutex_lock(&e->mu);
    struct xt_batchs *b = batch_get(e, bid);
    int rc = !b ? -EINVAL : b->n + n > b->max ? -ENOSPC : 0;
    for (size_t i = 0; !rc && i < n; i++)
        if (!seg_get(e, reqs[i].segment))
            rc = -EINVAL;
    if (rc) {
        pthread_mutex_unlock(&e->mu);
        return rc;
    }
    struct xt_slice *head = NULL, *tail = NULL;
    size_t first = b->n;
    for (size_t i = 0; i < n && !rc; i++) {
        struct xt_task *t = &b->tasks[first + i];
        size_t sb = e->segs[reqs[i].segment]->max_slice;
        size_t slices = (reqs[i].length + sb - 1) / sb;
        atomic_store(&t->remaining, (int)slices);
        atomic_store(&t->transferred, 0);
        atomic_store(&t->error, 0);
        t->state = XT_PENDING;
        for (size_t k = 0; k < slices; k++) {
            struct xt_slice *sl = calloc(1, sizeof *sl);
            if (!sl) {
                rc = -ENOMEM;
                break;
            }
            size_t off = k * sb;
            sl->batch = bid;
            sl->task = first + i;
            sl->opcode = reqs[i].opcode;
            sl->local = (char *)reqs[i].local + off;
            sl->seg = reqs[i].segment;
            sl->remote = reqs[i].remote + off;
            sl->len = reqs[i].length - off < sb ? reqs[i].length - off : sb;
            if (sl->opcode == XT_WRITE)
                atomic_fetch_add(&e->segs[sl->seg]->inflight_writes, 1);
            atomic_fetch_add(&e->segs[sl->seg]->inflight, 1);
            if (tail)
                tail->next = sl;
            else
                head = sl;
            tail = sl;
        }
    }
    if (rc) { /* out of memory while slicing: nothing was queued */
        for (struct xt_slice *s = head, *nx; s; s = nx) {
            nx = s->next;
            if (s->opcode == XT_WRITE)
                atomic_fetch_sub(&e->segs[s->seg]->inflight_writes, 1);
            atomic_fetch_sub(&e->segs[s->seg]->inflight, 1);
            free(s);
        }
        pthread_mutex_unlock(&e->mu);
        return rc;
    }
    b->n += n;
    b->pending += (int)n;
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_lock(&e->q_mu);
    if (e->q_tail)
        e->q_tail->next = head;
    else
        e->q_head = head;
    e->q_tail = tail;
    pthread_cond_broadcast(&e->q_cond);
    pthread_mutex_unlock(&e->q_mu);
    return 0;
}

int xt_task_status(xt_engine *e, xt_batch bid, size_t task, struct xt_task_status *st)
{
    if (!e || !st)
        return -EINVAL;
    pthread_mutex_lock(&e->mu);
    struct xt_batchs *b = batch_get(e, bid);
    int rc = !b || task >= b->n ? -EINVAL : 0;
    if (!rc) {
        struct xt_task *t = &b->tasks[task];
        st->state = t->state;
        st->transferred = atomic_load(&t->transferred);
        st->error = atomic_load(&t->error);
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

static int batch_state(struct xt_batchs *b)
{
    if (b->pending > 0)
        return XT_PENDING;
    for (size_t i = 0; i < b->n; i++)
        if (b->tasks[i].state == XT_FAILED)
            return XT_FAILED;
    return XT_COMPLETED;
}

int xt_batch_status(xt_engine *e, xt_batch bid, int *state)
{
    pthread_mutex_lock(&e->mu);
    struct xt_batchs *b = batch_get(e, bid);
    if (b)
        *state = batch_state(b);
    pthread_mutex_unlock(&e->mu);
    return b ? 0 : -EINVAL;
}

static void deadline_after(struct timespec *ts, int ms)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

int xt_wait_batch(xt_engine *e, xt_batch bid, int timeout_ms, int *state)
{
    struct timespec ts;
    if (timeout_ms >= 0)
        deadline_after(&ts, timeout_ms);
    pthread_mutex_lock(&e->mu);
    struct xt_batchs *b = batch_get(e, bid);
    int rc = b ? 0 : -EINVAL;
    while (!rc && b->pending > 0) {
        rc = timeout_ms < 0 ? pthread_cond_wait(&e->cond, &e->mu) : pthread_cond_timedwait(&e->cond, &e->mu, &ts);
        rc = rc == ETIMEDOUT ? -ETIMEDOUT : 0;
        b = batch_get(e, bid);
    }
    if (b && state)
        *state = batch_state(b);
    pthread_mutex_unlock(&e->mu);
    return rc;
}

int xt_free_batch(xt_engine *e, xt_batch bid)
{
    pthread_mutex_lock(&e->mu);
    struct xt_batchs *b = batch_get(e, bid);
    int rc = !b ? -EINVAL : b->pending > 0 ? -EBUSY : 0;
    if (!rc) {
        free(b->tasks);
        memset(b, 0, sizeof *b);
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

/* ---------- notifications ---------- */

int xt_send_notify(xt_engine *e, xt_segment s, const char *msg)
{
    if (!e || !msg || strlen(msg) >= sizeof(((struct xt_notify *)0)->msg))
        return -EINVAL;
    struct timespec ts;
    deadline_after(&ts, e->cfg.io_timeout_ms);
    pthread_mutex_lock(&e->mu);
    struct xt_seg *sg = seg_get(e, s);
    int rc = sg ? 0 : -EINVAL;
    while (!rc && atomic_load(&sg->inflight_writes) > 0) /* delivered only after earlier writes landed */
        if (pthread_cond_timedwait(&e->cond, &e->mu, &ts) == ETIMEDOUT)
            rc = -ETIMEDOUT;
    pthread_mutex_unlock(&e->mu);
    if (rc)
        return rc;
    char buf[sizeof(struct xt_notify)];
    size_t nl = strlen(e->name), ml = strlen(msg);
    memcpy(buf, e->name, nl + 1);
    memcpy(buf + nl + 1, msg, ml);
    pthread_mutex_lock(&sg->ctl_mu);
    int slot = e->cfg.threads;
    struct xt_hdr ack;
    int fd = xt_conn_fd(e, sg, slot);
    rc = fd < 0 ? fd : exchange(e, fd, XF_NOTIFY, buf, (uint32_t)(nl + 1 + ml), &ack, NULL);
    if (rc)
        xt_conn_drop(sg, slot);
    pthread_mutex_unlock(&sg->ctl_mu);
    return rc;
}

int xt_get_notifies(xt_engine *e, struct xt_notify *out, size_t max)
{
    pthread_mutex_lock(&e->n_mu);
    size_t k = e->nnotes < max ? e->nnotes : max;
    if (k) {
        memcpy(out, e->notes, k * sizeof *out);
        memmove(e->notes, e->notes + k, (e->nnotes - k) * sizeof *out);
        e->nnotes -= k;
    }
    pthread_mutex_unlock(&e->n_mu);
    return (int)k;
}
