/* SPDX-License-Identifier: Apache-2.0 */
/* test_util.c - unit tests for common/xpyd_util.c: the byte array a stream's events collect in (xpyd_bytes),
 * and event logging from several threads at once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "xpyd_http_client.h"
#include "xpyd_util.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>

/* Bytes appended across growth stay in order; emptying keeps the room (so refilling does not reallocate) unless
 * it is larger than asked to keep. */
static void test_bytes_grow_and_reuse(void **st)
{
    struct xpyd_bytes b = {0};
    char expect[5000];
    for (int i = 0; i < 5000; i++) {
        char c = (char)('a' + i % 26);
        expect[i] = c;
        xpyd_bytes_add(&b, &c, 1);
    }
    assert_int_equal(b.len, 5000);
    assert_true(b.cap >= 5000);
    assert_memory_equal(b.p, expect, 5000);
    char *p = b.p;
    size_t cap = b.cap;
    b.len = 0;
    xpyd_bytes_add(&b, expect, 4000);
    xpyd_bytes_add(&b, "", 0);
    assert_ptr_equal(b.p, p);
    assert_int_equal(b.cap, cap);
    assert_int_equal(b.len, 4000);
    char *room = xpyd_bytes_room(&b, 3000); /* past the room: grows, the bytes kept */
    assert_ptr_equal(room, b.p + 4000);
    assert_true(b.cap >= 7000);
    assert_memory_equal(b.p, expect, 4000);
    xpyd_bytes_reset(&b, 1 << 20); /* room within keep: kept */
    assert_int_equal(b.len, 0);
    assert_non_null(b.p);
    xpyd_bytes_reset(&b, 1024); /* more than keep: freed */
    assert_null(b.p);
    assert_int_equal(b.cap, 0);
    xpyd_bytes_add(&b, "abc", 3); /* and usable again */
    assert_memory_equal(b.p, "abc", 3);
    free(b.p);
}

static void *log_events(void *arg)
{
    for (int i = 0; i < 20000; i++)
        xpyd_log_event(XPYD_LOG_INFO, "event=test n=%d", i);
    return arg;
}

/* Events are printed whatever the level, from any thread, and the level stays what it was set to. */
/* etcd_url_parse resolves an endpoint from its own host field: the name must survive (it was once erased by
 * an overlapping copy, and the empty name turned the TLS certificate's name check off). */
static void test_endpoint_resolve_in_place(void **st)
{
    struct up_endpoint ep;
    memset(&ep, 0, sizeof ep);
    snprintf(ep.host, sizeof ep.host, "127.0.0.1");
    assert_int_equal(up_endpoint_resolve(&ep, ep.host, 2379), 0);
    assert_string_equal(ep.host, "127.0.0.1");
    assert_string_equal(ep.hostport, "127.0.0.1:2379");
    snprintf(ep.host, sizeof ep.host, "::1");
    assert_int_equal(up_endpoint_resolve(&ep, ep.host, 8100), 0);
    assert_string_equal(ep.hostport, "[::1]:8100");
}

/* Hosts: what resolves is taken, what would land in Host headers, logs and JSON as something else is refused. */
static void test_host_valid(void **st)
{
    const char *ok[] = {"localhost", "127.0.0.1", "engine-0.pool.svc.cluster.local", "prefill_1", "::1",
                        "fe80::1%eth0", "2001:db8::8a2e:370:7334", "::ffff:192.0.2.1", "A"};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
        assert_true(xpyd_host_valid(ok[i]));
    const char *bad[] = {"", "a b", "a\r\nX-Evil: 1", "a\"b", "a\\b", "a/b", "[::1]", "::1%", "g::1", "\xc3\xa9t\xc3\xa9",
                         "a\tb", "host?x", "a@b", "::1%e th0"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_false(xpyd_host_valid(bad[i]));
    char longest[257];
    memset(longest, 'a', 256);
    longest[256] = 0;
    assert_false(xpyd_host_valid(longest));
    longest[255] = 0;
    assert_true(xpyd_host_valid(longest));
    char host[300];
    int port = 0;
    assert_int_equal(xpyd_parse_hostport("[fe80::1%eth0]:8100", host, sizeof host, &port), 0);
    assert_string_equal(host, "fe80::1%eth0");
    assert_int_equal(port, 8100);
    assert_int_equal(xpyd_parse_hostport("a b:80", host, sizeof host, &port), -EINVAL);
    assert_int_equal(xpyd_parse_hostport("[a\"b]:80", host, sizeof host, &port), -EINVAL);
}

static void test_log_event_keeps_level(void **st)
{
    FILE *saved = stderr;
    stderr = fopen("/dev/null", "w");
    assert_non_null(stderr);
    xpyd_log_level = XPYD_LOG_WARN;
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&th[i], NULL, log_events, NULL), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    fclose(stderr);
    stderr = saved;
    assert_int_equal(xpyd_log_level, XPYD_LOG_WARN);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bytes_grow_and_reuse),
        cmocka_unit_test(test_log_event_keeps_level),
        cmocka_unit_test(test_endpoint_resolve_in_place),
        cmocka_unit_test(test_host_valid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
