/* SPDX-License-Identifier: Apache-2.0 */
/* test_transfer_rdma.c - libxpyd_transfer's RDMA transport (real libibverbs calls) linked against the
 * project's fake libibverbs (tests/fake_verbs): two engines in one process on two fake NICs each. Fails if the
 * transport posts before RTS, ignores a remote access error, does not fail over when a NIC dies, or leaks a
 * QP, MR, CQ, PD or device context. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "fake_verbs.h"
#include "xpyd_transfer.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static xt_engine *mk(const char *name, const char *transport)
{
    struct xt_config c = {.name = name, .transport = transport, .threads = 2, .slice_bytes = 16384,
                          .io_timeout_ms = 3000};
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

static int run(xt_engine *e, const struct xt_request *r, int *err)
{
    xt_batch b;
    assert_int_equal(xt_alloc_batch(e, 1, &b), 0);
    assert_int_equal(xt_submit(e, b, r, 1), 0);
    int st = -1;
    assert_int_equal(xt_wait_batch(e, b, 10000, &st), 0);
    struct xt_task_status ts;
    assert_int_equal(xt_task_status(e, b, 0, &ts), 0);
    if (err)
        *err = ts.error;
    assert_int_equal(xt_free_batch(e, b), 0);
    return st;
}

static void no_leaks_and_no_early_posts(void)
{
    struct fake_verbs_counts c;
    fake_verbs_live(&c);
    assert_int_equal(c.qps, 0);
    assert_int_equal(c.mrs, 0);
    assert_int_equal(c.cqs, 0);
    assert_int_equal(c.pds, 0);
    assert_int_equal(c.contexts, 0);
    assert_int_equal(c.posts_before_rts, 0);
}

static void rdma_write_read_striped(void **state)
{
    xt_engine *a = mk("a", "auto"), *b = mk("b", "rdma");
    assert_string_equal(xt_engine_transport(a), "rdma");
    size_t n = (512 << 10) + 24; /* 33 slices over 2 NIC pairs x 2 workers */
    unsigned char *src = malloc(n), *dst = calloc(1, n), *back = calloc(1, n);
    for (size_t i = 0; i < n; i++)
        src[i] = (unsigned char)(i * 7 + 1);
    assert_int_equal(xt_register_memory(a, src, n, NULL), 0);
    assert_int_equal(xt_register_memory(a, back, n, NULL), 0);
    assert_int_equal(xt_register_memory(b, dst, n, NULL), 0);
    char desc[2048];
    assert_true(xt_segment_descriptor(b, desc, sizeof desc) > 0);
    assert_non_null(strstr(desc, "\"transport\":\"rdma\""));
    assert_non_null(strstr(desc, "\"rkeys\":["));
    assert_non_null(strstr(desc, "fake_1"));
    /* the fake's GID 0 is link-local, GID 1 IPv4-mapped (routable RoCEv2): the latter is chosen */
    assert_non_null(strstr(desc, "\"name\":\"fake_0\",\"lid\":1,\"mtu\":4096,\"gid_index\":1"));
    xt_segment s = open_peer(a, b);
    struct fake_verbs_counts c;
    fake_verbs_live(&c);
    assert_int_equal(c.qps, 2 * 2 * 2); /* 2 workers x 2 NICs, a QP on each side */
    struct xt_request w = {XT_WRITE, src, s, (uint64_t)(uintptr_t)dst, n};
    assert_int_equal(run(a, &w, NULL), XT_COMPLETED);
    assert_memory_equal(src, dst, n);
    struct xt_request r = {XT_READ, back, s, (uint64_t)(uintptr_t)dst, n};
    assert_int_equal(run(a, &r, NULL), XT_COMPLETED);
    assert_memory_equal(src, back, n);
    assert_int_equal(xt_send_notify(a, s, "done"), 0); /* notifications still ride the control channel */
    xt_engine_destroy(a);
    xt_engine_destroy(b);
    free(src);
    free(dst);
    free(back);
    no_leaks_and_no_early_posts();
}

static void mtu_is_the_minimum_of_both_sides(void **state)
{
    fake_verbs_set_port_mtu("fake_0", IBV_MTU_4096);
    fake_verbs_set_port_mtu("fake_1", IBV_MTU_4096);
    xt_engine *a = mk("a", "rdma");
    fake_verbs_set_port_mtu("fake_0", IBV_MTU_1024); /* b's ports run a smaller MTU */
    fake_verbs_set_port_mtu("fake_1", IBV_MTU_1024);
    xt_engine *b = mk("b", "rdma");
    fake_verbs_set_port_mtu("fake_0", IBV_MTU_4096);
    fake_verbs_set_port_mtu("fake_1", IBV_MTU_4096);
    char *src = calloc(1, 4096), *dst = calloc(1, 4096);
    assert_int_equal(xt_register_memory(a, src, 4096, NULL), 0);
    assert_int_equal(xt_register_memory(b, dst, 4096, NULL), 0);
    xt_segment s = open_peer(a, b);
    assert_int_equal(fake_verbs_max_path_mtu(), IBV_MTU_1024); /* neither side's QPs use more than 1024 */
    struct xt_request w = {XT_WRITE, src, s, (uint64_t)(uintptr_t)dst, 4096};
    assert_int_equal(run(a, &w, NULL), XT_COMPLETED);
    xt_engine_destroy(a);
    xt_engine_destroy(b);
    free(src);
    free(dst);
    no_leaks_and_no_early_posts();
}

static void remote_access_error_fails_and_qp_recovers(void **state)
{
    xt_engine *a = mk("a", "rdma"), *b = mk("b", "rdma");
    unsigned char *loc = calloc(1, 8192), *ga = calloc(1, 4096), *gb = calloc(1, 4096);
    memset(gb, 0x77, 4096);
    assert_int_equal(xt_register_memory(a, loc, 8192, NULL), 0);
    assert_int_equal(xt_register_memory(b, ga, 4096, NULL), 0);
    assert_int_equal(xt_register_memory(b, gb, 4096, NULL), 0);
    xt_segment s = open_peer(a, b);
    /* the target withdraws ga after publishing it: the initiator's rkey is stale, the NIC refuses */
    assert_int_equal(xt_unregister_memory(b, ga), 0);
    int err = 0;
    struct xt_request bad = {XT_READ, loc, s, (uint64_t)(uintptr_t)ga, 4096};
    assert_int_equal(run(a, &bad, &err), XT_FAILED);
    assert_int_equal(err, -EFAULT);
    /* outside anything published: refused before posting */
    struct xt_request outside = {XT_WRITE, loc, s, (uint64_t)(uintptr_t)gb + 4000, 200};
    assert_int_equal(run(a, &outside, &err), XT_FAILED);
    assert_int_equal(err, -EFAULT);
    /* the QP that saw the error is rebuilt; valid requests go through on every path again */
    for (int i = 0; i < 6; i++) {
        memset(loc, 0, 4096);
        struct xt_request ok = {XT_READ, loc, s, (uint64_t)(uintptr_t)gb, 4096};
        assert_int_equal(run(a, &ok, NULL), XT_COMPLETED);
        assert_int_equal(loc[4095], 0x77);
    }
    xt_engine_destroy(a);
    xt_engine_destroy(b);
    free(loc);
    free(ga);
    free(gb);
    no_leaks_and_no_early_posts();
}

static void nic_failure_fails_over(void **state)
{
    xt_engine *a = mk("a", "rdma"), *b = mk("b", "rdma");
    size_t n = 256 << 10;
    unsigned char *src = malloc(n), *dst = calloc(1, n);
    memset(src, 0x3c, n);
    assert_int_equal(xt_register_memory(a, src, n, NULL), 0);
    assert_int_equal(xt_register_memory(b, dst, n, NULL), 0);
    xt_segment s = open_peer(a, b);
    fake_verbs_fail_device("fake_1", 1); /* every WR on the second NIC pair now fails */
    struct xt_request w = {XT_WRITE, src, s, (uint64_t)(uintptr_t)dst, n};
    assert_int_equal(run(a, &w, NULL), XT_COMPLETED); /* retried on fake_0 */
    assert_memory_equal(src, dst, n);
    fake_verbs_fail_device("fake_0", 1); /* and now no path is left: a clean failure, no hang */
    int err = 0;
    assert_int_equal(run(a, &w, &err), XT_FAILED);
    assert_true(err < 0);
    fake_verbs_fail_device("fake_0", 0);
    fake_verbs_fail_device("fake_1", 0);
    xt_engine_destroy(a);
    xt_engine_destroy(b);
    free(src);
    free(dst);
    no_leaks_and_no_early_posts();
}

static void configured_gid_index_wins(void **state)
{
    struct xt_config c = {.name = "g", .transport = "rdma", .gid_index = 0, .gid_index_set = 1};
    xt_engine *e = NULL;
    assert_int_equal(xt_engine_create(&c, &e), 0);
    char desc[1024];
    assert_true(xt_segment_descriptor(e, desc, sizeof desc) > 0);
    assert_non_null(strstr(desc, "\"gid_index\":0"));
    assert_null(strstr(desc, "\"gid_index\":1"));
    xt_engine_destroy(e);
    no_leaks_and_no_early_posts();
}

static void tcp_peer_interoperates(void **state)
{
    xt_engine *a = mk("a", "rdma"), *b = mk("b", "tcp"); /* b has no RDMA: the segment uses tcp */
    char *src = strdup("hello over tcp"), *dst = calloc(1, 64);
    assert_int_equal(xt_register_memory(a, src, 15, NULL), 0);
    assert_int_equal(xt_register_memory(b, dst, 64, NULL), 0);
    xt_segment s = open_peer(a, b);
    struct xt_request w = {XT_WRITE, src, s, (uint64_t)(uintptr_t)dst, 15};
    assert_int_equal(run(a, &w, NULL), XT_COMPLETED);
    assert_string_equal(dst, "hello over tcp");
    xt_engine_destroy(a);
    xt_engine_destroy(b);
    free(src);
    free(dst);
    no_leaks_and_no_early_posts();
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rdma_write_read_striped),
        cmocka_unit_test(mtu_is_the_minimum_of_both_sides),
        cmocka_unit_test(remote_access_error_fails_and_qp_recovers),
        cmocka_unit_test(nic_failure_fails_over),
        cmocka_unit_test(configured_gid_index_wins),
        cmocka_unit_test(tcp_peer_interoperates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
