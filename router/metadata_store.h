/* SPDX-License-Identifier: Apache-2.0 */
/* metadata_store.h - the Mooncake-compatible metadata store itself (keys to byte values, bounded), without
 * HTTP: metadata.c serves it, tests/fuzz/fuzz_metadata.c drives it directly. Thread-safe. */
#ifndef XPYD_METADATA_STORE_H
#define XPYD_METADATA_STORE_H

#include <stddef.h>

#define MD_KEY_MAX 1024

struct md_store;

struct md_store *md_store_new(void);
void md_store_free(struct md_store *s);
/* Decodes a ?key= query value (%xx and '+') into out (room for MD_KEY_MAX + 1). 0, or -1 when it is empty,
 * longer than MD_KEY_MAX once decoded, or decodes to a NUL. */
int md_key_decode(const char *raw, char *out);
/* 0 stored; -E2BIG the value is over max_value; -ENOSPC the store holds max_keys keys (a new key). */
int md_put(struct md_store *s, const char *key, const void *val, size_t len, size_t max_keys, size_t max_value);
/* Calls fn with the value while the store is locked (fn must not call back into the store). -ENOENT if absent. */
int md_get(struct md_store *s, const char *key, void (*fn)(void *arg, const void *val, size_t len), void *arg);
/* 0 deleted, -ENOENT absent. */
int md_del(struct md_store *s, const char *key);
size_t md_count(struct md_store *s);

#endif
