/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_metadata.c - libFuzzer harness: the /metadata store (router/metadata_store.c) driven by a sequence of
 * operations read from the input (decode a key; put / get / delete with small limits), checked against a
 * model kept here: a get returns exactly the last value put, a delete removes, the count never exceeds the
 * key limit, oversize values are refused, nothing leaks. */
#include "metadata_store.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NK 8

struct model {
    int present;
    size_t len;
    unsigned char val[64];
};

struct got {
    size_t len;
    unsigned char val[64];
};

static void take(void *arg, const void *val, size_t len)
{
    struct got *g = arg;
    g->len = len;
    memcpy(g->val, val, len < sizeof g->val ? len : sizeof g->val);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* part 1: key decoding of the input as a query value */
    char raw[3100], key[MD_KEY_MAX + 1];
    size_t rl = size < sizeof raw - 1 ? size : sizeof raw - 1;
    memcpy(raw, data, rl);
    raw[rl] = 0;
    if (md_key_decode(raw, key) == 0 && (!key[0] || strlen(key) > MD_KEY_MAX))
        abort();
    /* part 2: operations */
    struct md_store *s = md_store_new();
    struct model m[NK] = {{0}};
    const size_t max_keys = 5, max_value = 48;
    for (size_t i = 0; i + 2 < size; i += 3) {
        int op = data[i] % 3, k = data[i + 1] % NK;
        size_t len = data[i + 2] % 64;
        char name[16] = "k0";
        name[1] = (char)('0' + k);
        if (op == 0) {
            unsigned char v[64];
            for (size_t j = 0; j < len; j++)
                v[j] = (unsigned char)(data[i] + j);
            size_t count = 0;
            for (int j = 0; j < NK; j++)
                count += m[j].present;
            int rc = md_put(s, name, v, len, max_keys, max_value);
            int want = len > max_value ? -E2BIG : (!m[k].present && count >= max_keys) ? -ENOSPC : 0;
            if (rc != want)
                abort();
            if (rc == 0) {
                m[k].present = 1;
                m[k].len = len;
                memcpy(m[k].val, v, len);
            }
        } else if (op == 1) {
            struct got g = {0};
            int rc = md_get(s, name, take, &g);
            if ((rc == 0) != m[k].present || (rc == 0 && (g.len != m[k].len || memcmp(g.val, m[k].val, g.len))))
                abort();
        } else {
            int rc = md_del(s, name);
            if ((rc == 0) != m[k].present)
                abort();
            m[k].present = 0;
        }
        size_t count = 0;
        for (int j = 0; j < NK; j++)
            count += m[j].present;
        if (md_count(s) != count || count > max_keys)
            abort();
    }
    md_store_free(s);
    return 0;
}
