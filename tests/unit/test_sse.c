/* SPDX-License-Identifier: Apache-2.0 */
/* test_sse.c - unit tests for the SSE writer and the incremental splitter. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "xpyd_sse.h"

#include <errno.h>
#include <event2/buffer.h>
#include <stdlib.h>
#include <string.h>

struct got {
    int n;
    char data[8][256];
    char raw[8][256];
};

static int collect(void *arg, const char *data, size_t len, const char *raw, size_t rawlen)
{
    struct got *g = arg;
    assert_true(g->n < 8);
    assert_int_equal(strlen(data), len);
    memcpy(g->data[g->n], data, len + 1);
    memcpy(g->raw[g->n], raw, rawlen);
    g->raw[g->n][rawlen] = '\0';
    g->n++;
    return 0;
}

static void test_writer_frames(void **st)
{
    struct evbuffer *b = evbuffer_new();
    assert_int_equal(xpyd_sse_write(b, "{\"a\":1}", 7), 0);
    assert_int_equal(xpyd_sse_write_done(b), 0);
    size_t n = evbuffer_get_length(b);
    char out[64] = {0};
    evbuffer_copyout(b, out, n);
    assert_string_equal(out, "data: {\"a\":1}\n\ndata: [DONE]\n\n");
    evbuffer_free(b);
}

static void test_split_byte_by_byte(void **st)
{
    const char *in = "data: one\n\n: comment\n\ndata: two\r\n\r\nevent: x\ndata: a\ndata: b\n\n";
    struct xpyd_sse_parser p = {0};
    struct got g = {0};
    for (size_t i = 0; i < strlen(in); i++)
        assert_int_equal(xpyd_sse_feed(&p, in + i, 1, collect, &g), 0);
    assert_int_equal(g.n, 3);
    assert_string_equal(g.data[0], "one");
    assert_string_equal(g.raw[0], "data: one\n\n");
    assert_string_equal(g.data[1], "two");
    assert_string_equal(g.raw[1], "data: two\r\n\r\n");
    assert_string_equal(g.data[2], "a\nb");
    assert_int_equal(xpyd_sse_pending(&p), 0);
    xpyd_sse_reset(&p);
}

static void test_split_partial_kept(void **st)
{
    struct xpyd_sse_parser p = {0};
    struct got g = {0};
    const char *part = "data: {\"x\":1}\n\ndata: {\"y\"";
    assert_int_equal(xpyd_sse_feed(&p, part, strlen(part), collect, &g), 0);
    assert_int_equal(g.n, 1);
    assert_int_equal(xpyd_sse_pending(&p), 10);
    assert_int_equal(xpyd_sse_feed(&p, ":2}\n\n", 5, collect, &g), 0);
    assert_int_equal(g.n, 2);
    assert_string_equal(g.data[1], "{\"y\":2}");
    xpyd_sse_reset(&p);
}

static void test_split_oversize_rejected(void **st)
{
    struct xpyd_sse_parser p = {.max_event = 32};
    struct got g = {0};
    char big[100];
    memset(big, 'x', sizeof big);
    memcpy(big, "data: ", 6);
    assert_int_equal(xpyd_sse_feed(&p, big, sizeof big, collect, &g), -EMSGSIZE);
    assert_int_equal(g.n, 0);
    xpyd_sse_reset(&p);
}

static int stop_after_first(void *arg, const char *data, size_t len, const char *raw, size_t rawlen)
{
    (*(int *)arg)++;
    return 7;
}

static void test_callback_stops(void **st)
{
    struct xpyd_sse_parser p = {0};
    int calls = 0;
    assert_int_equal(xpyd_sse_feed(&p, "data: a\n\ndata: b\n\n", 18, stop_after_first, &calls), 7);
    assert_int_equal(calls, 1);
    xpyd_sse_reset(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_writer_frames),
        cmocka_unit_test(test_split_byte_by_byte),
        cmocka_unit_test(test_split_partial_kept),
        cmocka_unit_test(test_split_oversize_rejected),
        cmocka_unit_test(test_callback_stops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
