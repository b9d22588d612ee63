/* SPDX-License-Identifier: Apache-2.0 */
/* xt_bench.c - xpyd_transfer_bench, in the spirit of Mooncake's transfer_engine_bench.
 *
 *   target:    xpyd_transfer_bench --mode target [--port N] [--buffer-size BYTES]
 *   initiator: xpyd_transfer_bench --mode initiator --target HOST:PORT [--operation read|write]
 *              [--block-size BYTES] [--batch-size N] [--threads N] [--duration SECONDS]
 *
 * The target registers one buffer filled with a known pattern; the initiator moves batches of blocks
 * between its own registered buffer and the target's for --duration seconds with --threads submitting
 * threads (and as many engine streams), verifies the data it moved (reads: against the pattern; writes:
 * read back and compared) and prints a final line with the throughput in GB/s and batch latency
 * percentiles. --protocol tcp|rdma picks the transport (rdma needs a device; --device mlx5_0,mlx5_1 limits
 * which ones are used). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "xpyd_transfer.h"
#include "xt_internal.h" /* xt_desc_parse: the one descriptor reader */
#include "xpyd_version.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static struct {
    const char *mode, *target, *op, *protocol, *device;
    int port, threads, batch, duration;
    size_t block, buffer;
} O = {"initiator", NULL, "read", "tcp", NULL, 0, 4, 16, 5, 1 << 20, 256u << 20};

static volatile sig_atomic_t stop;
static void on_sig(int s) { stop = 1; }

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* The target's content: word i of the buffer is a function of i, so any range can be checked. */
static uint64_t pattern(uint64_t word) { return word * 0x9e3779b97f4a7c15ULL ^ 0x5eed; }

static size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1024 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
    default: break;
    }
    return v > 0 ? (size_t)v : 0;
}

static void usage(FILE *f)
{
    fputs("usage: xpyd_transfer_bench --mode target|initiator [options]\n"
          "Measures libxpyd_transfer: a target registers a buffer, an initiator reads or writes it in batches.\n"
          "  --mode target|initiator      the side this process plays (initiator)\n"
          "  --protocol tcp|rdma          transport (tcp)\n"
          "  --port N                     target: the port to listen on (0: any, printed)\n"
          "  --target HOST:PORT           initiator: the target to move data with\n"
          "  --operation read|write       initiator: direction (read)\n"
          "  --block-size BYTES           bytes per transfer request, a multiple of 8 (1M; K/M/G suffixes)\n"
          "  --batch-size N               requests per batch (16)\n"
          "  --threads N                  initiator threads, 1-64 (4)\n"
          "  --duration SECONDS           how long the initiator runs (5)\n"
          "  --buffer-size BYTES          registered buffer per side, at least the block size (256M)\n"
          "  --device NAME[,NAME]         rdma: the NICs to use (all)\n"
          "  -h, --help                   this text\n"
          "  --version                    version and git revision\n",
          f);
}

static int run_target(void)
{
    struct xt_config c = {.name = "bench-target", .listen_port = O.port, .transport = O.protocol,
                          .rdma_devices = O.device, .threads = O.threads,
                          .slice_bytes = O.block < (4u << 20) ? (O.block < 65536 ? 65536 : O.block) : (4u << 20),
                          .verbose = 1};
    xt_engine *e;
    int rc = xt_engine_create(&c, &e);
    if (rc) {
        fprintf(stderr, "xpyd_transfer_bench: cannot start the engine: %s%s\n", strerror(-rc),
                rc == -ENODEV ? " (no usable RDMA device)" : "");
        return 1;
    }
    uint64_t *buf = aligned_alloc(4096, O.buffer);
    if (!buf)
        return 1;
    for (size_t i = 0; i < O.buffer / 8; i++)
        buf[i] = pattern(i);
    if ((rc = xt_register_memory(e, buf, O.buffer, "cpu:0")) != 0) {
        fprintf(stderr, "xpyd_transfer_bench: register: %s\n", strerror(-rc));
        return 1;
    }
    printf("target ready port %d buffer %zu bytes transport %s\n", xt_engine_port(e), O.buffer,
           xt_engine_transport(e));
    fflush(stdout);
    while (!stop)
        pause();
    uint64_t served;
    xt_engine_counters(e, NULL, &served);
    xt_engine_destroy(e);
    free(buf);
    printf("target served %" PRIu64 " bytes\n", served);
    return 0;
}

struct worker {
    pthread_t th;
    int id;
    xt_engine *e;
    xt_segment seg;
    uint64_t remote_base;
    size_t remote_len;
    char *local;
    uint64_t bytes, verified, batches, *lat;
    size_t nlat, caplat;
    int failed;
};

static int verify_read(const char *local, uint64_t remote_off, size_t len)
{
    const uint64_t *w = (const uint64_t *)local;
    for (size_t i = 0; i < len / 8; i++)
        if (w[i] != pattern(remote_off / 8 + i))
            return -1;
    return 0;
}

static void *initiator_thread(void *arg)
{
    struct worker *w = arg;
    size_t span = (size_t)O.batch * O.block;
    /* each thread owns a disjoint window of the target's buffer */
    uint64_t window = (uint64_t)w->id * span % (w->remote_len - span + 1);
    window -= window % 8;
    int write = strcmp(O.op, "write") == 0;
    struct xt_request *reqs = calloc((size_t)O.batch, sizeof *reqs);
    uint64_t deadline = now_us() + (uint64_t)O.duration * 1000000u;
    for (uint64_t iter = 0; !stop && (iter == 0 || now_us() < deadline); iter++) {
        xt_batch b;
        if (xt_alloc_batch(w->e, (size_t)O.batch, &b) != 0) {
            w->failed = 1;
            break;
        }
        for (int k = 0; k < O.batch; k++)
            reqs[k] = (struct xt_request){write ? XT_WRITE : XT_READ, w->local + (size_t)k * O.block, w->seg,
                                          w->remote_base + window + (uint64_t)k * O.block, O.block};
        if (write && iter == 0) /* the bytes written are the target's own pattern, so a later read checks them */
            for (size_t i = 0; i < span / 8; i++)
                ((uint64_t *)w->local)[i] = pattern(window / 8 + i);
        uint64_t t0 = now_us();
        int st = XT_FAILED;
        if (xt_submit(w->e, b, reqs, (size_t)O.batch) != 0 || xt_wait_batch(w->e, b, 60000, &st) != 0 ||
            st != XT_COMPLETED) {
            w->failed = 1;
            xt_free_batch(w->e, b);
            break;
        }
        xt_free_batch(w->e, b);
        if (w->nlat == w->caplat) {
            w->caplat = w->caplat ? w->caplat * 2 : 1024;
            w->lat = realloc(w->lat, w->caplat * sizeof *w->lat);
        }
        w->lat[w->nlat++] = now_us() - t0;
        w->bytes += span;
        w->batches++;
        if (!write && (iter == 0 || now_us() >= deadline)) {
            if (verify_read(w->local, window, span) != 0) {
                fprintf(stderr, "xpyd_transfer_bench: thread %d: data read does not match the target's\n", w->id);
                w->failed = 1;
                break;
            }
            w->verified += span;
        }
    }
    if (write && !w->failed) { /* read the window back and compare: the writes landed intact */
        memset(w->local, 0, span);
        xt_batch b;
        int st = XT_FAILED;
        for (int k = 0; k < O.batch; k++)
            reqs[k].opcode = XT_READ;
        if (xt_alloc_batch(w->e, (size_t)O.batch, &b) == 0 && xt_submit(w->e, b, reqs, (size_t)O.batch) == 0 &&
            xt_wait_batch(w->e, b, 60000, &st) == 0 && st == XT_COMPLETED && verify_read(w->local, window, span) == 0)
            w->verified += span;
        else {
            fprintf(stderr, "xpyd_transfer_bench: thread %d: written data did not read back intact\n", w->id);
            w->failed = 1;
        }
        xt_free_batch(w->e, b);
    }
    free(reqs);
    return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int run_initiator(void)
{
    if (!O.target) {
        usage(stderr);
        return 2;
    }
    struct xt_config c = {.name = "bench-initiator", .transport = O.protocol, .rdma_devices = O.device,
                          .threads = O.threads,
                          .slice_bytes = O.block < (4u << 20) ? (O.block < 65536 ? 65536 : O.block) : (4u << 20),
                          .verbose = 1};
    xt_engine *e;
    int rc = xt_engine_create(&c, &e);
    xt_segment seg;
    if (!rc)
        rc = xt_open_segment(e, O.target, &seg);
    if (rc) {
        fprintf(stderr, "xpyd_transfer_bench: cannot reach %s: %s\n", O.target, strerror(-rc));
        return 1;
    }
    char desc[65536];
    struct xt_desc pd;
    if (xt_peer_descriptor(e, seg, desc, sizeof desc) < 0 || xt_desc_parse(desc, &pd) != 0 || pd.nbufs == 0) {
        fprintf(stderr, "xpyd_transfer_bench: the target registered no buffer\n");
        return 1;
    }
    uint64_t base = pd.bufs[0].addr, rlen = pd.bufs[0].len;
    xt_desc_free(&pd);
    size_t span = (size_t)O.batch * O.block;
    if (span > rlen) {
        fprintf(stderr, "xpyd_transfer_bench: batch-size x block-size exceeds the target's buffer\n");
        return 1;
    }
    struct worker *ws = calloc((size_t)O.threads, sizeof *ws);
    char *local = aligned_alloc(4096, span * (size_t)O.threads);
    if (!ws || !local || xt_register_memory(e, local, span * (size_t)O.threads, "cpu:0") != 0)
        return 1;
    uint64_t t0 = now_us();
    for (int i = 0; i < O.threads; i++) {
        ws[i] = (struct worker){.id = i, .e = e, .seg = seg, .remote_base = base, .remote_len = rlen,
                                .local = local + (size_t)i * span};
        pthread_create(&ws[i].th, NULL, initiator_thread, &ws[i]);
    }
    uint64_t bytes = 0, verified = 0, nb = 0;
    int failed = 0;
    uint64_t *lat = NULL;
    size_t nlat = 0;
    for (int i = 0; i < O.threads; i++) {
        pthread_join(ws[i].th, NULL);
        bytes += ws[i].bytes;
        verified += ws[i].verified;
        nb += ws[i].batches;
        failed |= ws[i].failed;
        lat = realloc(lat, (nlat + ws[i].nlat) * sizeof *lat);
        memcpy(lat + nlat, ws[i].lat, ws[i].nlat * sizeof *lat);
        nlat += ws[i].nlat;
        free(ws[i].lat);
    }
    double secs = (double)(now_us() - t0) / 1e6;
    qsort(lat, nlat, sizeof *lat, cmp_u64);
    uint64_t p50 = nlat ? lat[nlat / 2] : 0, p99 = nlat ? lat[(nlat * 99) / 100 < nlat ? (nlat * 99) / 100 : nlat - 1] : 0;
    printf("operation=%s protocol=%s block_size=%zu batch_size=%d threads=%d batches=%" PRIu64 " bytes=%" PRIu64
           " verified_bytes=%" PRIu64 " seconds=%.2f throughput=%.3f GB/s batch_latency_p50_us=%" PRIu64
           " batch_latency_p99_us=%" PRIu64 "%s\n",
           O.op, xt_engine_transport(e), O.block, O.batch, O.threads, nb, bytes, verified, secs,
           (double)bytes / secs / 1e9, p50, p99, failed ? " FAILED" : "");
    free(lat);
    xt_engine_destroy(e);
    free(local);
    free(ws);
    return failed ? 1 : 0;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"mode", 1, 0, 'm'},       {"protocol", 1, 0, 'P'},  {"port", 1, 0, 'p'},       {"target", 1, 0, 't'},
        {"operation", 1, 0, 'o'},  {"block-size", 1, 0, 'b'}, {"batch-size", 1, 0, 'B'}, {"threads", 1, 0, 'T'},
        {"duration", 1, 0, 'd'},   {"device", 1, 0, 'D'},    {"buffer-size", 1, 0, 'S'}, {"help", 0, 0, 'h'},
        {"version", 0, 0, 'V'},     {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': O.mode = optarg; break;
        case 'P': O.protocol = optarg; break;
        case 'p': O.port = atoi(optarg); break;
        case 't': O.target = optarg; break;
        case 'o': O.op = optarg; break;
        case 'b': O.block = parse_size(optarg); break;
        case 'B': O.batch = atoi(optarg); break;
        case 'T': O.threads = atoi(optarg); break;
        case 'd': O.duration = atoi(optarg); break;
        case 'D': O.device = optarg; break;
        case 'S': O.buffer = parse_size(optarg); break;
        case 'h': usage(stdout); return 0;
        case 'V': xpyd_print_version("xpyd_transfer_bench"); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (O.block < 8 || O.block % 8 || O.batch < 1 || O.threads < 1 || O.threads > 64 || O.duration < 1 ||
        O.buffer < O.block || (strcmp(O.op, "read") && strcmp(O.op, "write"))) {
        fprintf(stderr, "xpyd_transfer_bench: block-size must be a multiple of 8, counts positive\n");
        return 2;
    }
    if (strcmp(O.protocol, "tcp") != 0 && strcmp(O.protocol, "rdma") != 0) {
        fprintf(stderr, "xpyd_transfer_bench: --protocol must be tcp or rdma\n");
        return 2;
    }
    signal(SIGINT, on_sig);
    signal(SIGTERM, on_sig);
    signal(SIGPIPE, SIG_IGN);
    if (!strcmp(O.mode, "target"))
        return run_target();
    if (!strcmp(O.mode, "initiator"))
        return run_initiator();
    usage(stderr);
    return 2;
}
