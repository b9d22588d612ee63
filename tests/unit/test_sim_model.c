/* SPDX-License-Identifier: Apache-2.0 */
/* test_sim_model.c - unit tests for the simulator's token model, request validation and lease table. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "sim_lease.h"
#include "sim_request.h"
#include "sim_tokens.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct sim_limits LIM = {.model = "sim-model", .loras = "", .max_model_len = 100};

static int parse(const char *body, int chat, struct sim_params *p, char **err)
{
    *err = NULL;
    return sim_params_parse(body, strlen(body), chat, &LIM, p, err);
}

static void expect_error(const char *body, int chat, int status, const char *needle)
{
    struct sim_params p;
    char *err;
    int rc = parse(body, chat, &p, &err);
    assert_int_equal(rc, status);
    assert_non_null(err);
    if (!strstr(err, needle))
        fail_msg("error '%s' does not contain '%s'", err, needle);
    free(err);
}

static void test_tokens_words_and_ids(void **st)
{
    struct sim_prompt a = {0}, b = {0};
    assert_int_equal(sim_prompt_add_text(&a, "  hello   world\tfoo\n", 20), 0);
    assert_int_equal(a.n, 3);
    assert_int_equal(sim_prompt_add_text(&b, "hello world foo", 15), 0);
    sim_prompt_finish(&a);
    sim_prompt_finish(&b);
    assert_true(a.hash == b.hash);
    assert_int_equal(a.ids[0], b.ids[0]);
    /* generation is a pure function of (prompt, seed, position) */
    assert_int_equal(sim_gen_token(a.hash, 0), sim_gen_token(b.hash, 0));
    uint64_t c1 = sim_ctx_extend(a.hash, sim_gen_token(a.hash, 0));
    assert_true(sim_gen_token(a.hash, 0) != sim_gen_token(c1, 0) ||
                sim_gen_token(c1, 0) != sim_gen_token(sim_ctx_extend(c1, sim_gen_token(c1, 0)), 0));
    /* continuation: a prompt that is the old prompt plus the words generated so far continues the same way */
    uint64_t ctx = a.hash;
    struct sim_prompt cont;
    memset(&cont, 0, sizeof cont);
    for (size_t i = 0; i < a.n; i++)
        sim_prompt_add_id(&cont, a.ids[i]);
    for (int k = 0; k < 20; k++) {
        uint32_t id = sim_gen_token(ctx, 7);
        char w[32];
        size_t wn = sim_token_text(id, w, sizeof w);
        sim_prompt_add_text(&cont, w, wn);
        ctx = sim_ctx_extend(ctx, id);
        sim_prompt_finish(&cont);
        assert_true(cont.hash == ctx);
    }
    sim_prompt_free(&cont);
    char t[32];
    size_t n = sim_token_text(12345, t, sizeof t);
    assert_true(n >= 3 && t[0] == ' ');
    for (size_t i = 1; i < n; i++)
        assert_true(t[i] >= 'a' && t[i] <= 'z');
    unsigned char kv1[3 * 16], kv2[3 * 16];
    sim_kv_fill(&a, 16, kv1);
    sim_kv_fill(&b, 16, kv2);
    assert_memory_equal(kv1, kv2, sizeof kv1);
    sim_prompt_free(&a);
    sim_prompt_free(&b);
}

static void test_eos_probability(void **st)
{
    int never = 0, always = 0;
    for (size_t i = 0; i < 1000; i++) {
        never += sim_gen_eos(42 + i, 0, 0);
        always += sim_gen_eos(42 + i, 0, 1.0);
    }
    assert_int_equal(never, 0);
    assert_int_equal(always, 1000);
}

static void test_valid_completion(void **st)
{
    struct sim_params p;
    char *err;
    assert_int_equal(parse("{\"model\":\"sim-model\",\"prompt\":\"a b c\",\"max_tokens\":5,\"stream\":true,"
                           "\"stream_options\":{\"include_usage\":true},\"ignore_eos\":true}",
                           0, &p, &err),
                     0);
    assert_int_equal(p.prompt.n, 3);
    assert_int_equal(p.max_tokens, 5);
    assert_true(p.stream && p.include_usage && p.ignore_eos);
    sim_params_free(&p);
    assert_int_equal(parse("{\"prompt\":[1,2,3,4]}", 0, &p, &err), 0);
    assert_int_equal(p.prompt.n, 4);
    assert_int_equal(p.max_tokens, 16); /* completions default */
    sim_params_free(&p);
}

static void test_valid_chat(void **st)
{
    struct sim_params p;
    char *err;
    assert_int_equal(parse("{\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},{\"role\":\"user\","
                           "\"content\":[{\"type\":\"text\",\"text\":\"hi there\"}]}],\"max_tokens\":9,"
                           "\"max_completion_tokens\":4}",
                           1, &p, &err),
                     0);
    assert_int_equal(p.prompt.n, 1 + 2 + 1 + 2); /* a role token per message plus words */
    assert_int_equal(p.max_tokens, 4);         /* max_completion_tokens wins */
    sim_params_free(&p);
    assert_int_equal(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 1, &p, &err), 0);
    assert_int_equal(p.max_tokens, 100 - 2); /* chat default: the rest of the context */
    sim_params_free(&p);
}

static void test_rejections(void **st)
{
    expect_error("{\"prompt\":\"a\",", 0, 400, "malformed JSON");
    expect_error("[1,2]", 0, 400, "JSON object");
    expect_error("{\"max_tokens\":3}", 0, 400, "'prompt' is required");
    expect_error("{\"prompt\":\"a\",\"stream_options\":{\"include_usage\":true}}", 0, 400,
                 "Stream options can only be defined when `stream=True`.");
    expect_error("{\"prompt\":\"a\",\"max_tokens\":3,\"min_tokens\":5}", 0, 400,
                 "min_tokens must be less than or equal to max_tokens=3, got 5.");
    expect_error("{\"prompt\":\"a b c\",\"max_tokens\":98}", 0, 400,
                 "maximum context length is 100 tokens. However, you requested 101 tokens (3 in the messages, 98 in "
                 "the completion)");
    expect_error("{\"prompt\":\"a\",\"max_tokens\":0}", 0, 400, "max_tokens must be at least 1, got 0.");
    expect_error("{\"prompt\":\"a\",\"max_tokens\":\"5\"}", 0, 400, "'max_tokens' must be an integer");
    expect_error("{\"prompt\":\"a\",\"stream\":\"yes\"}", 0, 400, "'stream' must be a boolean");
    expect_error("{\"prompt\":\"a\",\"model\":\"other\"}", 0, 404, "The model `other` does not exist.");
    expect_error("{\"prompt\":\"\"}", 0, 400, "cannot be empty");
    expect_error("{\"messages\":[]}", 1, 400, "messages must be a non-empty array");
    expect_error("{\"messages\":[{\"content\":\"x\"}]}", 1, 400, "string 'role'");
    expect_error("{\"prompt\":\"a\",\"kv_transfer_params\":{\"do_remote_prefill\":true}}", 0, 400,
                 "needs remote_engine_id");
    expect_error("{\"prompt\":\"a\",\"bootstrap_room\":5}", 0, 400, "must be given together");
}

static void test_handoff_fields(void **st)
{
    struct sim_params p;
    char *err;
    assert_int_equal(parse("{\"prompt\":\"a\",\"kv_transfer_params\":{\"do_remote_prefill\":true,"
                           "\"remote_engine_id\":\"e\",\"remote_request_id\":\"r\",\"remote_host\":\"h\","
                           "\"remote_port\":9,\"remote_block_ids\":[1,2]},\"bootstrap_host\":\"h\","
                           "\"bootstrap_port\":7,\"bootstrap_room\":12345}",
                           0, &p, &err),
                     0);
    assert_true(p.h.do_remote_prefill && p.h.has_blocks && p.h.has_bootstrap);
    assert_string_equal(p.h.remote_engine_id, "e");
    assert_int_equal(p.h.remote_port, 9);
    assert_int_equal(p.h.bootstrap_room, 12345);
    sim_params_free(&p);
    /* the router draws rooms from all 63 bits: the top of the range is a room too (the simulator refused rooms
     * from 9.2e18 up, a quarter of a percent of them: the bootstrap tests' rare 400s) */
    const char *rooms[] = {"9200000000000000001", "9223372036854775807", "0"};
    for (size_t i = 0; i < sizeof rooms / sizeof *rooms; i++) {
        char body[200];
        snprintf(body, sizeof body, "{\"prompt\":\"a\",\"bootstrap_host\":\"h\",\"bootstrap_port\":7,"
                                    "\"bootstrap_room\":%s}", rooms[i]);
        assert_int_equal(parse(body, 0, &p, &err), 0);
        assert_true(p.h.has_bootstrap);
        assert_true((double)p.h.bootstrap_room == strtod(rooms[i], NULL));
        sim_params_free(&p);
    }
    expect_error("{\"prompt\":\"a\",\"bootstrap_host\":\"h\",\"bootstrap_port\":7,\"bootstrap_room\":-1}", 0, 400,
                 "must be given together");
    expect_error("{\"prompt\":\"a\",\"bootstrap_host\":\"h\",\"bootstrap_port\":7,\"bootstrap_room\":1.5}", 0, 400,
                 "must be given together");
    expect_error("{\"prompt\":\"a\",\"bootstrap_host\":\"h\",\"bootstrap_port\":7,\"bootstrap_room\":1e19}", 0, 400,
                 "must be given together");
}

static void test_lease_table(void **st)
{
    struct sim_lease_table t = {0};
    for (int i = 0; i < 3000; i++) {
        char key[32];
        snprintf(key, sizeof key, "req:%d", i);
        unsigned char *kv = malloc(8);
        assert_int_equal(sim_lease_put(&t, key, "eng", (uint64_t)i, 0, kv, 8, (uint64_t)(i % 2 ? 100 : 200)), 0);
    }
    assert_int_equal(t.count, 3000);
    assert_int_equal(sim_lease_put(&t, "req:7", "eng", 0, 0, malloc(1), 1, 0), -EEXIST);
    struct sim_lease *l = sim_lease_take(&t, "req:7");
    assert_non_null(l);
    assert_int_equal(l->block_sig, 7);
    sim_lease_free(l);
    assert_null(sim_lease_take(&t, "req:7"));
    assert_int_equal(sim_lease_expire(&t, 150), 1499); /* odd keys expire at 100, one was taken */
    assert_int_equal(t.count, 1500);
    assert_non_null(sim_lease_find(&t, "req:8"));
    assert_null(sim_lease_find(&t, "req:9"));
    sim_lease_clear(&t);
    assert_int_equal(t.count, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokens_words_and_ids), cmocka_unit_test(test_eos_probability),
        cmocka_unit_test(test_valid_completion),     cmocka_unit_test(test_valid_chat),
        cmocka_unit_test(test_rejections),           cmocka_unit_test(test_handoff_fields),
        cmocka_unit_test(test_lease_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
