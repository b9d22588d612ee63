/* SPDX-License-Identifier: Apache-2.0 */
/* test_feedback_parse.c - reading vLLM's load series from /metrics pages (new and old names, per engine). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "feedback_parse.h"

#include <stdio.h>
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

static long models(const char *body)
{
    return probe_parse_models_max_len(body, strlen(body));
}

/* GET /v1/models as vLLM (ModelCard; an adapter's card may carry a length too) and SGLang answer it */
static void test_models_max_len(void **st)
{
    assert_int_equal(models("{\"object\":\"list\",\"data\":[{\"id\":\"Qwen/Qwen3-8B\",\"object\":\"model\","
                            "\"created\":1,\"owned_by\":\"vllm\",\"root\":\"Qwen/Qwen3-8B\",\"parent\":null,"
                            "\"max_model_len\":40960,\"permission\":[]},{\"id\":\"sql-lora\",\"parent\":\"Qwen/Qwen3-8B\","
                            "\"max_model_len\":40960}]}"),
                     40960);
    assert_int_equal(models("{\"data\":[{\"id\":\"a\",\"max_model_len\":4096},{\"id\":\"b\",\"max_model_len\":8192}]}"), 8192);
    assert_int_equal(models(" {\"data\" : [ {\"max_model_len\" : 1e3} ] } "), 1000); /* a JSON number as written */
    /* the last of a repeated key, as Python's json.loads (what the engines' clients read) */
    assert_int_equal(models("{\"data\":[{\"max_model_len\":10,\"max_model_len\":20}]}"), 20);
    /* nothing usable: 0 (the rank keeps no learned length) */
    const char *none[] = {"", "null", "[]", "{}", "{\"data\":{}}", "{\"data\":[]}", "{\"data\":[{\"id\":\"m\"}]}",
                          "{\"data\":[{\"max_model_len\":null}]}", "{\"data\":[{\"max_model_len\":\"4096\"}]}",
                          "{\"data\":[{\"max_model_len\":0}]}", "{\"data\":[{\"max_model_len\":-4096}]}",
                          "{\"data\":[{\"max_model_len\":4096.5}]}", "{\"data\":[{\"max_model_len\":1e300}]}",
                          "{\"data\":[{\"max_model_len\":1099511627776}]}", "{\"data\":[4096]}",
                          "{\"data\":[{\"max_model_len\":4096}]", /* cut short: not strict JSON */
                          "{\"data\":[{\"max_model_len\":4096}]} x", "{\"data\":[{\"max_model_len\":NaN}]}"};
    for (size_t i = 0; i < sizeof none / sizeof *none; i++)
        assert_int_equal(models(none[i]), 0);
    assert_int_equal(models("{\"data\":[{\"max_model_len\":1099511627775}]}"), 1099511627775L); /* below 2^40 */
    assert_int_equal(probe_parse_models_max_len(NULL, 0), 0);
}

static void collect(void *arg, const char *id, size_t n)
{
    char *out = arg;
    size_t k = strlen(out);
    snprintf(out + k, 200 - k, "%.*s;", (int)n, id);
}

/* the adapters of GET /v1/models: vLLM's cards with a parent (the base model's parent is null) */
static void test_models_adapters(void **st)
{
    char got[200] = "";
    const char *vllm = "{\"object\":\"list\",\"data\":[{\"id\":\"Qwen/Qwen3-8B\",\"root\":\"Qwen/Qwen3-8B\","
                       "\"parent\":null,\"max_model_len\":40960},{\"id\":\"sql-lora\",\"root\":\"/loras/sql\","
                       "\"parent\":\"Qwen/Qwen3-8B\"},{\"id\":\"caf\\u00e9\",\"parent\":\"Qwen/Qwen3-8B\"},"
                       "{\"id\":5,\"parent\":\"x\"},{\"id\":\"\",\"parent\":\"x\"},{\"id\":\"p\",\"parent\":7},7]}";
    assert_int_equal(probe_parse_models_adapters(vllm, strlen(vllm), collect, got), 2);
    assert_string_equal(got, "sql-lora;caf\xc3\xa9;"); /* the id decoded; no id, an empty one, a number: none */
    const char *none[] = {"", "[]", "{\"data\":{}}", "{\"data\":[{\"id\":\"m\",\"parent\":\"b\"}]", "{}"};
    for (size_t i = 0; i < sizeof none / sizeof *none; i++) {
        got[0] = '\0';
        assert_int_equal(probe_parse_models_adapters(none[i], strlen(none[i]), collect, got), 0);
        assert_string_equal(got, "");
    }
    assert_int_equal(probe_parse_models_adapters(NULL, 0, collect, got), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_per_engine), cmocka_unit_test(test_all_engines_sum_and_max),
                                       cmocka_unit_test(test_old_name_fallback_and_nothing),
                                       cmocka_unit_test(test_models_max_len), cmocka_unit_test(test_models_adapters)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
