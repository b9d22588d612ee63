/* SPDX-License-Identifier: Apache-2.0 */
/* test_kv_events.c - the KV-event decoder (router/kv_events.c) on batches built by hand: with msgpack-c's packer
 * in both encodings vLLM has used (maps tagged with "type", arrays led by the class name, trailing defaults
 * omitted), one written out byte by byte, block hashes as unsigned, negative and binary values, unknown keys and
 * trailing elements, and every refusal by cause. */
#include "kv_events.h"

#include <msgpack.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <xxhash.h>

#include <cmocka.h>

static const struct kve_limits LIM = {1000, 1000, 100000};
/* a LoRA adapter's name of 93 bytes (a repository path and a version, as names can be) */
#define LONG_ADAPTER "adapter-a/customer-support-finetune-llama-3.1-8b-instruct-2026-12-07-checkpoint-0000012000-v2"

static void str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

static int decode(msgpack_sbuffer *sb, struct kv_batch *b)
{
    char err[200];
    return kve_decode(sb->data, sb->size, &LIM, b, err, sizeof err);
}

static void map_encoding(void **state)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 4);
    str(&pk, "ts");
    msgpack_pack_double(&pk, 1712.5);
    str(&pk, "unknown_key");
    msgpack_pack_true(&pk);
    str(&pk, "events");
    msgpack_pack_array(&pk, 3);
    msgpack_pack_map(&pk, 11);
    str(&pk, "type");
    str(&pk, "BlockStored");
    str(&pk, "block_hashes");
    msgpack_pack_array(&pk, 2);
    msgpack_pack_uint64(&pk, 18446744073709551615ULL);
    msgpack_pack_int64(&pk, -2);
    str(&pk, "parent_block_hash");
    msgpack_pack_uint64(&pk, 7);
    str(&pk, "token_ids");
    msgpack_pack_array(&pk, 4);
    for (int i = 0; i < 4; i++)
        msgpack_pack_uint32(&pk, 100000 + (uint32_t)i);
    str(&pk, "block_size");
    msgpack_pack_int(&pk, 2);
    str(&pk, "lora_id");
    msgpack_pack_nil(&pk);
    str(&pk, "medium");
    str(&pk, "GPU");
    str(&pk, "lora_name");
    str(&pk, LONG_ADAPTER);
    str(&pk, "kv_cache_spec_kind");
    str(&pk, "full_attention");
    str(&pk, "something_new");
    msgpack_pack_array(&pk, 0);
    str(&pk, "extra_keys"); /* per block: none, then an image's hash and offset */
    msgpack_pack_array(&pk, 2);
    msgpack_pack_nil(&pk);
    msgpack_pack_array(&pk, 2);
    str(&pk, "mm-hash-0");
    msgpack_pack_int(&pk, 3);
    msgpack_pack_map(&pk, 3);
    str(&pk, "type");
    str(&pk, "BlockRemoved");
    str(&pk, "block_hashes");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_uint64(&pk, 42);
    str(&pk, "group_idx");
    msgpack_pack_int(&pk, 1);
    msgpack_pack_map(&pk, 1);
    str(&pk, "type");
    str(&pk, "AllBlocksCleared");
    str(&pk, "data_parallel_rank");
    msgpack_pack_int(&pk, 3);
    struct kv_batch b;
    assert_int_equal(decode(&sb, &b), KVE_OK);
    assert_true(b.ts == 1712.5);
    assert_int_equal(b.dp_rank, 3);
    assert_int_equal(b.n, 3);
    assert_int_equal(b.ev[0].type, KVE_STORED);
    assert_int_equal(b.ev[0].nhashes, 2);
    assert_true(b.ev[0].hashes[0] == 18446744073709551615ULL);
    assert_true(b.ev[0].hashes[1] == (uint64_t)-2); /* a signed hash keeps its 64 bits */
    assert_true(b.ev[0].has_parent && b.ev[0].parent == 7);
    assert_int_equal(b.ev[0].ntokens, 4);
    assert_int_equal(b.ev[0].tokens[3], 100003);
    assert_int_equal(b.ev[0].block_size, 2);
    assert_int_equal(b.ev[0].lora_id, -1);
    /* a name longer than what is kept to print: hashed whole (names alike in their first 63 bytes differ) */
    assert_int_equal(b.ev[0].lora_len, strlen(LONG_ADAPTER));
    assert_int_equal(strlen(b.ev[0].lora_name), 63);
    assert_memory_equal(b.ev[0].lora_name, LONG_ADAPTER, 63);
    assert_true(b.ev[0].lora_hash == XXH3_64bits(LONG_ADAPTER, strlen(LONG_ADAPTER)));
    assert_string_equal(b.ev[0].medium, "GPU");
    assert_true(b.ev[0].full_attention);
    assert_non_null(b.ev[0].extra);
    assert_true(b.ev[0].extra[0] == 0 && b.ev[0].extra[1] != 0);
    assert_int_equal(b.ev[1].type, KVE_REMOVED);
    assert_true(b.ev[1].nhashes == 1 && b.ev[1].hashes[0] == 42);
    assert_int_equal(b.ev[1].group_idx, 1);
    assert_int_equal(b.ev[2].type, KVE_CLEARED);
    kve_batch_free(&b);
    msgpack_sbuffer_destroy(&sb);
}

static void array_encoding(void **state)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 2); /* no data_parallel_rank (an older engine) */
    msgpack_pack_int(&pk, 99);
    msgpack_pack_array(&pk, 4);
    msgpack_pack_array(&pk, 7); /* trailing defaults (lora_name ...) omitted */
    str(&pk, "BlockStored");
    msgpack_pack_array(&pk, 1);
    unsigned char h32[32];
    for (int i = 0; i < 32; i++)
        h32[i] = (unsigned char)i;
    msgpack_pack_bin(&pk, 32);
    msgpack_pack_bin_body(&pk, h32, 32);
    msgpack_pack_nil(&pk);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_uint32(&pk, 5);
    msgpack_pack_uint32(&pk, 6);
    msgpack_pack_int(&pk, 2);
    msgpack_pack_int(&pk, 7);
    str(&pk, "CPU");
    msgpack_pack_array(&pk, 12); /* more fields than today's: ignored */
    str(&pk, "BlockStored");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_bin(&pk, 16);
    msgpack_pack_bin_body(&pk, h32 + 16, 16);
    msgpack_pack_uint64(&pk, 1);
    msgpack_pack_array(&pk, 0);
    msgpack_pack_int(&pk, 16);
    for (int i = 0; i < 4; i++)
        msgpack_pack_nil(&pk);
    msgpack_pack_int(&pk, 2);
    str(&pk, "sliding_window");
    msgpack_pack_int(&pk, 4096);
    msgpack_pack_array(&pk, 3);
    str(&pk, "BlockRemoved");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_int64(&pk, -1);
    str(&pk, "GPU");
    msgpack_pack_array(&pk, 1);
    str(&pk, "AllBlocksCleared");
    struct kv_batch b;
    assert_int_equal(decode(&sb, &b), KVE_OK);
    assert_true(b.ts == 99);
    assert_int_equal(b.dp_rank, -1);
    assert_int_equal(b.n, 4);
    assert_true(b.ev[0].hashes[0] == 0x18191a1b1c1d1e1fULL); /* the last 8 bytes, big-endian */
    assert_false(b.ev[0].has_parent);
    assert_int_equal(b.ev[0].ntokens, 2);
    assert_int_equal(b.ev[0].block_size, 2);
    assert_int_equal(b.ev[0].lora_id, 7);
    assert_string_equal(b.ev[0].medium, "CPU");
    assert_true(b.ev[0].full_attention);
    assert_true(b.ev[1].hashes[0] == 0x18191a1b1c1d1e1fULL);
    assert_int_equal(b.ev[1].group_idx, 2);
    assert_false(b.ev[1].full_attention); /* a sliding-window group does not drive routing */
    assert_int_equal(b.ev[2].type, KVE_REMOVED);
    assert_true(b.ev[2].hashes[0] == UINT64_MAX);
    assert_string_equal(b.ev[2].medium, "GPU");
    assert_int_equal(b.ev[3].type, KVE_CLEARED);
    kve_batch_free(&b);
    msgpack_sbuffer_destroy(&sb);
}

static void written_byte_by_byte(void **state)
{
    /* {"ts": 1.5, "events": [{"type": "AllBlocksCleared"}], "data_parallel_rank": 0} */
    static const unsigned char bytes[] = {
        0x83, 0xa2, 't', 's', 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0xa6, 'e', 'v', 'e', 'n', 't', 's', 0x91, 0x81,
        0xa4, 't', 'y', 'p', 'e', 0xb0, 'A', 'l', 'l', 'B', 'l', 'o', 'c', 'k', 's', 'C', 'l', 'e', 'a', 'r', 'e', 'd',
        0xb2, 'd', 'a', 't', 'a', '_', 'p', 'a', 'r', 'a', 'l', 'l', 'e', 'l', '_', 'r', 'a', 'n', 'k', 0x00};
    struct kv_batch b;
    char err[200];
    assert_int_equal(kve_decode(bytes, sizeof bytes, &LIM, &b, err, sizeof err), KVE_OK);
    assert_true(b.ts == 1.5);
    assert_int_equal(b.dp_rank, 0);
    assert_int_equal(b.n, 1);
    assert_int_equal(b.ev[0].type, KVE_CLEARED);
    kve_batch_free(&b);
    /* the same with a byte of garbage after it, and cut short */
    unsigned char more[sizeof bytes + 1];
    memcpy(more, bytes, sizeof bytes);
    more[sizeof bytes] = 0xc0;
    assert_int_equal(kve_decode(more, sizeof more, &LIM, &b, err, sizeof err), KVE_EMSGPACK);
    assert_int_equal(kve_decode(bytes, sizeof bytes - 3, &LIM, &b, err, sizeof err), KVE_EMSGPACK);
}

static int one_event(void (*build)(msgpack_packer *pk), const struct kve_limits *lim)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_int(&pk, 0);
    msgpack_pack_array(&pk, 1);
    build(&pk);
    struct kv_batch b;
    char err[200];
    int rc = kve_decode(sb.data, sb.size, lim, &b, err, sizeof err);
    if (rc == KVE_OK)
        kve_batch_free(&b);
    else
        assert_true(err[0] != '\0');
    msgpack_sbuffer_destroy(&sb);
    return rc;
}

static void unknown_type(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 1);
    str(pk, "BlockMoved");
}

static void short_hash(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 3);
    str(pk, "BlockRemoved");
    msgpack_pack_array(pk, 1);
    msgpack_pack_bin(pk, 4);
    msgpack_pack_bin_body(pk, "abcd", 4);
    str(pk, "GPU");
}

static void float_hash(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 2);
    str(pk, "BlockRemoved");
    msgpack_pack_array(pk, 1);
    msgpack_pack_double(pk, 1.5);
}

static void many_hashes(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 2);
    str(pk, "BlockRemoved");
    msgpack_pack_array(pk, 3);
    for (int i = 0; i < 3; i++)
        msgpack_pack_int(pk, i);
}

static void not_an_event(msgpack_packer *pk)
{
    msgpack_pack_int(pk, 5);
}

static void negative_token(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 4);
    str(pk, "BlockStored");
    msgpack_pack_array(pk, 0);
    msgpack_pack_nil(pk);
    msgpack_pack_array(pk, 1);
    msgpack_pack_int(pk, -5);
}

static void refusals_by_cause(void **state)
{
    struct kve_limits tight = {10, 2, 10};
    assert_int_equal(one_event(unknown_type, &LIM), KVE_ETYPE);
    assert_int_equal(one_event(short_hash, &LIM), KVE_EHASH);
    assert_int_equal(one_event(float_hash, &LIM), KVE_EHASH);
    assert_int_equal(one_event(many_hashes, &tight), KVE_ELIMIT);
    assert_int_equal(one_event(many_hashes, &LIM), KVE_OK);
    assert_int_equal(one_event(not_an_event, &LIM), KVE_ESHAPE);
    assert_int_equal(one_event(negative_token, &LIM), KVE_ESHAPE);
    struct kv_batch b;
    char err[200];
    assert_int_equal(kve_decode("\x93\x01", 2, &LIM, &b, err, sizeof err), KVE_EMSGPACK);
    /* containers declaring more elements than there are bytes: refused before msgpack-c allocates for them */
    assert_int_equal(kve_decode("\xdd\xff\xff\xff\xff", 5, &LIM, &b, err, sizeof err), KVE_EMSGPACK);
    assert_int_equal(kve_decode("\x82\xa6" "events" "\xdf\x7f\xff\xff\xff", 13, &LIM, &b, err, sizeof err), KVE_EMSGPACK);
    assert_int_equal(kve_decode("\x91\x01", 2, &LIM, &b, err, sizeof err), KVE_ESHAPE); /* no events */
    assert_string_equal(kve_error_names[KVE_ELIMIT], "limit");
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(map_encoding), cmocka_unit_test(array_encoding),
                                       cmocka_unit_test(written_byte_by_byte), cmocka_unit_test(refusals_by_cause)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
