/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_tokenizer.c - libFuzzer harness for libxpyd_tokenizer. The first byte picks the surface:
 *   even: the rest is a hostile tokenizer.json (xtok_load_json): loaded or refused with a reason, never a crash
 *         or a leak; one that loads encodes "hello <s> world" into ids below its vocabulary size;
 *   1:    the rest is text encoded by a small byte-level model with every supported part (NFC, a Split regex
 *         and ByteLevel, merges, ignore_merges, added tokens plain, lstrip/rstrip and normalized, a template):
 *         invalid UTF-8 is refused; valid text gives ids below the vocabulary size, the template's ids first and
 *         last with add_special, and the same ids in between as without; its NFC the same text as utf8proc's over
 *         the whole input;
 *   3:    the same with a small SentencePiece-style model (Prepend, Replace, NFC, byte_fallback, fuse_unk);
 *   5, 7: the same with that model pre-tokenized by Metaspace (prepend_scheme first: only the input's first piece);
 *   odd with 8: the byte-level model pre-tokenized by a Split whose pattern matches empty strings too, in the
 *         behaviour (and invert) the high nibble picks, then ByteLevel with add_prefix_space.
 *   Text also goes through a tokenization cache shared by every input (small, pieces of any length, so it
 *   evicts): twice, the same ids as without it (a piece found by its length and ends is another's only if its
 *   bytes are). */
#include "tok_internal.h"
#include "xpyd_tokenizer.h"

#include <assert.h>
#include <utf8proc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct xtok *model, *sp_model, *ms_model, *split_models[10];
static struct xtok_cache *cache, *sp_cache, *ms_cache, *split_caches[10]; /* a cache serves one tokenizer */

static void byte_level(int b, char *out) /* GPT-2's byte-level character of byte b, as UTF-8 */
{
    int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    int cp = b;
    if (!printable) {
        cp = 256;
        for (int k = 0; k < b; k++)
            if (!((k >= '!' && k <= '~') || (k >= 0xA1 && k <= 0xAC) || (k >= 0xAE && k <= 0xFF)))
                cp++;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

/* the byte-level model's pre-tokenizer: Llama 3's */
static const char LLAMA3_PRE[] =
    "{\"type\":\"Sequence\",\"pretokenizers\":["
    "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?i:'s|'t)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|"
    "\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},"
    "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
    "\"use_regex\":false}]}";

static struct xtok *build_model(const char *pre)
{
    static char json[65536];
    size_t n = 0;
    n += (size_t)snprintf(json + n, sizeof json - n,
                          "{\"normalizer\":{\"type\":\"NFC\"},\"pre_tokenizer\":%s,\"post_processor\"", pre);
    n += (size_t)snprintf(json + n, sizeof json - n, ":{\"type\":\"TemplateProcessing\",\"single\":["
                          "{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},"
                          "{\"SpecialToken\":{\"id\":\"</s>\",\"type_id\":0}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\","
                          "\"ids\":[300]},\"</s>\":{\"id\":\"</s>\",\"ids\":[301]}}},\"added_tokens\":["
                          "{\"id\":300,\"content\":\"<s>\",\"special\":true},{\"id\":301,\"content\":\"</s>\",\"special\":true},"
                          "{\"id\":302,\"content\":\"<mask>\",\"lstrip\":true,\"rstrip\":true},"
                          "{\"id\":303,\"content\":\"caf\\u00e9\",\"normalized\":true}],"
                          "\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,\"vocab\":{");
    char c[4];
    for (int b = 0; b < 256; b++) {
        byte_level(b, c);
        n += (size_t)snprintf(json + n, sizeof json - n, "\"%s%s\":%d,", c[0] == '"' || c[0] == '\\' ? "\\" : "", c, b);
    }
    n += (size_t)snprintf(json + n, sizeof json - n,
                          "\"he\":256,\"ll\":257,\"hell\":258,\"hello\":259,\"\\u0120w\":260,\"or\":261,\"\\u0120wor\":262,"
                          "\"\\u0120world\":263,\"ld\":264,\"aa\":265,\"aaa\":266},\"merges\":[\"h e\",\"l l\",\"he ll\","
                          "\"hell o\",\"\\u0120 w\",\"o r\",\"\\u0120w or\",\"l d\",\"\\u0120wor ld\",\"a a\",\"aa a\"]}}");
    char err[256];
    struct xtok *t = xtok_load_json(json, n, err, sizeof err);
    if (!t) {
        fprintf(stderr, "fuzz_tokenizer: the harness's model does not load: %s\n", err);
        abort();
    }
    return t;
}

/* a SentencePiece-style model: Llama 2's normalizers, or (metaspace) NFC and a Metaspace pre-tokenizer that
 * prepends to the input's first piece only, which the cache must keep apart */
static struct xtok *build_sp_model(int metaspace)
{
    static char json[16384];
    size_t n = (size_t)snprintf(json, sizeof json, "{\"normalizer\":%s,\"pre_tokenizer\":%s,",
                                metaspace ? "{\"type\":\"NFC\"}"
                                          : "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\","
                                            "\"prepend\":\"\\u2581\"},{\"type\":\"Replace\",\"pattern\":"
                                            "{\"String\":\" \"},\"content\":\"\\u2581\"},{\"type\":\"NFC\"}]}",
                                metaspace ? "{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\","
                                            "\"prepend_scheme\":\"first\",\"split\":true}"
                                          : "null");
    n += (size_t)snprintf(json + n, sizeof json - n,
                                "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":"
                                "{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},"
                                "{\"SpecialToken\":{\"id\":\"</s>\",\"type_id\":0}}],\"special_tokens\":{\"<s>\":"
                                "{\"id\":\"<s>\",\"ids\":[1]},\"</s>\":{\"id\":\"</s>\",\"ids\":[2]}}},"
                                "\"added_tokens\":[{\"id\":1,\"content\":\"<s>\",\"special\":true},{\"id\":2,"
                                "\"content\":\"</s>\",\"special\":true}],\"model\":{\"type\":\"BPE\",\"unk_token\":"
                                "\"<unk>\",\"byte_fallback\":true,\"fuse_unk\":true,\"vocab\":{\"<unk>\":0,\"<s>\":1,"
                                "\"</s>\":2,");
    for (int b = 0; b < 256; b++)
        if (b != 0x80) /* one byte without its token: characters with it become <unk> */
            n += (size_t)snprintf(json + n, sizeof json - n, "\"<0x%02X>\":%d,", b, 3 + b);
    n += (size_t)snprintf(json + n, sizeof json - n,
                          "\"\\u2581\":259,\"a\":260,\"b\":261,\"ab\":262,\"\\u2581ab\":263,\"\\u00e9\":264},"
                          "\"merges\":[\"a b\",\"\\u2581 ab\"]}}");
    char err[256];
    struct xtok *t = xtok_load_json(json, n, err, sizeof err);
    if (!t) {
        fprintf(stderr, "fuzz_tokenizer: the harness's SentencePiece model does not load: %s\n", err);
        abort();
    }
    return t;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    if (!model) {
        model = build_model(LLAMA3_PRE);
        for (int k = 0; k < 10; k++) { /* each Split behaviour, inverted or not, on a pattern with empty matches */
            static const char *const beh[] = {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext",
                                              "Contiguous"};
            char pre[512];
            snprintf(pre, sizeof pre, "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
                     "{\"Regex\":\"x*|(?=q)| |\\\\b\"},\"behavior\":\"%s\",\"invert\":%s},{\"type\":\"ByteLevel\","
                     "\"add_prefix_space\":true,\"use_regex\":true}]}", beh[k % 5], k < 5 ? "false" : "true");
            split_models[k] = build_model(pre);
            split_caches[k] = xtok_cache_new(1u << 14, 1);
        }
        sp_model = build_sp_model(0);
        ms_model = build_sp_model(1);
        cache = xtok_cache_new(1u << 16, 1);
        sp_cache = xtok_cache_new(1u << 16, 1);
        ms_cache = xtok_cache_new(1u << 16, 1);
    }
    if (size < 1)
        return 0;
    const char *rest = (const char *)data + 1;
    size_t len = size - 1;
    uint32_t *ids, *ids2;
    size_t n, n2;
    if (!(data[0] & 1)) {
        char err[256];
        struct xtok *t = xtok_load_json(rest, len, err, sizeof err);
        if (!t) {
            assert(err[0]);
            return 0;
        }
        if (xtok_encode(t, "hello <s> world", 15, 1, &ids, &n) == 0) {
            for (size_t i = 0; i < n; i++)
                assert(ids[i] < xtok_vocab_size(t));
            free(ids);
        }
        xtok_free(t);
        return 0;
    }
    int split = data[0] & 8, k = (data[0] >> 4) % 10;
    const struct xtok *m = split ? split_models[k] : data[0] & 4 ? ms_model : data[0] & 2 ? sp_model : model;
    struct xtok_cache *c = split ? split_caches[k] : data[0] & 4 ? ms_cache : data[0] & 2 ? sp_cache : cache;
    uint32_t bos = !split && data[0] & 6 ? 1 : 300, eos = !split && data[0] & 6 ? 2 : 301;
    int rc = xtok_encode(m, rest, len, 0, &ids, &n);
    if (rc) {
        assert(rc == XTOK_EINVAL);
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        assert(ids[i] < xtok_vocab_size(m));
    if (m == model) { /* its normalizer is NFC alone: the same text as utf8proc's NFC of the whole input (the
                       * library normalizes only between long ASCII stretches) */
        char *norm;
        size_t nl;
        assert(tok_normalize(m, rest, len, &norm, &nl) == 0);
        utf8proc_uint8_t *want = NULL;
        utf8proc_ssize_t wl = utf8proc_map((const utf8proc_uint8_t *)rest, (utf8proc_ssize_t)len, &want,
                                           UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        assert(wl >= 0 && (size_t)wl == nl && !memcmp(norm ? norm : rest, want, nl));
        free(want);
        free(norm);
    }
    assert(xtok_encode(m, rest, len, 1, &ids2, &n2) == 0);
    assert(n2 == n + 2 && ids2[0] == bos && ids2[n + 1] == eos && !memcmp(ids2 + 1, ids, n * sizeof *ids));
    free(ids2);
    for (int k = 0; k < 2; k++) {
        assert(xtok_encode_cached(m, c, rest, len, 0, &ids2, &n2) == 0);
        assert(n2 == n && !memcmp(ids2, ids, n * sizeof *ids));
        free(ids2);
    }
    free(ids);
    return 0;
}
