/* SPDX-License-Identifier: Apache-2.0 */
/* test_transfer.c - libxpyd_transfer over loopback TCP: two engines move data both ways with checksums,
 * ranges outside the peer's registered buffers are refused (and the connection stays usable), a
 * notification is delivered only after the writes before it landed, slices follow the peer's frame limit,
 * and a peer killed mid-transfer fails the batch cleanly within the I/O timeout (nothing hangs). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "xpyd_transfer.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static xt_engine *mk(const char *name, size_t slice, size_t max_frame)
{
    struct xt_config c = {.name = name, .transport = "tcp", .threads = 3, .slice_bytes = slice,
                          .max_frame_bytes = max_frame, .io_timeout_ms = 3000};
    xt_engine *e = NULL;
    assert_int_equal(xt_engine_create(&c, &e), 0);
    return e;
}

static xt_segment open_peer(xt_engine *e, xt_engine *peer)
{
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", xt_engine_port(peer));
    xt_segment s;
    assert_int_equal(xt_open_segment(e, addr, &s), 0);
    return s;
}

static uint64_t sum(const unsigned char *p, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

static int run(xt_engine *e, const struct xt_request *r, size_t n, int *task_err)
{
    xt_batch b;
    assert_int_equal(xt_alloc_batch(e, n, &b), 0);
    assert_int_equal(xt_submit(e, b, r, n), 0);
    int st = -1;
    assert_int_equal(xt_wait_batch(e, b, 20000, &st), 0);
    if (task_err) {
        struct xt_task_status ts;
        assert_int_equal(xt_task_status(e, b, 0, &ts), 0);
        *task_err = ts.error;
    }
    assert_int_equal(xt_free_batch(e, b), 0);
    return st;
}

static void write_then_read_with_checksums(void **state)
{
    xt_engine *a = mk("a", 65536, 0), *b = mk("b", 65536, 0);
    size_t n = (1 << 20) + 13; /* many slices, and an odd tail */
    unsigned char *src = malloc(n), *dst = calloc(1, n), *back = calloc(1, n);
    for (size_t i = 0; i < n; i++)
        src[i] = (unsigned char)(i * 131 + 7);
    assert_int_equal(xt_register_memory(a, src, n, "cpu:0"), 0);
    assert_int_equal(xt_register_memory(a, back, n, "cpu:0"), 0);
    assert_int_equal(xt_register_memory(b, dst, n, "cpu:0"), 0);
    assert_int_equal(xt_register_memory(b, dst + 10, 5, "cpu:0"), -EEXIST);
    xt_segment s = open_peer(a, b);
    struct xt_request w = {XT_WRITE, src, s, (uint64_t)(uintptr_t)dst, n};
    assert_int_equal(run(a, &w, 1, NULL), XT_COMPLETED);
    assert_true(sum(src, n) == sum(dst, n));
    struct xt_request r = {XT_READ, back, s, (uint64_t)(uintptr_t)dst, n};
    assert_int_equal(run(a, &r, 1, NULL), XT_COMPLETED);
    assert_memory_equal(src, back, n);
    uint64_t init, served;
    xt_engine_counters(a, &init, NULL);
    /* the target counts a READ once its bytes are sent, which may be just after the initiator has them all */
    for (int i = 0; i < 5000; i++) {
        xt_engine_counters(b, NULL, &served);
        if (served >= 2 * n)
            break;
        usleep(1000);
    }
    assert_true(init == 2 * n && served == 2 * n);
    char desc[1024];
    assert_true(xt_peer_descriptor(a, s, desc, sizeof desc) > 0);
    assert_non_null(strstr(desc, "\"name\":\"b\""));
    /* a request from memory this engine never registered is refused before anything moves */
    unsigned char stray[16];
    struct xt_request bad = {XT_WRITE, stray, s, (uint64_t)(uintptr_t)dst, sizeof stray};
    xt_batch bb;
    assert_int_equal(xt_alloc_batch(a, 1, &bb), 0);
    assert_int_equal(xt_submit(a, bb, &bad, 1), -EINVAL);
    assert_int_equal(xt_free_batch(a, bb), 0);
    xt_engine_destroy(a);
    xt_engine_destroy(b);
    free(src);
    free(dst);
    free(back);
}

static void out_of_range_refused(void **state)
{
    xt_engine *a = mk("a", 4096, 0), *b = mk("b", 4096, 0);
    unsigned char *loc = calloc(1, 8192), *tgt = calloc(1, 8192);
    memset(loc, 0xab, 8192);
    assert_int_equal(xt_register_memory(a, loc, 8192, NULL), 0);
    assert_int_equal(xt_register_memory(b, tgt, 4096, NULL), 0); /* only the first half is the peer's */
    xt_segment s = open_peer(a, b);
    int err = 0;
    struct xt_request w = {XT_WRITE, loc, s, (uint64_t)(uintptr_t)tgt + 2048, 4096}; /* runs 2 KiB past the end */
    assert_int_equal(run(a, &w, 1, &err), XT_FAILED);
    assert_int_equal(err, -EFAULT);
    struct xt_request r = {XT_READ, loc, s, (uint64_t)(uintptr_t)tgt + 4096, 16};
    assert_int_equal(run(a, &r, 1, &err), XT_FAILED);
    assert_int_equal(err, -EFAULT);
    for (int i = 0; i < 8192; i++)
        assert_int_equal(tgt[i], 0); /* nothing written anywhere */
    struct xt_request ok = {XT_WRITE, loc, s, (uint64_t)(uintptr_t)tgt, 4096};
    assert_int_equal(run(a, &ok, 1, NULL), XT_COMPLETED); /* the connection stayed usable */
    assert_int_equal(tgt[4095], 0xab);
    xt_engine_destroy(a);
    xt_engine_destroy(b);
    free(loc);
    free(tgt);
}

static void notify_after_landing(void **state)
{
    xt_engine *a = mk("sender", 16384, 0), *b = mk("receiver", 16384, 0);
    size_t n = 8 << 20;
    unsigned char *src = malloc(n), *dst = calloc(1, n);
    memset(src, 0x5a, n);
    assert_int_equal(xt_register_memory(a, src, n, NULL), 0);
    assert_int_equal(xt_register_memory(b, dst, n, NULL), 0);
    xt_segment s = open_peer(a, b);
    xt_batch bt;
    struct xt_request w = {XT_WRITE, src, s, (uint64_t)(uintptr_t)dst, n};
    assert_int_equal(xt_alloc_batch(a, 1, &bt), 0);
    assert_int_equal(xt_submit(a, bt, &w, 1), 0);
    assert_int_equal(xt_send_notify(a, s, "kv ready"), 0); /* right after submitting, not after waiting */
    struct xt_notify got[4];
    int k = 0;
    for (int i = 0; i < 2000 && k == 0; i++) {
        k = xt_get_notifies(b, got, 4);
        if (!k)
            usleep(1000);
    }
    assert_int_equal(k, 1);
    assert_string_equal(got[0].name, "sender");
    assert_string_equal(got[0].msg, "kv ready");
    assert_true(dst[0] == 0x5a && dst[n - 1] == 0x5a && sum(dst, n) == sum(src, n)); /* all landed before it */
    int st;
    assert_int_equal(xt_wait_batch(a, bt, 10000, &st), 0);
    assert_int_equal(st, XT_COMPLETED);
    assert_int_equal(xt_free_batch(a, bt), 0);
    xt_engine_destroy(a);
    xt_engine_destroy(b);
    free(src);
    free(dst);
}

static void slices_follow_peer_frame_limit(void **state)
{
    xt_engine *a = mk("a", 1 << 20, 0), *b = mk("b", 8192, 8192); /* b takes frames of 8 KiB at most */
    size_t n = 100000;
    unsigned char *src = malloc(n), *dst = calloc(1, n);
    for (size_t i = 0; i < n; i++)
        src[i] = (unsigned char)i;
    assert_int_equal(xt_register_memory(a, src, n, NULL), 0);
    assert_int_equal(xt_register_memory(b, dst, n, NULL), 0);
    xt_segment s = open_peer(a, b);
    struct xt_request w = {XT_WRITE, src, s, (uint64_t)(uintptr_t)dst, n};
    assert_int_equal(run(a, &w, 1, NULL), XT_COMPLETED);
    assert_memory_equal(src, dst, n);
    xt_engine_destroy(a);
    xt_engine_destroy(b);
    free(src);
    free(dst);
}

/* A target in a child process, killed while a large read from it is in flight. */
static void peer_death_fails_batch_cleanly(void **state)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    size_t n = 512u << 20;
    pid_t pid = fork();
    if (pid == 0) {
        xt_engine *t = mk("doomed", 65536, 0);
        char *buf = calloc(1, n);
        if (!buf || xt_register_memory(t, buf, n, NULL) != 0)
            _exit(1);
        int port = xt_engine_port(t);
        uint64_t addr = (uint64_t)(uintptr_t)buf;
        if (write(p[1], &port, sizeof port) != sizeof port || write(p[1], &addr, sizeof addr) != sizeof addr)
            _exit(1);
        pause();
        _exit(0);
    }
    int port;
    uint64_t addr;
    assert_int_equal(read(p[0], &port, sizeof port), (ssize_t)sizeof port);
    assert_int_equal(read(p[0], &addr, sizeof addr), (ssize_t)sizeof addr);
    xt_engine *a = mk("a", 65536, 0);
    char *loc = malloc(n);
    assert_int_equal(xt_register_memory(a, loc, n, NULL), 0);
    char peer[64];
    snprintf(peer, sizeof peer, "127.0.0.1:%d", port);
    xt_segment s;
    assert_int_equal(xt_open_segment(a, peer, &s), 0);
    xt_batch b;
    struct xt_request r[8];
    for (int i = 0; i < 8; i++)
        r[i] = (struct xt_request){XT_READ, loc + (size_t)i * (n / 8), s, addr + (uint64_t)i * (n / 8), n / 8};
    assert_int_equal(xt_alloc_batch(a, 8, &b), 0);
    assert_int_equal(xt_submit(a, b, r, 8), 0);
    usleep(20000);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    int st = -1;
    time_t t0 = time(NULL);
    assert_int_equal(xt_wait_batch(a, b, 30000, &st), 0); /* ends: no hang */
    assert_true(time(NULL) - t0 < 15);
    assert_int_equal(st, XT_FAILED);
    assert_int_equal(xt_free_batch(a, b), 0);
    xt_engine_destroy(a);
    free(loc);
    close(p[0]);
    close(p[1]);
}

static int readable(int fd, int ms)
{
    struct pollfd p = {fd, POLLIN, 0};
    return poll(&p, 1, ms) == 1;
}

static void event_fd_and_reopen(void **state)
{
    xt_engine *a = mk("a", 65536, 0), *b = mk("b", 65536, 0);
    char *src = calloc(1, 4096), *dst = calloc(1, 4096);
    assert_int_equal(xt_register_memory(a, src, 4096, NULL), 0);
    assert_int_equal(xt_register_memory(b, dst, 4096, NULL), 0);
    xt_segment s = open_peer(a, b), again = open_peer(a, b);
    assert_true(s == again); /* the same peer is the same segment */
    int fa = xt_engine_event_fd(a), fb = xt_engine_event_fd(b);
    assert_false(readable(fa, 0));
    xt_batch bt;
    struct xt_request w = {XT_WRITE, src, s, (uint64_t)(uintptr_t)dst, 4096};
    assert_int_equal(xt_alloc_batch(a, 1, &bt), 0);
    assert_int_equal(xt_submit(a, bt, &w, 1), 0);
    assert_true(readable(fa, 5000)); /* a task ended: no need to poll on a timer */
    uint64_t n;
    assert_int_equal(read(fa, &n, sizeof n), (ssize_t)sizeof n);
    int st;
    assert_int_equal(xt_batch_status(a, bt, &st), 0);
    assert_int_equal(st, XT_COMPLETED);
    assert_int_equal(xt_free_batch(a, bt), 0);
    assert_false(readable(fb, 0));
    assert_int_equal(xt_send_notify(a, s, "hi"), 0);
    assert_true(readable(fb, 5000)); /* a notification arrived */
    struct xt_notify got;
    assert_int_equal(xt_get_notifies(b, &got, 1), 1);
    xt_engine_destroy(a);
    xt_engine_destroy(b);
    free(src);
    free(dst);
}

/* The first error of an engine is logged in full, later ones are not repeated (no log flood). */
static void first_error_logged_once(void **state)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    int saved = dup(2);
    dup2(p[1], 2);
    xt_engine *a = mk("first-err", 4096, 0), *b = mk("peer", 4096, 0);
    char *loc = calloc(1, 4096), *tgt = calloc(1, 4096);
    assert_int_equal(xt_register_memory(a, loc, 4096, NULL), 0);
    assert_int_equal(xt_register_memory(b, tgt, 1024, NULL), 0);
    xt_segment s = open_peer(a, b);
    for (int i = 0; i < 3; i++) {
        struct xt_request w = {XT_WRITE, loc, s, (uint64_t)(uintptr_t)tgt + 512, 1024};
        assert_int_equal(run(a, &w, 1, NULL), XT_FAILED);
    }
    xt_engine_destroy(a);
    xt_engine_destroy(b);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(p[1]);
    char buf[8192];
    ssize_t n = read(p[0], buf, sizeof buf - 1);
    close(p[0]);
    buf[n > 0 ? n : 0] = 0;
    int lines = 0;
    for (char *q = buf; (q = strstr(q, "xpyd_transfer[first-err]: ")) != NULL; q++)
        lines++;
    assert_int_equal(lines, 1);
    assert_non_null(strstr(buf, "xpyd_transfer[first-err]: WRITE slice: Bad address"));
    free(loc);
    free(tgt);
}

static void bad_arguments(void **state)
{
    struct xt_config c = {.name = "x", .transport = "carrier-pigeon"};
    xt_engine *e = NULL;
    assert_int_equal(xt_engine_create(&c, &e), -EPROTONOSUPPORT);
    c.transport = "rdma"; /* explicitly asked, and this machine has no RDMA device */
    assert_int_equal(xt_engine_create(&c, &e), -ENODEV);
    c.transport = "tcp";
    c.name = NULL;
    assert_int_equal(xt_engine_create(&c, &e), -EINVAL);
    e = mk("x", 0, 0);
    xt_segment s;
    assert_int_equal(xt_open_segment(e, "no-port", &s), -EINVAL);
    assert_true(xt_open_segment(e, "127.0.0.1:1", &s) < 0); /* nobody listens there */
    int st;
    assert_int_equal(xt_batch_status(e, 42, &st), -EINVAL);
    xt_engine_destroy(e);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(write_then_read_with_checksums), cmocka_unit_test(out_of_range_refused),
        cmocka_unit_test(notify_after_landing),           cmocka_unit_test(slices_follow_peer_frame_limit),
        cmocka_unit_test(peer_death_fails_batch_cleanly), cmocka_unit_test(event_fd_and_reopen),
        cmocka_unit_test(first_error_logged_once), cmocka_unit_test(bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
