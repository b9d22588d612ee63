/* SPDX-License-Identifier: Apache-2.0 */
/* test_feedback_parse.c - reading vLLM's load series from /metrics pages (new and old names, per engine). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "feedback_parse.h"

#include <string.h>

static const char *PAGE =
    "# HELP vllm:num_requests_waiting Number of requests waiting.\n"
    "# TYPE vllm:num_requests_waiting gauge\n"
    "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 3\n"
    "vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 5\n"
    "vllm:num_requests_waiting_total_bogus{engine=\"0\"} 99\n"
    "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 7\n"
    "vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 2\n"
    "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n"
    "vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.75\n"
    "vllm:gpu_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.9\n";

static void test_per_engine(void **st)
{
    struct engine_load l;
    assert_true(probe_parse_engine_metrics(PAGE, strlen(PAGE), 1, &l) >= 3);
    assert_true(l.waiting == 5.0 && l.running == 2.0);
    assert_true(l.kv_usage == 0.75); /* the newer name wins over gpu_cache_usage_perc */
    assert_true(probe_parse_engine_metrics(PAGE, strlen(PAGE), 0, &l) >= 3);
    assert_true(l.waiting == 3.0 && l.running == 7.0 && l.kv_usage == 0.25);
}

static void test_all_engines_sum_and_max(void **st)
{
    struct engine_load l;
    assert_true(probe_parse_engine_metrics(PAGE, strlen(PAGE), -1, &l) > 0);
    assert_true(l.waiting == 8.0 && l.running == 9.0);
    assert_true(l.kv_usage == 0.75);
}

static void test_old_name_fallback_and_nothing(void **st)
{
    const char *old = "vllm:num_requests_waiting 2\nvllm:gpu_cache_usage_perc 0.5\n";
    struct engine_load l;
    assert_true(probe_parse_engine_metrics(old, strlen(old), -1, &l) == 2);
    assert_true(l.waiting == 2.0 && l.kv_usage == 0.5);
    const char *none = "# nothing here\nother_metric 1\n";
    assert_int_equal(probe_parse_engine_metrics(none, strlen(none), -1, &l), 0);
    assert_true(l.waiting == 0 && l.running == 0 && l.kv_usage == 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_per_engine), cmocka_unit_test(test_all_engines_sum_and_max),
                                       cmocka_unit_test(test_old_name_fallback_and_nothing)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
