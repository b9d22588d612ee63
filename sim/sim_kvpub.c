/* SPDX-License-Identifier: Apache-2.0 */
/* sim_kvpub.c - KV events of the simulated engine (sim_kvpub.h): msgpack-c packs, libzmq sends. The PUB sockets
 * are used by the sim's event loop only; the replay sockets by one thread of their own, which reads the rank's
 * buffer of sent batches under its lock. */
#include "sim_kvpub.h"

#include "sim_internal.h"
#include "xpyd_util.h"

#include <msgpack.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <zmq.h>

struct sim_kvrank {
    void *pub, *replay;
    uint64_t seq;
    msgpack_sbuffer ev; /* the events packed since the last flush */
    size_t nev;
    pthread_mutex_t mu; /* the buffer of sent batches, read by the replay thread */
    char **sent;        /* ring of the last cap payloads: sent[seq % cap] */
    size_t *sent_len;
    uint64_t first;     /* oldest seq still in the ring */
};

static struct {
    void *ctx;
    pthread_t th;
    int th_on;
    atomic_int stop;
    struct sim *s;
} P;

static void str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

/* a block hash: 32 bytes (vLLM's sha256_cbor is 32 bytes), or as SGLang sends it, a signed 64-bit integer (its
 * hash_str_to_int64 of a SHA-256: here the first 8 bytes, big-endian) */
static void hash(msgpack_packer *pk, const unsigned char *h, int as_int)
{
    if (as_int) {
        uint64_t v = 0;
        for (int i = 0; i < 8; i++)
            v = v << 8 | h[i];
        msgpack_pack_int64(pk, (int64_t)v);
        return;
    }
    msgpack_pack_bin(pk, 32);
    msgpack_pack_bin_body(pk, h, 32);
}

/* endpoint with port + off; "*" kept (bind) or not (connect) by the caller */
static void offset_endpoint(const char *ep, int off, char *out, size_t cap)
{
    const char *colon = strrchr(ep, ':');
    snprintf(out, cap, "%.*s:%ld", (int)(colon - ep), ep, strtol(colon + 1, NULL, 10) + off);
}

static int open_socket(void **sock, int type, const char *ep, int rank)
{
    char at[320];
    offset_endpoint(ep, rank, at, sizeof at);
    int zero = 0;
    *sock = zmq_socket(P.ctx, type);
    if (!*sock)
        return -1;
    zmq_setsockopt(*sock, ZMQ_LINGER, &zero, sizeof zero);
    int rc = strchr(at, '*') ? zmq_bind(*sock, at) : zmq_connect(*sock, at);
    if (rc != 0) {
        XLOG_ERR("msg=\"--kv-events\" endpoint=\"%s\" reason=\"%s\"", at, zmq_strerror(zmq_errno()));
        return -1;
    }
    return 0;
}

static void *replay_thread(void *arg)
{
    (void)arg;
    struct sim *s = P.s;
    zmq_pollitem_t *it = calloc((size_t)s->nranks, sizeof *it);
    for (int r = 0; it && r < s->nranks; r++)
        it[r] = (zmq_pollitem_t){s->ranks[r].kv->replay, 0, ZMQ_POLLIN, 0};
    while (it && !atomic_load(&P.stop)) {
        if (zmq_poll(it, s->nranks, 100) <= 0)
            continue;
        for (int r = 0; r < s->nranks; r++) {
            if (!(it[r].revents & ZMQ_POLLIN))
                continue;
            struct sim_kvrank *k = s->ranks[r].kv;
            /* vLLM's ROUTER takes exactly [identity, "", start] (what a REQ socket sends), else logs the request
             * as invalid; it answers [identity, "", seq, payload] ... and [identity, "", -1, ""] */
            zmq_msg_t m[3];
            int nm = 0, more = 1;
            while (more) {
                zmq_msg_t x;
                zmq_msg_init(&x);
                if (zmq_msg_recv(&x, k->replay, 0) < 0) {
                    zmq_msg_close(&x);
                    break;
                }
                more = zmq_msg_more(&x);
                if (nm < 3)
                    m[nm] = x;
                else
                    zmq_msg_close(&x);
                nm++;
            }
            if (nm != 3 || zmq_msg_size(&m[1]) != 0 || zmq_msg_size(&m[2]) != 8) {
                for (int i = 0; i < nm && i < 3; i++)
                    zmq_msg_close(&m[i]);
                continue;
            }
            zmq_msg_t id = m[0], req = m[2];
            zmq_msg_close(&m[1]);
            uint64_t from = 0;
            const unsigned char *b = zmq_msg_data(&req);
            for (int i = 0; i < 8; i++)
                from = from << 8 | b[i];
            size_t cap = (size_t)s->cfg.kv_events_buffer;
            pthread_mutex_lock(&k->mu);
            for (uint64_t q = from > k->first ? from : k->first; q < k->seq; q++) {
                unsigned char sb[8];
                for (int i = 0; i < 8; i++)
                    sb[i] = (unsigned char)(q >> (56 - 8 * i));
                zmq_send(k->replay, zmq_msg_data(&id), zmq_msg_size(&id), ZMQ_SNDMORE);
                zmq_send(k->replay, "", 0, ZMQ_SNDMORE);
                zmq_send(k->replay, sb, 8, ZMQ_SNDMORE);
                zmq_send(k->replay, k->sent[q % cap], k->sent_len[q % cap], 0);
            }
            pthread_mutex_unlock(&k->mu);
            static const unsigned char end[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
            zmq_send(k->replay, zmq_msg_data(&id), zmq_msg_size(&id), ZMQ_SNDMORE);
            zmq_send(k->replay, "", 0, ZMQ_SNDMORE);
            zmq_send(k->replay, end, 8, ZMQ_SNDMORE);
            zmq_send(k->replay, "", 0, 0);
            zmq_msg_close(&id);
            zmq_msg_close(&req);
        }
    }
    free(it);
    return NULL;
}

int sim_kvpub_start(struct sim *s)
{
    const struct sim_config *c = &s->cfg;
    if (!c->kv_events[0])
        return 0;
    P.s = s;
    if (!(P.ctx = zmq_ctx_new()))
        return -1;
    for (int r = 0; r < s->nranks; r++) {
        struct sim_kvrank *k = XPYD_XALLOC(calloc(1, sizeof *k));
        s->ranks[r].kv = k;
        msgpack_sbuffer_init(&k->ev);
        pthread_mutex_init(&k->mu, NULL);
        k->sent = XPYD_XALLOC(calloc((size_t)c->kv_events_buffer, sizeof *k->sent));
        k->sent_len = XPYD_XALLOC(calloc((size_t)c->kv_events_buffer, sizeof *k->sent_len));
        if (open_socket(&k->pub, ZMQ_PUB, c->kv_events, r) ||
            (c->kv_events_replay[0] && open_socket(&k->replay, ZMQ_ROUTER, c->kv_events_replay, r)))
            return -1;
    }
    if (c->kv_events_replay[0]) {
        if (pthread_create(&P.th, NULL, replay_thread, NULL) != 0)
            return -1;
        P.th_on = 1;
    }
    return 0;
}

void sim_kvpub_stop(struct sim *s)
{
    if (!P.ctx)
        return;
    atomic_store(&P.stop, 1);
    if (P.th_on)
        pthread_join(P.th, NULL);
    for (int r = 0; r < s->nranks; r++) {
        struct sim_kvrank *k = s->ranks[r].kv;
        if (!k)
            continue;
        if (k->pub)
            zmq_close(k->pub);
        if (k->replay)
            zmq_close(k->replay);
        for (long i = 0; i < s->cfg.kv_events_buffer; i++)
            free(k->sent[i]);
        free(k->sent);
        free(k->sent_len);
        msgpack_sbuffer_destroy(&k->ev);
        pthread_mutex_destroy(&k->mu);
        free(k);
        s->ranks[r].kv = NULL;
    }
    zmq_ctx_term(P.ctx);
    P.ctx = NULL;
}

/* One event into rank rk's pending batch: its class, then fields (named in the map format, by position in the
 * array format, where trailing defaults are left out: the map has `map_fields`, the array `array_fields`). */
struct ev {
    msgpack_packer pk;
    int map, sglang;
};

enum { FMT_MAP, FMT_ARRAY, FMT_SGLANG }; /* --kv-events-format */

static int event_begin(struct sim_rank *rk, struct ev *e, const char *cls, uint32_t map_fields, uint32_t array_fields)
{
    struct sim_kvrank *k = rk->kv;
    if (!k)
        return 0;
    msgpack_packer_init(&e->pk, &k->ev, msgpack_sbuffer_write);
    e->map = rk->sim->cfg.kv_events_format == FMT_MAP;
    e->sglang = rk->sim->cfg.kv_events_format == FMT_SGLANG;
    if (e->map) {
        msgpack_pack_map(&e->pk, map_fields + 1);
        str(&e->pk, "type");
    } else {
        msgpack_pack_array(&e->pk, array_fields + 1);
    }
    str(&e->pk, cls);
    k->nev++;
    return 1;
}

static msgpack_packer *field(struct ev *e, const char *name)
{
    if (e->map)
        str(&e->pk, name);
    return &e->pk;
}

static void hash_list(struct ev *e, const unsigned char (*hashes)[32], size_t n)
{
    msgpack_pack_array(field(e, "block_hashes"), n);
    for (size_t i = 0; i < n; i++)
        hash(&e->pk, hashes[i], e->sglang);
}

/* One BlockStored of n blocks. SGLang (e.sglang) sends a block an event, positional with integer hashes, and a
 * salted request's {"cache_salt": S} after the medium (its BlockStoredWithMetadata) where vLLM has extra_keys. */
static void stored_event(struct sim_rank *rk, const unsigned char (*hashes)[32], size_t n, const unsigned char *parent,
                         const uint32_t *tokens, size_t block_size, const char *salt)
{
    struct ev e;
    uint32_t positional = !salt ? 6 : rk->sim->cfg.kv_events_format == FMT_SGLANG ? 7 : 8;
    if (!n || !event_begin(rk, &e, "BlockStored", salt ? 8 : 7, positional))
        return;
    hash_list(&e, hashes, n);
    if (parent)
        hash(field(&e, "parent_block_hash"), parent, e.sglang);
    else
        msgpack_pack_nil(field(&e, "parent_block_hash"));
    msgpack_pack_array(field(&e, "token_ids"), n * block_size);
    for (size_t i = 0; i < n * block_size; i++)
        msgpack_pack_uint32(&e.pk, tokens[i]);
    msgpack_pack_uint64(field(&e, "block_size"), block_size);
    msgpack_pack_nil(field(&e, "lora_id"));
    str(field(&e, "medium"), "GPU");
    if (salt && e.sglang) {
        msgpack_pack_map(&e.pk, 1);
        str(&e.pk, "cache_salt");
        str(&e.pk, salt);
        return;
    }
    if (e.map || salt) /* positional: a trailing default, left out */
        msgpack_pack_nil(field(&e, "lora_name"));
    if (salt) {
        msgpack_pack_array(field(&e, "extra_keys"), n);
        msgpack_pack_array(&e.pk, 1);
        str(&e.pk, salt);
        for (size_t i = 1; i < n; i++)
            msgpack_pack_nil(&e.pk);
    }
}

void sim_kvpub_stored(struct sim_rank *rk, const unsigned char (*hashes)[32], size_t n, const unsigned char *parent,
                      const uint32_t *tokens, size_t ntokens, size_t block_size, const char *salt)
{
    if (ntokens != n * block_size)
        return;
    if (!rk->kv || rk->sim->cfg.kv_events_format != FMT_SGLANG) {
        stored_event(rk, hashes, n, parent, tokens, block_size, salt);
        return;
    }
    for (size_t i = 0; i < n; i++) /* SGLang: an event a page, each the next one's parent */
        stored_event(rk, hashes + i, 1, i ? hashes[i - 1] : parent, tokens + i * block_size, block_size, salt);
}

void sim_kvpub_removed(struct sim_rank *rk, const unsigned char (*hashes)[32], size_t n)
{
    int per_block = rk->kv && rk->sim->cfg.kv_events_format == FMT_SGLANG; /* SGLang: an event a page */
    for (size_t i = 0; i < n; i += per_block ? 1 : n) {
        struct ev e;
        if (!event_begin(rk, &e, "BlockRemoved", 2, 2))
            return;
        hash_list(&e, hashes + i, per_block ? 1 : n);
        str(field(&e, "medium"), "GPU");
    }
}

void sim_kvpub_cleared(struct sim_rank *rk)
{
    struct ev e;
    event_begin(rk, &e, "AllBlocksCleared", 0, 0);
}

void sim_kvpub_flush(struct sim_rank *rk)
{
    struct sim_kvrank *k = rk->kv;
    if (!k || !k->nev)
        return;
    msgpack_sbuffer b;
    msgpack_sbuffer_init(&b);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &b, msgpack_sbuffer_write);
    struct timeval tv;
    gettimeofday(&tv, NULL);
    int m = rk->sim->cfg.kv_events_format == FMT_MAP;
    if (m) {
        msgpack_pack_map(&pk, 3);
        str(&pk, "ts");
    } else {
        msgpack_pack_array(&pk, 3);
    }
    msgpack_pack_double(&pk, (double)tv.tv_sec + (double)tv.tv_usec / 1e6);
    if (m)
        str(&pk, "events");
    msgpack_pack_array(&pk, k->nev);
    msgpack_sbuffer_write(&b, k->ev.data, k->ev.size);
    if (m)
        str(&pk, "data_parallel_rank");
    msgpack_pack_int(&pk, rk->idx);
    msgpack_sbuffer_clear(&k->ev);
    k->nev = 0;
    unsigned char seq[8];
    for (int i = 0; i < 8; i++)
        seq[i] = (unsigned char)(k->seq >> (56 - 8 * i));
    const char *topic = rk->sim->cfg.kv_events_topic;
    zmq_send(k->pub, topic, strlen(topic), ZMQ_SNDMORE);
    zmq_send(k->pub, seq, 8, ZMQ_SNDMORE);
    zmq_send(k->pub, b.data, b.size, 0);
    size_t cap = (size_t)rk->sim->cfg.kv_events_buffer;
    pthread_mutex_lock(&k->mu); /* kept for replays: the ring's oldest gives way */
    free(k->sent[k->seq % cap]);
    k->sent_len[k->seq % cap] = b.size;
    k->sent[k->seq % cap] = msgpack_sbuffer_release(&b);
    k->seq++;
    if (k->seq - k->first > cap)
        k->first = k->seq - cap;
    pthread_mutex_unlock(&k->mu);
    msgpack_sbuffer_destroy(&b);
}
