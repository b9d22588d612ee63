/* SPDX-License-Identifier: Apache-2.0 */
/* metadata_store.c - the metadata store behind /metadata (see metadata_store.h): a chained hash table under
 * one mutex; values are copied in and out. */
#include "metadata_store.h"

#include "xpyd_util.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define MD_BUCKETS 4096

struct md_entry {
    struct md_entry *next;
    char *key;
    char *val;
    size_t len;
};

struct md_store {
    pthread_mutex_t mu;
    struct md_entry *b[MD_BUCKETS];
    size_t n;
};

struct md_store *md_store_new(void)
{
    struct md_store *s = XPYD_XALLOC(calloc(1, sizeof *s));
    pthread_mutex_init(&s->mu, NULL);
    return s;
}

void md_store_free(struct md_store *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < MD_BUCKETS; i++)
        for (struct md_entry *e = s->b[i], *nx; e; e = nx) {
            nx = e->next;
            free(e->key);
            free(e->val);
            free(e);
        }
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

int md_key_decode(const char *raw, char *key)
{
    if (!raw || !raw[0])
        return -1;
    size_t kl = 0;
    for (const char *c = raw; *c; c++) { /* %xx and + decoded */
        if (kl >= MD_KEY_MAX)
            return -1;
        int hi, lo;
        if (*c == '%' && (hi = hexval(c[1])) >= 0 && (lo = hexval(c[2])) >= 0) {
            key[kl++] = (char)(hi * 16 + lo);
            c += 2;
        } else {
            key[kl++] = *c == '+' ? ' ' : *c;
        }
    }
    key[kl] = 0;
    return strlen(key) == kl ? 0 : -1;
}

static struct md_entry **slot(struct md_store *s, const char *key)
{
    struct md_entry **pp = &s->b[xpyd_fnv64(XPYD_FNV_INIT, key, strlen(key)) % MD_BUCKETS];
    while (*pp && strcmp((*pp)->key, key) != 0)
        pp = &(*pp)->next;
    return pp;
}

int md_put(struct md_store *s, const char *key, const void *val, size_t len, size_t max_keys, size_t max_value)
{
    if (len > max_value)
        return -E2BIG;
    char *copy = XPYD_XALLOC(malloc(len ? len : 1));
    memcpy(copy, val, len);
    pthread_mutex_lock(&s->mu);
    struct md_entry **pp = slot(s, key);
    if (!*pp && s->n >= max_keys) {
        pthread_mutex_unlock(&s->mu);
        free(copy);
        return -ENOSPC;
    }
    if (*pp) {
        free((*pp)->val);
    } else {
        struct md_entry *e = XPYD_XALLOC(calloc(1, sizeof *e));
        e->key = XPYD_XALLOC(strdup(key));
        *pp = e;
        s->n++;
    }
    (*pp)->val = copy;
    (*pp)->len = len;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int md_get(struct md_store *s, const char *key, void (*fn)(void *arg, const void *val, size_t len), void *arg)
{
    pthread_mutex_lock(&s->mu);
    struct md_entry *e = *slot(s, key);
    if (e)
        fn(arg, e->val, e->len);
    pthread_mutex_unlock(&s->mu);
    return e ? 0 : -ENOENT;
}

int md_del(struct md_store *s, const char *key)
{
    pthread_mutex_lock(&s->mu);
    struct md_entry **pp = slot(s, key), *e = *pp;
    if (e) {
        *pp = e->next;
        s->n--;
    }
    pthread_mutex_unlock(&s->mu);
    if (!e)
        return -ENOENT;
    free(e->key);
    free(e->val);
    free(e);
    return 0;
}

size_t md_count(struct md_store *s)
{
    pthread_mutex_lock(&s->mu);
    size_t n = s->n;
    pthread_mutex_unlock(&s->mu);
    return n;
}
