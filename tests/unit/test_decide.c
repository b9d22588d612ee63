/* SPDX-License-Identifier: Apache-2.0 */
/* test_decide.c - the request core's decisions (router/decide.c) at their boundaries: retry (4xx, attempts,
 * untried instances, the budget), backoff, migration, the continuation's path, prefill fallback, conditional
 * disaggregation, what a leg failure was. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "decide.h"
#include "router.h"
#include "xpyd_http_client.h"

#include <errno.h>
#include <string.h>

static struct rd_retry fresh(void)
{
    return (struct rd_retry){.status = 0, .attempts = 1, .tried = 1, .max_retries = 1, .ranks = 4, .max_tried = 16,
                             .active = 100, .retries_active = 0, .budget_percent = 20, .budget_min = 3};
}

static void test_retry_rules(void **state)
{
    (void)state;
    struct rd_retry f = fresh();
    assert_int_equal(rd_may_retry(&f), RD_RETRY);
    f.status = 503;
    assert_int_equal(rd_may_retry(&f), RD_RETRY); /* 5xx: another engine may do better */
    f.status = 499;
    assert_int_equal(rd_may_retry(&f), RD_NO); /* the engine judged the request itself */
    f = fresh();
    f.client_has_bytes = 1;
    assert_int_equal(rd_may_retry(&f), RD_NO);
    f = fresh();
    f.ended = 1;
    assert_int_equal(rd_may_retry(&f), RD_NO);
    f = fresh();
    f.attempts = 2; /* --max-retries 1: the first attempt and one more */
    assert_int_equal(rd_may_retry(&f), RD_NO);
    f = fresh();
    f.tried = 4; /* every rank tried */
    assert_int_equal(rd_may_retry(&f), RD_NO);
    f.ranks = 5;
    assert_int_equal(rd_may_retry(&f), RD_RETRY);
    f.tried = f.max_tried = 5; /* the request remembers no more instances */
    assert_int_equal(rd_may_retry(&f), RD_NO);
}

static void test_retry_budget(void **state)
{
    (void)state;
    struct rd_retry f = fresh(); /* 100 active, 20 %: 20 may retry at once */
    f.retries_active = 19;
    assert_int_equal(rd_may_retry(&f), RD_RETRY);
    f.retries_active = 20;
    assert_int_equal(rd_may_retry(&f), RD_BUDGET_SPENT);
    f.retrying = 1; /* a request already retrying keeps its place */
    assert_int_equal(rd_may_retry(&f), RD_RETRY);
    f = fresh();
    f.active = 4; /* 20 % of 4 is 0: the minimum, 3, holds */
    f.retries_active = 2;
    assert_int_equal(rd_may_retry(&f), RD_RETRY);
    f.retries_active = 3;
    assert_int_equal(rd_may_retry(&f), RD_BUDGET_SPENT);
    f.fallback = 1; /* a decode that lacked a gone prefill's KV: the next computes the prompt, outside the budget */
    assert_int_equal(rd_may_retry(&f), RD_RETRY);
    f.attempts = (int)f.max_retries + 1; /* but not beyond --max-retries */
    assert_int_equal(rd_may_retry(&f), RD_NO);
}

static void test_backoff(void **state)
{
    (void)state;
    const uint64_t mid = 1ULL << 63; /* jitter 1.0 */
    assert_true(rd_backoff_ms(0, 3, mid) == 0);
    assert_true(rd_backoff_ms(50, 1, mid) == 50);
    assert_true(rd_backoff_ms(50, 2, mid) == 100);
    assert_true(rd_backoff_ms(50, 3, mid) == 200);
    assert_true(rd_backoff_ms(50, 30, mid) == 1000); /* capped at 1 s */
    assert_true(rd_backoff_ms(50, 1, 0) == 25);      /* jitter 0.5 */
    double top = rd_backoff_ms(50, 1, UINT64_MAX);   /* jitter just under 1.5 */
    assert_true(top > 74.9 && top <= 75);
}

static void test_migration(void **state)
{
    (void)state;
    /* can_continue streaming done_seen ended migrations limit tried max_tried ranks */
    assert_true(rd_may_migrate(1, 1, 0, 0, 0, 1, 1, 16, 2));
    assert_false(rd_may_migrate(0, 1, 0, 0, 0, 1, 1, 16, 2)); /* no text kept: cannot continue */
    assert_false(rd_may_migrate(1, 0, 0, 0, 0, 1, 1, 16, 2)); /* not streaming: a retry's business */
    assert_false(rd_may_migrate(1, 1, 1, 0, 0, 1, 1, 16, 2)); /* [DONE] seen: nothing to continue */
    assert_false(rd_may_migrate(1, 1, 0, 1, 0, 1, 1, 16, 2));
    assert_false(rd_may_migrate(1, 1, 0, 0, 1, 1, 1, 16, 2)); /* --migration-limit reached */
    assert_false(rd_may_migrate(1, 1, 0, 0, 0, 0, 1, 16, 2)); /* --migration-limit 0: off */
    assert_false(rd_may_migrate(1, 1, 0, 0, 0, 1, 2, 16, 2)); /* every decode tried */
    assert_true(rd_continue_through_prefill(1, 100, 100));
    assert_false(rd_continue_through_prefill(1, 100, 99));
    assert_false(rd_continue_through_prefill(1, 0, 1 << 20)); /* 0: never */
    assert_false(rd_continue_through_prefill(0, 100, 1000)); /* bootstrap, mooncake: no prefill-less decode */
}

static void test_fallback_and_local_prefill(void **state)
{
    (void)state;
    /* on mode_local client_has_bytes migrations ended prefill_answered */
    assert_true(rd_may_fall_back(1, 1, 0, 0, 0, 0));
    assert_false(rd_may_fall_back(0, 1, 0, 0, 0, 0));
    assert_false(rd_may_fall_back(1, 0, 0, 0, 0, 0));
    assert_false(rd_may_fall_back(1, 1, 1, 0, 0, 0)); /* the client has bytes: too late */
    assert_true(rd_may_fall_back(1, 1, 1, 1, 0, 0));  /* ... unless the stream migrated */
    assert_false(rd_may_fall_back(1, 1, 0, 0, 1, 0));
    assert_false(rd_may_fall_back(1, 1, 0, 0, 0, 1)); /* the prefill answered: its KV waits */
    /* prompt cached max when_busy prefills_full */
    assert_true(rd_local_prefill(1000, 900, 256, 0, 0));   /* 100 uncached < 256 */
    assert_false(rd_local_prefill(1000, 744, 256, 0, 0));  /* 256 is not fewer than 256 */
    assert_false(rd_local_prefill(1000, 0, 256, 2000, 0)); /* busy rule only while prefills are full */
    assert_true(rd_local_prefill(1000, 0, 256, 2000, 1));
    assert_false(rd_local_prefill(1000, 0, 0, 0, 1)); /* both off */
}

static void test_kv_after_a_failed_decode(void **state)
{
    (void)state;
    /* mode_local kv_on_prefill fallback_on accepted attempts status prefill_out_of_service */
    /* one failure: maybe the decode's own */
    assert_int_equal(rd_kv_after_decode_failure(1, 1, 1, 0, 1, 500, 0), RD_KV_KEEP);
    assert_int_equal(rd_kv_after_decode_failure(1, 1, 1, 0, 2, 500, 0), RD_KV_SUSPECT);
    assert_int_equal(rd_kv_after_decode_failure(1, 1, 1, 0, 1, 500, 1), RD_KV_UNREACHABLE);
    assert_int_equal(rd_kv_after_decode_failure(1, 1, 1, 0, 3, 500, 1), RD_KV_UNREACHABLE);
    assert_int_equal(rd_kv_after_decode_failure(1, 1, 1, 0, 1, 500, 2), RD_KV_FAILING); /* failing, not known gone */
    assert_int_equal(rd_kv_after_decode_failure(1, 1, 1, 0, 2, 0, 2), RD_KV_FAILING);
    assert_int_equal(rd_kv_after_decode_failure(1, 0, 1, 0, 2, 500, 2), RD_KV_KEEP); /* store: the store holds it */
    assert_int_equal(rd_kv_after_decode_failure(1, 1, 1, 1, 1, 500, 2), RD_KV_TAKEN);
    assert_int_equal(rd_kv_after_decode_failure(1, 1, 1, 1, 1, 500, 0), RD_KV_TAKEN);
    assert_int_equal(rd_kv_after_decode_failure(1, 0, 0, 1, 1, 500, 0), RD_KV_TAKEN); /* store, fallback off: taken */
    assert_int_equal(rd_kv_after_decode_failure(1, 0, 1, 0, 2, 500, 1), RD_KV_KEEP);  /* store: the store holds it */
    assert_int_equal(rd_kv_after_decode_failure(1, 1, 0, 0, 2, 500, 1), RD_KV_KEEP);  /* --prefill-fallback off */
    assert_int_equal(rd_kv_after_decode_failure(0, 1, 1, 1, 2, 500, 1), RD_KV_KEEP);  /* bootstrap: no decode alone */
    assert_int_equal(rd_kv_after_decode_failure(1, 1, 1, 0, 2, 0, 0), RD_KV_SUSPECT); /* no answer at all */
    /* a 4xx: the request's own fault on the first attempt; after another, the KV's (store mode too) */
    assert_int_equal(rd_kv_after_decode_failure(1, 1, 1, 0, 1, 400, 0), RD_KV_KEEP);
    assert_int_equal(rd_kv_after_decode_failure(1, 1, 1, 0, 2, 400, 0), RD_KV_REFUSED);
    assert_int_equal(rd_kv_after_decode_failure(1, 0, 1, 0, 2, 404, 1), RD_KV_REFUSED);
    assert_int_equal(rd_kv_after_decode_failure(1, 1, 0, 0, 2, 400, 0), RD_KV_KEEP); /* --prefill-fallback off */
}

static void test_failure_kinds(void **state)
{
    (void)state;
    char buf[128];
    assert_int_equal(rd_leg_fail_kind(RT_PREFILL, 0, 500), RF_PREFILL_STATUS);
    assert_int_equal(rd_leg_fail_kind(RT_DECODE, 0, 503), RF_DECODE_STATUS);
    assert_int_equal(rd_leg_fail_kind(RT_DECODE, -ETIME, 0), RF_DECODE_TIMEOUT);
    assert_int_equal(rd_leg_fail_kind(RT_PREFILL, -ETIMEDOUT, 0), RF_PREFILL_CONNECT); /* connect timed out */
    assert_int_equal(rd_leg_fail_kind(RT_PREFILL, -ECONNREFUSED, 0), RF_PREFILL_CONNECT);
    assert_string_equal(rd_err_text(-ETIME, buf, sizeof buf), "no answer within the timeout");
    assert_string_equal(rd_err_text(-ECONNRESET, buf, sizeof buf),
                        "connection closed before the response was complete");
    assert_non_null(strstr(rd_err_text(-UP_ETLS, buf, sizeof buf), "TLS handshake failed"));
    assert_string_equal(rd_err_text(-ECONNREFUSED, buf, sizeof buf), "Connection refused");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_retry_rules),     cmocka_unit_test(test_retry_budget),
        cmocka_unit_test(test_backoff),         cmocka_unit_test(test_migration),
        cmocka_unit_test(test_fallback_and_local_prefill), cmocka_unit_test(test_failure_kinds),
        cmocka_unit_test(test_kv_after_a_failed_decode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
