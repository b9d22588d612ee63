/* SPDX-License-Identifier: Apache-2.0 */
/* kv_events.c - one KV-event batch decoded with msgpack-c (kv_events.h). Field names and order are vLLM's
 * (vllm/distributed/kv_events.py: EventBatch, BlockStored, BlockRemoved, AllBlocksCleared; msgspec structs
 * tagged by class name, encoded as maps with "type" now and as arrays led by the class name before). */
#include "kv_events.h"

#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

const char *const kve_error_names[KVE_ECOUNT] = {"none", "msgpack", "shape", "type", "hash", "limit", "memory"};

struct dec {
    const struct kve_limits *lim;
    char *err;
    size_t errlen;
};

static int fail(struct dec *d, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(struct dec *d, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->err, d->errlen, fmt, ap);
    va_end(ap);
    return code;
}

static int str_is(const msgpack_object *o, const char *s)
{
    size_t n = strlen(s);
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size == n && !memcmp(o->via.str.ptr, s, n);
}

static int is_nil(const msgpack_object *o)
{
    return !o || o->type == MSGPACK_OBJECT_NIL;
}

/* A block hash: an integer (a negative one as its 64 bits), or bytes whose last 8 are the big-endian value. */
static int hash_of(struct dec *d, const msgpack_object *o, uint64_t *h)
{
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        *h = o->via.u64;
        return 0;
    }
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *h = (uint64_t)o->via.i64;
        return 0;
    }
    if ((o->type == MSGPACK_OBJECT_BIN || o->type == MSGPACK_OBJECT_STR) && o->via.bin.size >= 8) {
        const unsigned char *p = (const unsigned char *)o->via.bin.ptr + o->via.bin.size - 8;
        uint64_t v = 0;
        for (int i = 0; i < 8; i++)
            v = v << 8 | p[i];
        *h = v;
        return 0;
    }
    return fail(d, KVE_EHASH, "a block hash is neither an integer nor 8 bytes or more");
}

static int int_of(const msgpack_object *o, int64_t *v)
{
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT64_MAX) {
        *v = (int64_t)o->via.u64;
        return 1;
    }
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *v = o->via.i64;
        return 1;
    }
    return 0;
}

void kve_set_lora(struct kv_event *e, const char *name, size_t len)
{
    size_t n = len < sizeof e->lora_name - 1 ? len : sizeof e->lora_name - 1;
    memcpy(e->lora_name, name, n);
    e->lora_name[n] = '\0';
    e->lora_len = len;
    e->lora_hash = len ? XXH3_64bits(name, len) : 0;
}

static void copy_str(const msgpack_object *o, char *out, size_t cap)
{
    out[0] = '\0';
    if (o && o->type == MSGPACK_OBJECT_STR) {
        size_t n = o->via.str.size < cap - 1 ? o->via.str.size : cap - 1;
        memcpy(out, o->via.str.ptr, n);
        out[n] = '\0';
    }
}

/* An event's array field (field names it in errors): an array of at most limit elements, or the reason why not. */
static int array_field(struct dec *d, const msgpack_object *o, const char *field, size_t limit)
{
    if (!o || o->type != MSGPACK_OBJECT_ARRAY)
        return fail(d, KVE_ESHAPE, "%s is not an array", field);
    if (o->via.array.size > limit)
        return fail(d, KVE_ELIMIT, "%u elements of %s in one event (limit %zu)", o->via.array.size, field, limit);
    return 0;
}

static int hashes_of(struct dec *d, const msgpack_object *o, struct kv_event *e)
{
    int rc = array_field(d, o, "block_hashes", d->lim->max_hashes);
    if (rc)
        return rc;
    e->hashes = malloc((o->via.array.size + 1) * sizeof *e->hashes);
    if (!e->hashes)
        return fail(d, KVE_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < o->via.array.size; i++)
        if ((rc = hash_of(d, &o->via.array.ptr[i], &e->hashes[i])))
            return rc;
    e->nhashes = o->via.array.size;
    return 0;
}

static int tokens_of(struct dec *d, const msgpack_object *o, struct kv_event *e)
{
    if (is_nil(o))
        return 0;
    int rc = array_field(d, o, "token_ids", d->lim->max_tokens);
    if (rc)
        return rc;
    e->tokens = malloc((o->via.array.size + 1) * sizeof *e->tokens);
    if (!e->tokens)
        return fail(d, KVE_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < o->via.array.size; i++) {
        const msgpack_object *t = &o->via.array.ptr[i];
        if (t->type != MSGPACK_OBJECT_POSITIVE_INTEGER || t->via.u64 > UINT32_MAX)
            return fail(d, KVE_ESHAPE, "a token id is not an unsigned 32-bit integer");
        e->tokens[i] = (uint32_t)t->via.u64;
    }
    e->ntokens = o->via.array.size;
    return 0;
}

/* the key an extra_keys entry is kept by: its msgpack bytes (as msgpack-c packs them), hashed; never 0 ("none") */
static uint64_t packed_hash(const msgpack_sbuffer *sb)
{
    return XXH3_64bits(sb->data, sb->size) | 1;
}

/* the event's per-block extra keys, all "none" at first (allocated once) */
static int extras_alloc(struct dec *d, struct kv_event *e)
{
    if (!e->extra && !(e->extra = calloc(e->nhashes + 1, sizeof *e->extra)))
        return fail(d, KVE_ENOMEM, "out of memory");
    return 0;
}

static int same_str(const msgpack_object *a, const msgpack_object *b)
{
    return a && b && a->type == MSGPACK_OBJECT_STR && b->type == MSGPACK_OBJECT_STR &&
           a->via.str.size == b->via.str.size && !memcmp(a->via.str.ptr, b->via.str.ptr, a->via.str.size);
}

/* extra_keys: one entry per block (None, or what else names the block's content, in vLLM's order: the LoRA name,
 * multimodal hashes, the cache salt on the first block); each non-null entry kept as a hash of its msgpack bytes
 * (kve_extra_hash), 0 for none. A leading LoRA name equal to the event's lora_name is left out: the adapter is the
 * index's key space already, and SGLang and older vLLM leave it out of extra_keys. The whole field nil: NULL. */
static int extra_of(struct dec *d, const msgpack_object *o, const msgpack_object *lora, struct kv_event *e)
{
    if (is_nil(o))
        return 0;
    int rc = array_field(d, o, "extra_keys", d->lim->max_hashes);
    if (rc || (rc = extras_alloc(d, e)))
        return rc;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    for (uint32_t i = 0; i < o->via.array.size && i < e->nhashes; i++) {
        const msgpack_object *x = &o->via.array.ptr[i];
        if (is_nil(x))
            continue;
        msgpack_sbuffer_clear(&sb);
        if (x->type == MSGPACK_OBJECT_ARRAY && x->via.array.size >= 1 && same_str(&x->via.array.ptr[0], lora)) {
            if (x->via.array.size == 1)
                continue; /* the adapter's name alone: nothing else names the block */
            msgpack_pack_array(&pk, x->via.array.size - 1);
            for (uint32_t k = 1; k < x->via.array.size; k++)
                msgpack_pack_object(&pk, x->via.array.ptr[k]);
        } else {
            msgpack_pack_object(&pk, *x);
        }
        e->extra[i] = packed_hash(&sb);
    }
    msgpack_sbuffer_destroy(&sb);
    return 0;
}

/* A salted run that starts a prompt (no parent) is keyed as vLLM keys one: [salt] in its first block's extra keys;
 * a run with a parent inherits the salt through its parent's key. */
static int salt_of(struct dec *d, const msgpack_object *meta, struct kv_event *e)
{
    for (uint32_t i = 0; i < meta->via.map.size; i++) {
        const msgpack_object *v = &meta->via.map.ptr[i].val;
        if (!str_is(&meta->via.map.ptr[i].key, "cache_salt") || v->type != MSGPACK_OBJECT_STR || !v->via.str.size ||
            e->has_parent || !e->nhashes)
            continue;
        int rc = extras_alloc(d, e);
        if (rc)
            return rc;
        if (!e->extra[0]) {
            const char *p = v->via.str.ptr;
            size_t n = v->via.str.size;
            e->extra[0] = kve_extra_hash(&p, &n, 1);
        }
    }
    return 0;
}

/* The fields of one event, whichever encoding: f[k] is the k-th field of its class, NULL when absent. */
enum { F_HASHES, F_PARENT, F_TOKENS, F_BLOCK_SIZE, F_LORA_ID, F_MEDIUM, F_LORA_NAME, F_EXTRA, F_GROUP, F_KIND, F_META, NF };
static const char *const STORED[NF] = {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                                       "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
                                       "metadata"};

static int fill(struct dec *d, struct kv_event *e, const msgpack_object **f)
{
    int64_t v;
    e->lora_id = -1;
    e->group_idx = -1;
    e->full_attention = 1;
    if (e->type == KVE_CLEARED)
        return 0;
    int rc = hashes_of(d, f[F_HASHES], e);
    if (rc)
        return rc;
    copy_str(f[F_MEDIUM], e->medium, sizeof e->medium);
    if (f[F_GROUP] && int_of(f[F_GROUP], &v))
        e->group_idx = (long)v;
    if (e->type == KVE_REMOVED)
        return 0;
    if (!is_nil(f[F_PARENT])) {
        if ((rc = hash_of(d, f[F_PARENT], &e->parent)))
            return rc;
        e->has_parent = 1;
    }
    if ((rc = tokens_of(d, f[F_TOKENS], e)) || (rc = extra_of(d, f[F_EXTRA], f[F_LORA_NAME], e)))
        return rc;
    if (f[F_BLOCK_SIZE] && int_of(f[F_BLOCK_SIZE], &v) && v > 0)
        e->block_size = (long)v;
    if (f[F_LORA_ID] && int_of(f[F_LORA_ID], &v))
        e->lora_id = v;
    if (f[F_LORA_NAME] && f[F_LORA_NAME]->type == MSGPACK_OBJECT_STR)
        kve_set_lora(e, f[F_LORA_NAME]->via.str.ptr, f[F_LORA_NAME]->via.str.size);
    if (!is_nil(f[F_KIND]) && !str_is(f[F_KIND], "full_attention"))
        e->full_attention = 0;
    /* SGLang's BlockStoredWithMetadata: {"cache_salt": S} as "metadata" (maps), or after medium (arrays, where vLLM
     * has lora_name: a string there, never a map) */
    const msgpack_object *meta = f[F_META] && f[F_META]->type == MSGPACK_OBJECT_MAP ? f[F_META]
                                 : f[F_LORA_NAME] && f[F_LORA_NAME]->type == MSGPACK_OBJECT_MAP ? f[F_LORA_NAME]
                                                                                                   : NULL;
    return meta ? salt_of(d, meta, e) : 0;
}

static int event_of(struct dec *d, const msgpack_object *o, struct kv_event *e)
{
    const msgpack_object *f[NF] = {0}, *type = NULL;
    if (o->type == MSGPACK_OBJECT_ARRAY && o->via.array.size >= 1) { /* ["BlockStored", field, field, ...] */
        type = &o->via.array.ptr[0];
        int removed = str_is(type, "BlockRemoved");
        for (uint32_t i = 1; i < o->via.array.size; i++) {
            /* BlockRemoved's fields are block_hashes, medium, group_idx */
            int k = removed ? (i == 1 ? F_HASHES : i == 2 ? F_MEDIUM : i == 3 ? F_GROUP : NF) : (int)i - 1;
            if (k < NF)
                f[k] = &o->via.array.ptr[i];
        }
    } else if (o->type == MSGPACK_OBJECT_MAP) { /* {"type": "BlockStored", "block_hashes": ..., ...} */
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            const msgpack_object *k = &o->via.map.ptr[i].key, *v = &o->via.map.ptr[i].val;
            if (str_is(k, "type"))
                type = v;
            for (int j = 0; j < NF; j++)
                if (str_is(k, STORED[j]))
                    f[j] = v;
        }
    } else {
        return fail(d, KVE_ESHAPE, "an event is neither an array nor a map");
    }
    if (type && str_is(type, "BlockStored"))
        e->type = KVE_STORED;
    else if (type && str_is(type, "BlockRemoved"))
        e->type = KVE_REMOVED;
    else if (type && str_is(type, "AllBlocksCleared"))
        e->type = KVE_CLEARED;
    else
        return fail(d, KVE_ETYPE, "an event of unknown type");
    return fill(d, e, f);
}

static uint64_t be(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

/* msgpack-c's C unpacker allocates what a container's header declares before reading its elements (a 9-byte
 * payload can ask for gigabytes): the payload is walked first, and a container declaring more elements than
 * there are bytes left, or a string longer than the rest, is refused. */
static int sane(const unsigned char *p, size_t n)
{
    uint64_t need = 1;
    size_t i = 0;
    while (need) {
        if (i >= n)
            return 0;
        unsigned c = p[i++];
        uint64_t skip = 0, items = 0;
        int hdr = 0;
        if (c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3)
            ;
        else if (c >= 0x80 && c <= 0x8f)
            items = 2 * (uint64_t)(c & 0x0f);
        else if (c >= 0x90 && c <= 0x9f)
            items = c & 0x0f;
        else if (c >= 0xa0 && c <= 0xbf)
            skip = c & 0x1f;
        else if (c == 0xc4 || c == 0xd9)
            hdr = 1;
        else if (c == 0xc5 || c == 0xda)
            hdr = 2;
        else if (c == 0xc6 || c == 0xdb)
            hdr = 4;
        else if (c >= 0xc7 && c <= 0xc9) /* ext: a length, a type byte, the data */
            hdr = c == 0xc7 ? 1 : c == 0xc8 ? 2 : 4, skip = 1;
        else if (c == 0xca || c == 0xce || c == 0xd2)
            skip = 4;
        else if (c == 0xcb || c == 0xcf || c == 0xd3)
            skip = 8;
        else if (c == 0xcc || c == 0xd0)
            skip = 1;
        else if (c == 0xcd || c == 0xd1)
            skip = 2;
        else if (c >= 0xd4 && c <= 0xd8) /* fixext 1, 2, 4, 8, 16: a type byte and the data */
            skip = 1 + (1u << (c - 0xd4));
        else if (c == 0xdc || c == 0xdd || c == 0xde || c == 0xdf) {
            int w = c == 0xdc || c == 0xde ? 2 : 4;
            if (n - i < (size_t)w)
                return 0;
            items = be(p + i, w) * (c >= 0xde ? 2 : 1);
            i += (size_t)w;
        } else {
            return 0; /* 0xc1: never used */
        }
        if (hdr) {
            if (n - i < (size_t)hdr)
                return 0;
            skip += be(p + i, hdr);
            i += (size_t)hdr;
        }
        if (skip > n - i || items > n - i) /* every element takes a byte at least */
            return 0;
        i += (size_t)skip;
        need = need - 1 + items;
        if (need > n - i + 1)
            return 0;
    }
    return i == n;
}

static double num_of(const msgpack_object *o)
{
    int64_t v;
    if (o && (o->type == MSGPACK_OBJECT_FLOAT64 || o->type == MSGPACK_OBJECT_FLOAT32))
        return o->via.f64;
    return o && int_of(o, &v) ? (double)v : 0;
}

int kve_decode(const void *buf, size_t len, const struct kve_limits *lim, struct kv_batch *out, char *err,
               size_t errlen)
{
    struct dec d = {lim, err, errlen};
    memset(out, 0, sizeof *out);
    out->dp_rank = -1;
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    int rc;
    if (!sane(buf, len) || msgpack_unpack_next(&u, buf, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len) {
        msgpack_unpacked_destroy(&u);
        return fail(&d, KVE_EMSGPACK, "not one msgpack value");
    }
    const msgpack_object *root = &u.data, *ts = NULL, *events = NULL, *rank = NULL;
    if (root->type == MSGPACK_OBJECT_ARRAY) { /* [ts, events, data_parallel_rank?] */
        ts = root->via.array.size > 0 ? &root->via.array.ptr[0] : NULL;
        events = root->via.array.size > 1 ? &root->via.array.ptr[1] : NULL;
        rank = root->via.array.size > 2 ? &root->via.array.ptr[2] : NULL;
    } else if (root->type == MSGPACK_OBJECT_MAP) {
        for (uint32_t i = 0; i < root->via.map.size; i++) {
            const msgpack_object *k = &root->via.map.ptr[i].key, *v = &root->via.map.ptr[i].val;
            if (str_is(k, "ts"))
                ts = v;
            else if (str_is(k, "events"))
                events = v;
            else if (str_is(k, "data_parallel_rank"))
                rank = v;
        }
    }
    if (!events || events->type != MSGPACK_OBJECT_ARRAY) {
        msgpack_unpacked_destroy(&u);
        return fail(&d, KVE_ESHAPE, "the batch has no events array");
    }
    if (events->via.array.size > lim->max_events) {
        unsigned count = events->via.array.size; /* read before the objects are freed */
        msgpack_unpacked_destroy(&u);
        return fail(&d, KVE_ELIMIT, "%u events in one batch (limit %zu)", count, lim->max_events);
    }
    out->ts = num_of(ts);
    int64_t r;
    if (rank && int_of(rank, &r) && r >= 0)
        out->dp_rank = (long)r;
    out->ev = calloc(events->via.array.size + 1, sizeof *out->ev);
    if (!out->ev) {
        msgpack_unpacked_destroy(&u);
        return fail(&d, KVE_ENOMEM, "out of memory");
    }
    for (uint32_t i = 0; i < events->via.array.size; i++) {
        out->n++;
        if ((rc = event_of(&d, &events->via.array.ptr[i], &out->ev[i])) != 0) {
            msgpack_unpacked_destroy(&u);
            kve_batch_free(out);
            return rc;
        }
    }
    msgpack_unpacked_destroy(&u);
    return KVE_OK;
}

void kve_batch_free(struct kv_batch *b)
{
    for (size_t i = 0; b->ev && i < b->n; i++) {
        free(b->ev[i].hashes);
        free(b->ev[i].tokens);
        free(b->ev[i].extra);
    }
    free(b->ev);
    b->ev = NULL;
    b->n = 0;
}

uint64_t kve_extra_hash(const char *const *strs, const size_t *lens, int n)
{
    if (n <= 0)
        return 0;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, (size_t)n);
    for (int i = 0; i < n; i++) {
        msgpack_pack_str(&pk, lens[i]);
        msgpack_pack_str_body(&pk, strs[i], lens[i]);
    }
    uint64_t h = sb.data ? packed_hash(&sb) : 0;
    msgpack_sbuffer_destroy(&sb);
    return h;
}
