/* SPDX-License-Identifier: Apache-2.0 */
/* xt_internal.h - libxpyd_transfer internals: the engine, its registry, batches, the wire format, the
 * transports' ops table and the descriptor reader. */
#ifndef XT_INTERNAL_H
#define XT_INTERNAL_H

#include "xpyd_transfer.h"

#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

/* ---- wire: every frame is a fixed header, then `len` payload bytes (little-endian on the wire) ---- */
enum xt_frame {
    XF_HELLO = 1,     /* initiator -> target: payload = initiator descriptor (JSON) */
    XF_HELLO_ACK,     /* target -> initiator: payload = target descriptor (JSON) */
    XF_READ,          /* addr, size: the target answers XF_DATA */
    XF_DATA,          /* status; payload = the bytes read when status == 0 */
    XF_WRITE,         /* addr, size; payload = the bytes; the target answers XF_ACK once applied */
    XF_ACK,           /* status */
    XF_NOTIFY,        /* payload = name '\0' msg; answered XF_ACK */
    XF_PROBE,         /* answered XF_ACK */
    XF_QP,            /* rdma: QP handshake (addr = the target NIC index); answered XF_QP */
};

struct xt_hdr {
    uint32_t magic;   /* XT_MAGIC */
    uint32_t len;     /* payload bytes after the header */
    uint32_t type;
    int32_t status;   /* 0 or negative errno */
    uint64_t seq;
    uint64_t addr;
    uint64_t size;
};
#define XT_MAGIC 0x78707964u /* "xpyd" */

int xt_send_all(int fd, const void *buf, size_t n);
int xt_recv_all(int fd, void *buf, size_t n);
int xt_send_hdr(int fd, const struct xt_hdr *h);
int xt_recv_hdr(int fd, struct xt_hdr *h, size_t max_len);
int xt_connect(const char *host, int port, int timeout_ms);
void xt_set_timeouts(int fd, int ms);

/* ---- engine ---- */
#define XT_MAX_NICS 8
#define XT_PIPELINE 8 /* slices one worker hands its transport at once (tcp keeps them in flight together) */
#define XT_SERVED_QPS 512

struct xt_region {
    uintptr_t addr;
    size_t len;
    char location[32];
    struct ibv_mr *mr[XT_MAX_NICS]; /* rdma: one registration per device */
};

struct xt_nic { /* one RDMA device in use */
    char name[64];
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq **cqs;       /* one per worker */
    struct ibv_cq *target_cq;  /* for QPs made on peers' requests (never polled: peers post one-sided) */
    uint16_t lid;
    enum ibv_mtu mtu;
    int gid_index;
    union ibv_gid gid;
};

struct xt_rseg;

struct xt_conn {
    int fd;                     /* -1 when not connected */
};

struct xt_seg {
    int used;
    char host[256];
    int port;
    char *peer_desc;            /* the target's descriptor (owned) */
    size_t max_slice;           /* min(our slice size, the peer's frame limit) */
    struct xt_conn *conns;      /* one per worker thread, and [threads] = control (notify) */
    pthread_mutex_t ctl_mu;
    atomic_int inflight_writes; /* WRITE slices submitted and not yet acked */
    atomic_int inflight;        /* slices of any kind not finished */
    const struct xt_transport_ops *tp; /* the transport its slices take (rdma when both sides have it) */
    struct xt_rseg *rdma;       /* rdma QPs and the peer's rkeys, or NULL (tcp) */
    atomic_uint rr;             /* NIC pair round robin */
};

struct xt_task {
    atomic_int remaining;       /* slices not finished */
    atomic_size_t transferred;
    atomic_int error;           /* first error, 0 none */
    int state;                  /* enum xt_state, under e->mu once final */
};

struct xt_batchs {
    int used;
    size_t max, n;
    struct xt_task *tasks;
    int pending;                /* tasks not final, under e->mu */
};

struct xt_slice {
    struct xt_slice *next;
    xt_batch batch;
    size_t task;
    int opcode;
    char *local;
    xt_segment seg;
    uint64_t remote;
    size_t len;
};

struct xt_engine {
    struct xt_config cfg;
    char name[64], host[256];
    int port;
    int lfd;                    /* listener */
    int wake[2];                /* wakes the accept thread at shutdown */
    pthread_t accept_th;
    atomic_int stopping;
    /* registry */
    pthread_rwlock_t reg_lock;
    struct xt_region *regions;
    size_t nregions, capregions;
    /* served connections */
    pthread_mutex_t conns_mu;
    struct xt_served *served;
    /* segments and batches, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cond;        /* batches finishing, writes landing */
    struct xt_seg **segs;       /* each allocated once, never moved */
    size_t nsegs;
    struct xt_batchs **batches; /* each allocated once, never moved */
    size_t nbatches;
    atomic_int next_slot;
    /* work queue */
    pthread_mutex_t q_mu;
    pthread_cond_t q_cond;
    struct xt_slice *q_head, *q_tail;
    pthread_t *workers;
    /* notifications received */
    pthread_mutex_t n_mu;
    struct xt_notify *notes;
    size_t nnotes, capnotes;
    atomic_uint_fast64_t bytes_initiated, bytes_served;
    atomic_int logged_error;
    int evfd;                   /* eventfd written when a task ends or a notification arrives */
    const struct xt_transport_ops *tp; /* the local transport: tcp, or rdma when a device is usable */
    struct xt_nic nics[XT_MAX_NICS];
    int nnics;
};

struct xt_served {
    struct xt_served *next;
    xt_engine *e;
    int fd;
    pthread_t th;
    int done;
    struct ibv_qp *qps[XT_SERVED_QPS]; /* rdma QPs made for this peer, destroyed when it goes */
    int nqps;
};

/* ---- the one descriptor reader (xt_desc.c) ---- */
struct xt_desc_buf {
    uint64_t addr, len;
    uint32_t rkey[XT_MAX_NICS];
    int nrkeys;
};
struct xt_desc {
    int rdma;               /* the peer's transport is rdma */
    uint64_t max_frame;     /* the largest frame it accepts, 0 unknown */
    int nnics;              /* its RDMA devices */
    struct xt_desc_buf *bufs;
    size_t nbufs;
};
int xt_desc_parse(const char *json, struct xt_desc *d); /* 0, or -EPROTO / -ENOMEM; free with xt_desc_free */
void xt_desc_free(struct xt_desc *d);

/* ---- transports: what differs between tcp (xt_tcp.c) and rdma (xt_rdma.c); NULL hooks do nothing ---- */
/* 1 when addr is GPU memory according to the CUDA driver (libcuda.so.1, opened with dlopen on first use when
 * it exists; without it, or for host memory, 0). Any thread. */
int xt_is_device_memory(const void *addr);

struct xt_transport_ops {
    const char *name;
    int (*init)(xt_engine *e);                 /* 0, or -ENODEV when no device is usable */
    void (*fini)(xt_engine *e);
    int (*reg)(xt_engine *e, struct xt_region *r);
    void (*dereg)(xt_engine *e, struct xt_region *r);
    /* descriptor fields: the engine's (r NULL) or one registered buffer's */
    size_t (*describe)(xt_engine *e, const struct xt_region *r, char *buf, size_t cap);
    /* target side: a peer's QP handshake frame; its QPs go when its connection does */
    int (*serve_qp)(xt_engine *e, struct xt_served *sv, const struct xt_hdr *h, const void *payload);
    void (*served_close)(struct xt_served *sv);
    /* initiator side */
    int (*open_segment)(xt_engine *e, struct xt_seg *sg, const struct xt_desc *peer);
    void (*close_segment)(xt_engine *e, struct xt_seg *sg);
    /* moves n slices of one worker to one segment; rcs[i] = each slice's result */
    void (*slices)(xt_engine *e, struct xt_seg *sg, int worker, struct xt_slice **sls, int n, int *rcs);
};
extern const struct xt_transport_ops xt_transport_tcp, xt_transport_rdma;

/* ---- frames (xt_frame.c) ---- */
int xt_frame_reply(int fd, uint32_t type, uint64_t seq, int status, const void *payload, uint32_t len);
int xt_frame_discard(int fd, size_t n); /* reads and drops n payload bytes */

/* ---- registered memory, descriptor, shared services (xt_mem.c) ---- */
/* 1 when [addr, addr+len) lies inside one registered region. Caller holds reg_lock. */
int xt_range_ok(const xt_engine *e, uint64_t addr, uint64_t len);
int xt_local_ok(xt_engine *e, const void *p, size_t len); /* takes reg_lock itself */
int xt_describe(xt_engine *e, char *buf, size_t cap);
void xt_log_error(xt_engine *e, const char *what, int err);
void xt_wake(xt_engine *e); /* makes xt_engine_event_fd readable */

/* ---- serving side (xt_serve.c): the listener and one thread per peer connection ---- */
int xt_serve_start(xt_engine *e);
void xt_serve_stop(xt_engine *e);

/* ---- connections to peers (xt_tcp.c): per worker slot, made on first use ---- */
int xt_conn_fd(xt_engine *e, struct xt_seg *sg, int slot);
void xt_conn_drop(struct xt_seg *sg, int slot);

#endif
