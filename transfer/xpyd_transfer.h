/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_transfer.h - libxpyd_transfer: move bytes (KV blocks) between registered memory of two processes.
 *
 * In the style of Mooncake's transfer_engine_c.h: create an engine (name, control address, transport),
 * register memory, open a peer's segment by its control address, submit batches of READ/WRITE requests
 * {local address, segment, remote address, length}, poll task and batch status, send notifications that
 * are delivered only after the data written before them has landed.
 *
 * Transports: "rdma" (libibverbs, RC queue pairs, one-sided READ/WRITE, slices striped over NICs and QPs),
 * "tcp" (persistent per-peer connections, the receiver validates every range against its registered
 * buffers, a WRITE completes only when the peer acknowledged that the bytes were applied) and "auto" (rdma
 * when a device is usable, else tcp, and the engine says so). Every function returns 0 or a negative errno; the library never aborts or
 * exits its host process, and never raises SIGPIPE. Thread-safe: any thread may submit and poll. */
#ifndef XPYD_TRANSFER_H
#define XPYD_TRANSFER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library's interface: the only symbols libxpyd_transfer.so exports (it is built with hidden visibility). */
#if defined(__GNUC__)
#define XT_API __attribute__((visibility("default")))
#else
#define XT_API
#endif

typedef struct xt_engine xt_engine;
typedef int64_t xt_segment;   /* an opened peer segment (>= 0) */
typedef int64_t xt_batch;     /* a batch of requests (>= 0) */

struct xt_config {
    const char *name;           /* this engine's name (logs, descriptor); required */
    const char *listen_host;    /* control/data listener; default 127.0.0.1 */
    int listen_port;            /* 0 = any free port (see xt_engine_port) */
    const char *transport;      /* "tcp", "rdma" or "auto" (default: rdma when a device is usable, else tcp) */
    const char *rdma_devices;   /* "mlx5_0,mlx5_1": only these devices (default: all) */
    int gid_index;              /* RoCE GID index, used when gid_index_set (default: the first IPv4-mapped
                                   GID, i.e. routable RoCEv2, else the first non-zero one) */
    int gid_index_set;
    int threads;                /* initiator worker threads = parallel streams per peer; default 4 */
    size_t slice_bytes;         /* requests are cut into slices of this size; default 1 MiB */
    size_t max_frame_bytes;     /* largest control frame accepted; default slice_bytes + 64 KiB */
    int io_timeout_ms;          /* a peer silent this long fails the slice; default 10000 */
    int verbose;                /* 1: log transport choice and first errors to stderr */
};

enum xt_opcode { XT_READ = 0, XT_WRITE = 1 };

struct xt_request {
    int opcode;                 /* XT_READ: remote -> local; XT_WRITE: local -> remote */
    void *local;                /* inside memory registered with this engine */
    xt_segment segment;
    uint64_t remote;            /* address inside a buffer the peer registered */
    size_t length;
};

enum xt_state { XT_PENDING = 0, XT_COMPLETED = 1, XT_FAILED = 2 };

struct xt_task_status {
    int state;                  /* enum xt_state */
    size_t transferred;         /* bytes moved so far */
    int error;                  /* first negative errno when FAILED */
};

struct xt_notify {
    char name[64];              /* the sender engine's name */
    char msg[448];
};

XT_API int xt_engine_create(const struct xt_config *cfg, xt_engine **out);
XT_API void xt_engine_destroy(xt_engine *e);
XT_API int xt_engine_port(const xt_engine *e);
XT_API const char *xt_engine_transport(const xt_engine *e); /* "rdma" or "tcp" */

/* Registers [addr, addr+len) as readable and writable by peers. Overlaps are refused (-EEXIST). */
XT_API int xt_register_memory(xt_engine *e, void *addr, size_t len, const char *location);
XT_API int xt_unregister_memory(xt_engine *e, void *addr);
/* This engine's segment descriptor as JSON: name, host, port, transport, buffers [{addr, len, location}]. */
XT_API int xt_segment_descriptor(xt_engine *e, char *buf, size_t cap);

/* Opens the peer listening at "host:port" (handshake: descriptor exchange). Returns a segment handle; a peer
 * that is already open gives the same handle (after a failure, close it to reconnect). */
XT_API int xt_open_segment(xt_engine *e, const char *peer, xt_segment *out);
XT_API int xt_close_segment(xt_engine *e, xt_segment seg);
/* The peer's descriptor as received in the handshake. */
XT_API int xt_peer_descriptor(xt_engine *e, xt_segment seg, char *buf, size_t cap);

XT_API int xt_alloc_batch(xt_engine *e, size_t max_requests, xt_batch *out);
/* Queues n requests; their task ids are the batch's next n indices. -EINVAL for a request outside this
 * engine's registered memory or an unknown segment; -ENOSPC beyond max_requests. */
XT_API int xt_submit(xt_engine *e, xt_batch b, const struct xt_request *reqs, size_t n);
XT_API int xt_task_status(xt_engine *e, xt_batch b, size_t task, struct xt_task_status *st);
/* XT_COMPLETED when every task is, XT_FAILED when any failed and none is pending, else XT_PENDING. */
XT_API int xt_batch_status(xt_engine *e, xt_batch b, int *state);
/* Waits until the batch is no longer pending (timeout_ms < 0: no limit). -ETIMEDOUT. */
XT_API int xt_wait_batch(xt_engine *e, xt_batch b, int timeout_ms, int *state);
/* Frees the batch; -EBUSY while tasks are still moving. */
XT_API int xt_free_batch(xt_engine *e, xt_batch b);

/* Sends msg to the peer, after every WRITE submitted to that segment before this call has landed. */
XT_API int xt_send_notify(xt_engine *e, xt_segment seg, const char *msg);
/* Takes up to max notifications received (oldest first); returns how many. */
XT_API int xt_get_notifies(xt_engine *e, struct xt_notify *out, size_t max);

/* A non-blocking eventfd that becomes readable when a task finishes or a notification arrives (read 8 bytes
 * to clear it): an event loop polls xt_batch_status / xt_get_notifies when it fires instead of on a timer. */
XT_API int xt_engine_event_fd(const xt_engine *e);

/* Bytes this engine moved as initiator, and served as target (monitoring). */
XT_API void xt_engine_counters(xt_engine *e, uint64_t *bytes_initiated, uint64_t *bytes_served);

#ifdef __cplusplus
}
#endif
#endif
