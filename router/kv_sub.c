/* SPDX-License-Identifier: Apache-2.0 */
/* kv_sub.c - the KV-event consumer (kv_sub.h): one thread, one ZeroMQ SUB socket per rank with an endpoint
 * (connect mode) and the sockets bound for engines that connect (--kv-events-bind: the topic names the engine),
 * polled together; batches decoded and applied to the pool's index as they come. A replay is one more socket in
 * the same poll (its rank's messages wait, the others' do not; bounded by --kv-events-replay-timeout-ms);
 * placement reads the index from the event loops (kv_query.c). Its /metrics series: kv_metrics.c. */
#include "kv_sub.h"

#include "kv_events.h"
#include "kv_endpoint.h"
#include "kv_index.h"
#include "kv_sub_internal.h"
#include "prompt.h"
#include "router.h"
#include "xb.h"
#include "xpyd_util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <zmq.h>

#define DRAIN_MAX 256 /* messages taken from one socket before the others get their turn */
#define K kv_K
#define roles kv_roles

struct kv_consumer kv_K = {.wake_mu = PTHREAD_MUTEX_INITIALIZER};
const char *const kv_roles[2] = {"prefill", "decode"};

static uint64_t be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

/* A full-attention BlockStored's block size against --prefix-block-tokens: blocks that are neither a whole number
 * of the router's nor a whole part of one never match a prompt's, so the rank is placed by the router's own guess
 * until they are again. Said when it changes, at most once every 10 s a rank (a publisher flapping between sizes
 * does not flood the log). */
static void block_size_seen(int role, int rank, const struct kv_event *ev, int unlike)
{
    if (ev->type != KVE_STORED)
        return;
    struct kv_src *s = &K.src[role][rank];
    long was = atomic_exchange(&s->unlike_bs, unlike ? ev->block_size : 0);
    uint64_t now = xpyd_now_us();
    uint64_t said = atomic_load(&s->bs_said_at);
    if (!unlike == !was || (said && now - said < 10000000u))
        return;
    atomic_store(&s->bs_said_at, now);
    char hp[300];
    rt_rank_identity(role, rank, hp, sizeof hp);
    if (unlike)
        XLOG_WARN("msg=\"KV events in blocks that are neither a multiple nor a divisor of --prefix-block-tokens: "
                  "they cannot match a prompt's blocks, the rank is placed by the router's own guess; set "
                  "--prefix-block-tokens %ld (the engines' block size; a divisor or multiple of it will do)\" "
                  "role=%s rank=%d engine=%s block_size=%ld prefix_block_tokens=%ld",
                  ev->block_size, roles[role], rank, hp, ev->block_size, g_rt->cfg.prefix_block_tokens);
    else
        XLOG_INFO("msg=\"KV events in a multiple or a divisor of the router's block size again: the rank is "
                  "placed by its events\" role=%s rank=%d engine=%s block_size=%ld prefix_block_tokens=%ld",
                  roles[role], rank, hp, ev->block_size > 0 ? ev->block_size : g_rt->cfg.prefix_block_tokens,
                  g_rt->cfg.prefix_block_tokens);
}

static void apply(int role, int rank, const void *buf, size_t len)
{
    size_t lim = (size_t)g_rt->cfg.kv_events_max_bytes; /* every element takes a byte at least */
    struct kve_limits l = {lim, lim, lim};
    struct kv_batch b;
    char err[200];
    int rc = kve_decode(buf, len, &l, &b, err, sizeof err);
    if (rc != KVE_OK) {
        atomic_fetch_add(&K.decode_errors[role][rc], 1);
        XLOG_DEBUG("msg=\"KV-event batch refused\" role=%s rank=%d cause=%s err=\"%s\"", roles[role], rank,
                   kve_error_names[rc], err);
        return;
    }
    atomic_fetch_add(&K.batches[role], 1);
    struct timeval tv;
    gettimeofday(&tv, NULL);
    double lag = (double)tv.tv_sec + (double)tv.tv_usec / 1e6 - b.ts;
    atomic_store(&K.lag_us[role], lag > 0 && lag < 1e6 ? (uint64_t)(lag * 1e6) : 0);
    for (size_t i = 0; i < b.n; i++) {
        atomic_fetch_add(&K.events[role][b.ev[i].type - 1], 1);
        atomic_fetch_add(&K.src[role][rank].events, 1);
        int r = kvi_apply(K.idx[role], rank, &b.ev[i], g_rt->cfg.prefix_block_tokens);
        if (r == KVI_OK || r == KVI_BLOCK_SIZE)
            block_size_seen(role, rank, &b.ev[i], r == KVI_BLOCK_SIZE);
        if (b.ev[i].type == KVE_CLEARED)
            atomic_store(&K.src[role][rank].dropped_at, xpyd_now_us());
        if (r != KVI_OK)
            atomic_fetch_add(&K.skipped[role][r], 1);
    }
    kve_batch_free(&b);
}

#define FRAMES 4 /* frames kept of a message: an event message has 3, a replay answer up to 4 */

/* Receives one multipart message without waiting: 1 with *nf its number of frames (the first FRAMES kept in f: a
 * message of more is refused by its count, not read as its first ones), 0 when none waits. */
static int recv_msg(void *sock, zmq_msg_t *f, int *nf)
{
    *nf = 0;
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, sock, *nf ? 0 : ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return *nf > 0;
        }
        int more = zmq_msg_more(&m);
        if (*nf < FRAMES)
            f[*nf] = m;
        else
            zmq_msg_close(&m);
        if (*nf < 1000000)
            (*nf)++;
        if (!more)
            return 1;
    }
}

static void close_frames(zmq_msg_t *f, int nf)
{
    for (int i = 0; i < nf && i < FRAMES; i++)
        zmq_msg_close(&f[i]);
}

/* A message taken in order: the rank's number moves on, its batch is applied, the rank is heard. */
static void take_in_order(int role, int rank, struct kv_src *s, uint64_t seq, const void *buf, size_t len)
{
    s->have_seq = 1;
    s->seq = seq;
    apply(role, rank, buf, len);
    atomic_store(&s->first_sent, 0);
    atomic_store(&s->up, 1); /* a message proves the connection, whatever the monitor said (or has yet to say) */
}

static void on_seq(int role, int rank, struct kv_src *s, uint64_t seq, const void *buf, size_t len);

/* Bind mode: a message for a rank whose replay is under way, kept for after it (dropped when --kv-events-hwm
 * wait already: the next message taken then shows the gap, as a full ZeroMQ queue would in connect mode). */
static void wait_push(int role, struct kv_src *s, uint64_t seq, const void *buf, size_t len)
{
    struct kv_wait *w = s->nwait < (size_t)g_rt->cfg.kv_events_hwm ? malloc(sizeof *w + len) : NULL;
    if (!w)
        return;
    w->next = NULL;
    w->seq = seq;
    w->len = len;
    memcpy(w->data, buf, len);
    *(s->wait ? &s->wait_tail->next : &s->wait) = w;
    s->wait_tail = w;
    s->nwait++;
    atomic_fetch_add(&K.waiting[role], 1);
}

/* The oldest message kept, or NULL; the caller frees it. */
static struct kv_wait *wait_pop(int role, struct kv_src *s)
{
    struct kv_wait *w = s->wait;
    if (w) {
        if (!(s->wait = w->next))
            s->wait_tail = NULL;
        s->nwait--;
        atomic_fetch_sub(&K.waiting[role], 1);
    }
    return w;
}

static void wait_free(int role, struct kv_src *s)
{
    struct kv_wait *w;
    while ((w = wait_pop(role, s)))
        free(w);
}

static void replay_close(struct kv_src *s)
{
    if (s->rep)
        zmq_close(s->rep);
    free(s->held);
    s->rep = s->held = NULL;
}

/* Forgets what rank reports holding, and what the router sent it before now (no longer pending there) */
static void forget(int role, int rank)
{
    kvi_drop_rank(K.idx[role], rank);
    atomic_store(&K.src[role][rank].dropped_at, xpyd_now_us());
}

/* The replay ended: ok 0 when everything asked for came in order. A gap's replay that failed forgets the rank
 * (what was missed may have removed blocks); then the message that showed the gap is applied, then those kept
 * meanwhile (bind mode), in order, until one of them shows a gap of its own (its replay then starts). */
static void replay_end(int role, int rank, struct kv_src *s, int ok)
{
    atomic_fetch_add(ok == 0 ? &K.replays_ok[role] : &K.replays_failed[role], 1);
    if (ok != 0 && s->rep_strict)
        forget(role, rank);
    void *held = s->held;
    s->held = NULL;
    replay_close(s);
    take_in_order(role, rank, s, s->held_seq, held, s->held_len);
    free(held);
    struct kv_wait *w;
    while (!s->rep && (w = wait_pop(role, s))) {
        on_seq(role, rank, s, w->seq, w->data, w->len);
        free(w);
    }
}

/* Asks rank's replay endpoint for batches [from, upto), the message f (numbered upto) held until they came: the
 * DEALER is then read by the consumer's poll beside the other ranks' sockets (a slow replay holds up only its own
 * rank), within --kv-events-replay-timeout-ms. 0 when asked; -1 when it could not be (nothing held). strict 0 (a
 * late joiner asking from 0): the buffer may start later, and what it has is taken from its first batch on. */
/* Where a rank's engine answers replays: its event port + --kv-events-replay-offset; in bind mode its host (the
 * topic's) at --kv-events-bind-replay-port + the port offset it connected to (vLLM offsets both by the DP rank).
 * 0 when it has none (ep NULL: only whether it has one). */
static int replay_endpoint(const struct kv_src *s, char *ep, size_t cap)
{
    const char *colon = strrchr(s->bound, ':');
    int by_port = s->ep[0] && g_rt->cfg.kv_events_replay_offset > 0,
        by_host = !s->ep[0] && colon && g_rt->cfg.kv_events_bind_replay_port > 0;
    if (!ep || !(by_port || by_host)) /* only whether it has one */
        return by_port || by_host;
    if (by_port) {
        rt_kv_endpoint_rank(s->ep, (int)g_rt->cfg.kv_events_replay_offset, ep, cap);
    } else {
        char host[300]; /* as the router lists it: an IPv6 address in brackets */
        int br = s->bound[0] == '[' && colon > s->bound && colon[-1] == ']';
        snprintf(host, sizeof host, "%.*s", (int)(colon - s->bound) - 2 * br, s->bound + br);
        rt_kv_endpoint_make(host, (int)(g_rt->cfg.kv_events_bind_replay_port + s->bound_r), ep, cap);
    }
    return 1;
}

static int replay_start(struct kv_src *s, uint64_t from, uint64_t upto, int strict, const void *buf, size_t len)
{
    char ep[320];
    if (!replay_endpoint(s, ep, sizeof ep))
        return -1;
    void *d = zmq_socket(K.ctx, ZMQ_DEALER);
    int zero = 0;
    int64_t max = g_rt->cfg.kv_events_max_bytes;
    unsigned char req[8];
    for (int i = 0; i < 8; i++)
        req[i] = (unsigned char)(from >> (56 - 8 * i));
    /* as vLLM's example subscriber asks with a REQ socket: an empty delimiter, then the number (vLLM's ROUTER
     * takes exactly [identity, "", start] and answers [identity, "", seq, payload]) */
    void *held = malloc(len ? len : 1);
    if (!d || !held || zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero) ||
        zmq_setsockopt(d, ZMQ_MAXMSGSIZE, &max, sizeof max) || zmq_connect(d, ep) != 0 ||
        zmq_send(d, "", 0, ZMQ_SNDMORE) != 0 || zmq_send(d, req, sizeof req, 0) != sizeof req) {
        if (d)
            zmq_close(d);
        free(held);
        return -1;
    }
    memcpy(held, buf, len);
    s->rep = d;
    s->held = held;
    s->held_len = len;
    s->held_seq = upto;
    s->rep_from = s->rep_next = from;
    s->rep_upto = upto;
    s->rep_strict = strict;
    s->rep_deadline = xpyd_now_us() + (uint64_t)g_rt->cfg.kv_events_replay_timeout_ms * 1000u;
    return 0;
}

/* The replay's answers so far: ["", seq, payload] (vLLM; newer ones put the topic before seq), then seq -1 and an
 * empty payload; an answer without the delimiter is taken too. */
static void replay_input(int role, int rank, struct kv_src *s)
{
    zmq_msg_t f[FRAMES];
    int nf;
    while (s->rep && recv_msg(s->rep, f, &nf)) {
        int ok = -1, k = nf >= 3 && nf <= FRAMES && !zmq_msg_size(&f[0]); /* past the delimiter */
        k += nf - k == 3; /* [topic, seq, payload] */
        if (nf - k == 2 && zmq_msg_size(&f[k]) == 8) {
            zmq_msg_t *fs = &f[k];
            uint64_t seq = be64(zmq_msg_data(&fs[0]));
            if (!zmq_msg_size(&fs[1])) { /* the end: everything asked for came, or the buffer had less */
                ok = s->rep_next >= s->rep_upto ? 0 : 1;
            } else {
                if (!s->rep_strict && s->rep_next == s->rep_from && seq > s->rep_from && seq < s->rep_upto)
                    s->rep_next = seq; /* its oldest kept batch */
                if (seq == s->rep_next && seq < s->rep_upto) {
                    apply(role, rank, zmq_msg_data(&fs[1]), zmq_msg_size(&fs[1]));
                    if (++s->rep_next >= s->rep_upto)
                        ok = 0;
                } else if (seq > s->rep_next) { /* older ones no longer buffered */
                    ok = 1;
                }
            }
        }
        close_frames(f, nf);
        if (ok >= 0)
            replay_end(role, rank, s, ok);
    }
}

/* A rank's message numbered seq, taken in its turn. */
static void on_seq(int role, int rank, struct kv_src *s, uint64_t seq, const void *buf, size_t len)
{
    int replayable = replay_endpoint(s, NULL, 0);
    if (s->have_seq && seq <= s->seq) { /* numbered afresh: the engine restarted, its cache empty */
        atomic_fetch_add(&K.resets[role], 1);
        forget(role, rank);
    } else if (s->have_seq && seq > s->seq + 1) {
        atomic_fetch_add(&K.gaps[role], 1);
        if (replayable && replay_start(s, s->seq + 1, seq, 1, buf, len) == 0)
            return; /* this message waits for the replay */
        if (replayable)
            atomic_fetch_add(&K.replays_failed[role], 1);
        forget(role, rank); /* what was missed may have removed blocks: start afresh */
    } else if (!s->have_seq && seq > 0 && replayable) {
        if (replay_start(s, 0, seq, 0, buf, len) == 0) /* joined late: what the rank stored before, as far as it is */
            return;                             /* buffered */
        atomic_fetch_add(&K.replays_failed[role], 1);
    }
    take_in_order(role, rank, s, seq, buf, len);
}

/* A rank's message as it came: taken, or during the rank's replay kept for after it (bind mode: connect mode reads
 * a rank's socket only between its replays). */
static void on_message(int role, int rank, struct kv_src *s, zmq_msg_t *f, int nf)
{
    if (nf != 3 || zmq_msg_size(&f[1]) != 8) {
        atomic_fetch_add(&K.decode_errors[role][KVE_ESHAPE], 1);
        return;
    }
    uint64_t seq = be64(zmq_msg_data(&f[1]));
    if (s->rep)
        wait_push(role, s, seq, zmq_msg_data(&f[2]), zmq_msg_size(&f[2]));
    else
        on_seq(role, rank, s, seq, zmq_msg_data(&f[2]), zmq_msg_size(&f[2]));
}

/* A connection hint for the health checks (rt_kv_take_hint), and their wake-up. */
static void hint(struct kv_src *s, int h)
{
    atomic_store(&s->hint, h);
    pthread_mutex_lock(&K.wake_mu);
    if (K.wake)
        K.wake(K.wake_arg);
    pthread_mutex_unlock(&K.wake_mu);
}

int rt_kv_take_hint(int role, int idx)
{
    return K.src[role] && idx >= 0 && (size_t)idx < K.cap ? atomic_exchange(&K.src[role][idx].hint, KV_HINT_NONE)
                                                          : KV_HINT_NONE;
}

void rt_kv_on_hint(void (*wake)(void *), void *arg)
{
    pthread_mutex_lock(&K.wake_mu);
    K.wake = wake;
    K.wake_arg = arg;
    pthread_mutex_unlock(&K.wake_mu);
}

/* The publisher connected or went away. Gone (an engine stopping, restarting, or the network): what the rank
 * held is unknown from here (a restarted engine numbers from 0 again, and messages were lost meanwhile), so its
 * blocks are forgotten and it is not trusted until it is back. Either way the health checks hear of it. */
static void on_monitor(int role, int rank, struct kv_src *s)
{
    zmq_msg_t f[FRAMES];
    int nf;
    while (recv_msg(s->mon, f, &nf)) {
        uint16_t ev = 0;
        if (nf >= 1 && zmq_msg_size(&f[0]) >= 2)
            memcpy(&ev, zmq_msg_data(&f[0]), sizeof ev); /* native byte order, as libzmq writes it */
        close_frames(f, nf);
        if (ev == ZMQ_EVENT_CONNECTED) {
            atomic_store(&s->first_sent, 0);
            atomic_store(&s->up, 1);
            hint(s, KV_HINT_BACK);
        } else if (ev == ZMQ_EVENT_DISCONNECTED) {
            if (s->rep) { /* what it would have answered no longer matters: the rank starts afresh */
                atomic_fetch_add(&K.replays_failed[role], 1);
                replay_close(s);
            }
            atomic_store(&s->up, 0);
            atomic_fetch_add(&K.disconnects[role], 1);
            s->have_seq = 0;
            forget(role, rank);
            hint(s, KV_HINT_GONE);
        }
    }
}

static void unsubscribe(int role, int rank, struct kv_src *s)
{
    if (atomic_exchange(&s->on, 0))
        atomic_fetch_sub(&K.subscribed[role], 1);
    atomic_store(&s->up, 0);
    if (s->sub) {
        zmq_socket_monitor(s->sub, NULL, 0);
        zmq_close(s->sub);
    }
    if (s->mon)
        zmq_close(s->mon);
    s->sub = s->mon = NULL;
    replay_close(s);
    wait_free(role, s);
    s->ep[0] = 0;
    s->bound[0] = 0;
    s->have_seq = 0;
    forget(role, rank);
}

/* Bind mode. An engine that connects names itself by the topic: HOST:PORT as the registry lists it. Where
 * several ranks share that address (DP ranks pinned by header), the bound port's offset r is the DP rank (vLLM
 * offsets a connecting endpoint by its DP rank too).
 * Its directory: every live rank by (HOST:PORT, DP rank or -1, pool), sorted, rebuilt from the registry
 * at each sync (every 500 ms): a message is matched by two binary searches, and a topic naming no rank (a
 * flood of them, too) costs no registry lookups. The consumer thread's alone. */
struct dir_entry {
    char hp[300];
    int dp, role, rank;
};
static struct dir_entry *dir;
static size_t ndir, dircap;

static int dir_cmp(const void *a, const void *b)
{
    const struct dir_entry *x = a, *y = b;
    int c = strcmp(x->hp, y->hp);
    return c ? c : x->dp != y->dp ? (x->dp < y->dp ? -1 : 1) : x->role - y->role;
}

static void dir_build(void)
{
    ndir = 0;
    for (int role = 0; role < 2; role++) {
        size_t n = __atomic_load_n(&g_rt->reg.n_ranks[role], __ATOMIC_ACQUIRE);
        for (size_t i = 0; K.on[role] && i < n && i < K.cap; i++) {
            if (rt_rank_removed(role, (int)i))
                continue;
            if (ndir == dircap) {
                size_t nc = dircap ? 2 * dircap : 64;
                struct dir_entry *nd = realloc(dir, nc * sizeof *nd);
                if (!nd)
                    break; /* the ranks left out stay unmatched until the next sync */
                dir = nd;
                dircap = nc;
            }
            struct dir_entry *e = &dir[ndir++];
            e->dp = rt_rank_identity(role, (int)i, e->hp, sizeof e->hp);
            e->role = role;
            e->rank = (int)i;
        }
    }
    qsort(dir, ndir, sizeof *dir, dir_cmp);
}

static int dir_find(const char *engine, int r, int role)
{
    static struct dir_entry key; /* (the consumer thread's) */
    snprintf(key.hp, sizeof key.hp, "%s", engine);
    key.role = role;
    key.dp = r; /* DP ranks pinned by header at one address: the port's offset is the rank */
    const struct dir_entry *e = ndir ? bsearch(&key, dir, ndir, sizeof *dir, dir_cmp) : NULL;
    key.dp = -1; /* else an address of its own */
    if (!e && ndir)
        e = bsearch(&key, dir, ndir, sizeof *dir, dir_cmp);
    return e ? e->rank : -1;
}

/* a bound source still names its rank (not removed, its slot not another engine's): the directory just rebuilt */
static int bound_still(int role, int i, const struct kv_src *s)
{
    return dir_find(s->bound, s->bound_r, role) == i;
}

/* The rank of pool role a message on bound port + r with this topic is for, or -1. */
static int bound_rank(int role, const char *engine, int r)
{
    int i = dir_find(engine, r, role);
    if (i >= 0) {
        struct kv_src *s = &K.src[role][i];
        if (s->bound[0]) /* matched before: the sync keeps it honest */
            return s->bound_r == r && !strcmp(s->bound, engine) ? i : -1;
        if (s->ep[0]) /* its own endpoint wins */
            return -1;
        snprintf(s->bound, sizeof s->bound, "%s", engine);
        s->bound_r = r;
        s->have_seq = 0;
        atomic_store(&s->events, 0);
        atomic_store(&s->first_sent, 0);
        atomic_store(&s->on, 1);
        atomic_fetch_add(&K.subscribed[role], 1);
        XLOG_INFO("msg=\"KV events from a connected engine\" role=%s rank=%d engine=\"%s\" port_offset=%d", roles[role],
                  i, engine, r);
        return i;
    }
    return -1;
}

/* A message on bound port + r: for the rank its topic names in each pool that reads events (an engine listed in
 * both pools is both), else counted unmatched. */
static void on_bound_message(int r, zmq_msg_t *f, int nf)
{
    char engine[300];
    size_t tn = nf >= 1 ? zmq_msg_size(&f[0]) : 0;
    int hit = 0;
    if (tn > 0 && tn < sizeof engine) {
        memcpy(engine, zmq_msg_data(&f[0]), tn);
        engine[tn] = 0;
        for (int role = 0; role < 2; role++) {
            int rank = K.on[role] && !memchr(engine, 0, tn) ? bound_rank(role, engine, r) : -1;
            if (rank >= 0)
                on_message(role, rank, &K.src[role][rank], f, nf);
            hit |= rank >= 0;
        }
    }
    if (!hit)
        atomic_fetch_add(&K.unmatched, 1);
}

/* Follows the registry: a rank's endpoint new, changed or gone. */
static void sync_sources(void)
{
    if (K.nbound)
        dir_build();
    for (int role = 0; role < 2; role++) {
        if (!K.on[role])
            continue;
        size_t n = __atomic_load_n(&g_rt->reg.n_ranks[role], __ATOMIC_ACQUIRE);
        for (size_t i = 0; i < n && i < K.cap; i++) {
            struct kv_src *s = &K.src[role][i];
            char ep[300];
            if (!rt_rank_kv_events(role, (int)i, ep, sizeof ep))
                ep[0] = 0;
            if (s->bound[0] && !bound_still(role, (int)i, s)) /* removed, or its slot another engine's now */
                unsubscribe(role, (int)i, s);
            if (!strcmp(ep, s->ep))
                continue;
            if (s->ep[0] || s->bound[0]) /* (a rank's own endpoint wins over what the bound port hears) */
                unsubscribe(role, (int)i, s);
            if (!ep[0])
                continue;
            void *sub = zmq_socket(K.ctx, ZMQ_SUB);
            int zero = 0, hwm = (int)g_rt->cfg.kv_events_hwm, ivl = 100, ivl_max = 5000;
            int64_t max = g_rt->cfg.kv_events_max_bytes;
            if (!sub)
                continue;
            zmq_setsockopt(sub, ZMQ_LINGER, &zero, sizeof zero);
            zmq_setsockopt(sub, ZMQ_RCVHWM, &hwm, sizeof hwm);
            zmq_setsockopt(sub, ZMQ_MAXMSGSIZE, &max, sizeof max);
            zmq_setsockopt(sub, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
            zmq_setsockopt(sub, ZMQ_RECONNECT_IVL_MAX, &ivl_max, sizeof ivl_max);
            zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0); /* every topic */
            static unsigned gen; /* a monitor address per subscription, watched before connecting (a loopback
                                  * connection can be up before the next call: its event would be lost) */
            char mon[64];
            snprintf(mon, sizeof mon, "inproc://kv-monitor-%u", gen++);
            void *pair = zmq_socket(K.ctx, ZMQ_PAIR);
            if (!pair || zmq_socket_monitor(sub, mon, ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) != 0 ||
                zmq_connect(pair, mon) != 0) {
                XLOG_WARN("msg=\"cannot watch the KV-event connection\" role=%s rank=%zu err=\"%s\"", roles[role], i,
                          zmq_strerror(zmq_errno()));
                if (pair)
                    zmq_close(pair);
                zmq_close(sub);
                continue;
            }
            if (zmq_connect(sub, ep) != 0) {
                XLOG_WARN("msg=\"cannot subscribe to KV events\" role=%s rank=%zu endpoint=\"%s\" err=\"%s\"",
                          roles[role], i, ep, zmq_strerror(zmq_errno()));
                zmq_socket_monitor(sub, NULL, 0);
                zmq_close(pair);
                zmq_close(sub);
                continue;
            }
            snprintf(s->ep, sizeof s->ep, "%s", ep);
            s->sub = sub;
            s->mon = pair;
            atomic_store(&s->events, 0); /* a new source (its labels too) */
            atomic_store(&s->first_sent, 0);
            atomic_store(&s->on, 1);
            atomic_fetch_add(&K.subscribed[role], 1);
            XLOG_INFO("msg=\"subscribed to KV events\" role=%s rank=%zu endpoint=\"%s\"", roles[role], i, ep);
        }
    }
}

static void *consumer(void *arg)
{
    (void)arg;
    size_t max = 4 * K.cap + (size_t)K.nbound; /* both pools, a SUB and its monitor each; the bound sockets */
    zmq_pollitem_t *items = calloc(max, sizeof *items);
    int *who = calloc(max, sizeof *who);
    uint64_t next_sync = 0;
    while (items && who && !atomic_load(&K.stop)) {
        uint64_t now = xpyd_now_us();
        if (now >= next_sync) {
            sync_sources();
            next_sync = now + 500000;
        }
        int n = 0;
        long wait_ms = 100;
        for (int role = 0; role < 2; role++)
            for (size_t i = 0; K.on[role] && i < K.cap; i++)
                if (K.src[role][i].sub) {
                    struct kv_src *s = &K.src[role][i];
                    if (s->rep && now >= s->rep_deadline) /* out of time: ended as failed */
                        replay_end(role, (int)i, s, 1);
                    if (s->rep && (long)((s->rep_deadline - now + 999) / 1000) < wait_ms)
                        wait_ms = (long)((s->rep_deadline - now + 999) / 1000);
                    /* a replay under way is read instead of the rank's SUB (whose messages wait their turn) */
                    items[n] = (zmq_pollitem_t){s->rep ? s->rep : s->sub, 0, ZMQ_POLLIN, 0};
                    who[n++] = role * (int)K.cap + (int)i;
                    items[n] = (zmq_pollitem_t){K.src[role][i].mon, 0, ZMQ_POLLIN, 0};
                    who[n++] = -1 - (role * (int)K.cap + (int)i); /* its monitor */
                } else if (K.src[role][i].rep) { /* a connected engine's (bind mode) */
                    struct kv_src *s = &K.src[role][i];
                    if (now >= s->rep_deadline)
                        replay_end(role, (int)i, s, 1);
                    else if ((long)((s->rep_deadline - now + 999) / 1000) < wait_ms)
                        wait_ms = (long)((s->rep_deadline - now + 999) / 1000);
                    if (s->rep) {
                        items[n] = (zmq_pollitem_t){s->rep, 0, ZMQ_POLLIN, 0};
                        who[n++] = role * (int)K.cap + (int)i;
                    }
                }
        for (int r = 0; r < K.nbound; r++) {
            items[n] = (zmq_pollitem_t){K.bsub[r], 0, ZMQ_POLLIN, 0};
            who[n++] = 2 * (int)K.cap + r;
        }
        if (zmq_poll(items, n, wait_ms) <= 0)
            continue;
        for (int k = 0; k < n; k++) {
            if (!(items[k].revents & ZMQ_POLLIN))
                continue;
            if (who[k] >= 2 * (int)K.cap) { /* a bound socket: its port's offset */
                for (int m = 0; m < DRAIN_MAX; m++) {
                    zmq_msg_t f[FRAMES];
                    int nf;
                    if (!recv_msg(K.bsub[who[k] - 2 * (int)K.cap], f, &nf))
                        break;
                    on_bound_message(who[k] - 2 * (int)K.cap, f, nf);
                    close_frames(f, nf);
                }
                continue;
            }
            int w = who[k] < 0 ? -1 - who[k] : who[k], role = w / (int)K.cap, rank = w % (int)K.cap;
            struct kv_src *s = &K.src[role][rank];
            if (who[k] < 0) {
                on_monitor(role, rank, s);
                continue;
            }
            if (s->rep) {
                replay_input(role, rank, s);
                continue;
            }
            for (int m = 0; m < DRAIN_MAX && !s->rep; m++) { /* (a gap found here starts a replay: stop) */
                zmq_msg_t f[FRAMES];
                int nf;
                if (!recv_msg(s->sub, f, &nf))
                    break;
                on_message(role, rank, s, f, nf);
                close_frames(f, nf);
            }
        }
    }
    free(items);
    free(who);
    for (int role = 0; role < 2; role++)
        for (size_t i = 0; K.on[role] && i < K.cap; i++)
            if (K.src[role][i].sub)
                unsubscribe(role, (int)i, &K.src[role][i]);
            else { /* a connected engine's replay under way, and what waits for it */
                replay_close(&K.src[role][i]);
                wait_free(role, &K.src[role][i]);
            }
    for (int r = 0; r < K.nbound; r++)
        zmq_close(K.bsub[r]);
    K.nbound = 0;
    free(dir);
    dir = NULL;
    ndir = dircap = 0;
    return NULL;
}

/* --kv-events-bind: SUB sockets bound on PORT .. PORT + N - 1 before the consumer starts (an address in use stops
 * the router with its reason). */
static int bind_ports(const struct rt_config *c)
{
    int zero = 0, hwm = (int)c->kv_events_hwm;
    int64_t max = c->kv_events_max_bytes;
    for (int r = 0; r < (int)c->kv_events_bind_ranks && r < BIND_MAX; r++) {
        char ep[320];
        rt_kv_endpoint_rank(c->kv_events_bind, r, ep, sizeof ep);
        void *sub = zmq_socket(K.ctx, ZMQ_SUB);
        if (!sub || zmq_setsockopt(sub, ZMQ_LINGER, &zero, sizeof zero) ||
            zmq_setsockopt(sub, ZMQ_RCVHWM, &hwm, sizeof hwm) || zmq_setsockopt(sub, ZMQ_MAXMSGSIZE, &max, sizeof max) ||
            zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0) || zmq_bind(sub, ep) != 0) {
            fprintf(stderr, "xpyd_router: --kv-events-bind: cannot bind %s: %s\n", ep, zmq_strerror(zmq_errno()));
            if (sub)
                zmq_close(sub);
            return -1;
        }
        K.bsub[K.nbound++] = sub;
        XLOG_INFO("msg=\"KV events: engines may connect\" endpoint=\"%s\" dp_rank=%d", ep, r);
    }
    return 0;
}

int rt_kv_setup(struct router *rt)
{
    const struct rt_config *c = &rt->cfg;
    K.cap = (size_t)c->max_instances;
    for (int role = 0; role < 2; role++) {
        /* on where placement can use events (ranks that name a publisher may come later: admin API, etcd) or
         * where the configuration names publishers */
        K.on[role] = c->kv_events_port[role] > 0 || rt->prefix_on[role];
        for (size_t i = 0; i < c->n_ranks[role]; i++)
            K.on[role] |= c->ranks[role][i].kv_events[0] != 0;
        if (!K.on[role])
            continue;
        if (!rt->prefix_on[role]) /* (named, so on) */
            XLOG_WARN("msg=\"KV events of the %s pool are read but its placement does not use them (policy cache, "
                      "or --local-prefill-max-tokens for decodes)\"", roles[role]);
        K.idx[role] = kvi_new((int)K.cap, (size_t)c->kv_index_max_blocks);
        K.src[role] = calloc(K.cap, sizeof *K.src[role]);
        if (!K.idx[role] || !K.src[role]) {
            fprintf(stderr, "xpyd_router: out of memory\n");
            return -1;
        }
        kvi_set_max_adapters(K.idx[role], (size_t)c->kv_index_max_adapters);
    }
    if (!K.on[0] && !K.on[1]) {
        if (c->kv_events_bind[0])
            XLOG_WARN("msg=\"--kv-events-bind is not bound: no pool's placement uses KV events (policy cache, or "
                      "--local-prefill-max-tokens for decodes)\"");
        return 0;
    }
    if (kv_query_init() != 0 || !(K.ctx = zmq_ctx_new())) {
        fprintf(stderr, "xpyd_router: cannot start the KV-event consumer\n");
        return -1;
    }
    if (c->kv_events_bind[0] && bind_ports(c) != 0)
        return -1;
    if (pthread_create(&K.th, NULL, consumer, NULL) != 0) { /* (the bound sockets are its from here) */
        fprintf(stderr, "xpyd_router: cannot start the KV-event consumer\n");
        return -1;
    }
    K.started = 1;
    return 0;
}

void rt_kv_stop(void)
{
    if (K.started) {
        atomic_store(&K.stop, 1);
        pthread_join(K.th, NULL);
        zmq_ctx_term(K.ctx);
        K.started = 0;
    }
    for (int role = 0; role < 2; role++) {
        kvi_free(K.idx[role]);
        free(K.src[role]);
        K.idx[role] = NULL;
        K.src[role] = NULL;
    }
}
