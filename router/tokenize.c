/* SPDX-License-Identifier: Apache-2.0 */
/* tokenize.c - --tokenizer (tokenize.h): a FIFO of prompts, --tokenizer-threads threads encoding them with the
 * loaded tokenizer (immutable, shared), and a per-router-thread inbox the results come back to (an event the
 * worker activates), where the request goes on: exact charge, the max_model_len check, its handoff's start. */
#include "tokenize.h"
#include "chat_prompt.h"
#include "prompt.h"
#include "request_state.h"
#include "kv_sub.h"
#include "router.h"
#include "xpyd_tokenizer.h"

#include <cjson/cJSON.h>
#include <event2/event.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *const rt_prompt_src_names[4] = {"estimate", "ids", "tokenizer", "engine"};

_Static_assert(RT_TF_COUNT == 8, "RT_STORE_TOKFB (router.h) holds 8 reasons");

struct rt_tok_job {
    struct rt_tok_job *next, *prev; /* in the FIFO (under T.mu), then in an inbox (next) */
    struct request *r;   /* NULL once the request ended (read and written on r's own thread only) */
    int taken;           /* a tokenizer thread took it from the FIFO (under T.mu): until then its request may
                          * take it back (give_up: --tokenizer-wait-ms passed, or the request ended) */
    struct event *wait;  /* --tokenizer-wait-ms on r's thread (r's thread only) */
    struct rthread *t;   /* where the result goes */
    char *text;          /* the prompts' decoded bytes, one after another; a chat request's body (owned) */
    size_t *lens, n;
    int chat;            /* text is a chat request's body: rendered with the model's template, then encoded */
    struct rt_chat_src chat_src; /* chat: its members in text (found when the body arrived) */
    rt_tok_go go;        /* how the request goes on (request.c) */
    int add_special;
    int64_t truncate;    /* prompts cut to their last this many tokens (rt_tok_truncation), -1: not cut */
    size_t block_tokens; /* 0: no prefix blocks wanted */
    uint64_t extra[2];   /* what else names its blocks (rt_kv_extras: the cache salt); has_extra 0: none */
    int has_extra;
    /* the result, written by the worker */
    int rc;
    int fallback;        /* rc != 0: the enum rt_tok_fallback reason */
    int64_t tokens, longest; /* all prompts' tokens; the longest prompt's (a batch is checked prompt by prompt) */
    uint64_t *blocks;
    size_t nblocks;
    int64_t held;        /* bytes counted in the router's body memory while the job lives */
};

struct rt_tok_inbox {
    pthread_mutex_t mu;
    struct rt_tok_job *head, *tail;
    struct event *ev;
};

static struct {
    struct xtok *tok;
    struct xtok_chat *chat;   /* NULL: chat requests keep the estimate (reason "template") */
    struct xtok_cache *cache; /* NULL: --tokenizer-cache-bytes 0 */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct rt_tok_job *head, *tail;
    long pending; /* queued + being encoded, against --tokenizer-queue */
    uint64_t *busy_since; /* per thread: µs it took the prompt it encodes (0: idle), under mu */
    int stop;
    pthread_t *th;
    long nth;
} T = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

/* The prompt's prefix blocks as without --tokenizer (over its text's bytes), when it is not tokenized after all. */
static void text_blocks(struct request *r)
{
    if (g_rt->prefix_on[RT_PREFILL] || g_rt->prefix_on[RT_DECODE])
    {
        uint64_t ex[2];
        r->nblocks = rw_prefix_blocks(r->src, r->kind == RT_EP_CHAT, (size_t)g_rt->cfg.prefix_block_tokens,
                                      g_rt->cfg.bytes_per_token, rt_kv_extras(r->src, ex) ? ex : NULL, &r->blocks);
    }
}

static void job_free(struct rt_tok_job *j)
{
    if (j->wait)
        event_free(j->wait);
    rt_body_memory_release(j->held);
    free(j->text);
    free(j->lens);
    free(j->blocks);
    free(j);
}

static double thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The template a chat request is rendered with: the model's, or with --trust-request-chat-template the request's
 * own (*mine, compiled for it: the caller frees it). NULL with j's fallback reason when it cannot be rendered. */
static const struct xtok_chat *template_for(struct rt_tok_job *j, const cJSON *body, struct xtok_chat **mine)
{
    static const unsigned char reason[] = {[XTOK_REQ_NOT_STRING] = RT_TF_SHAPE, /* vLLM: a 400 */
                                           [XTOK_REQ_UNTRUSTED] = RT_TF_REQUEST_TEMPLATE, /* vLLM: a 400 */
                                           [XTOK_REQ_COMPILE] = RT_TF_RENDER};
    char err[400];
    int why;
    const struct xtok_chat *c =
        xtok_chat_for_request(T.chat, body, g_rt->cfg.trust_request_chat_template, mine, &why, err, sizeof err);
    if (!c) {
        j->fallback = reason[why];
        if (why == XTOK_REQ_COMPILE)
            XLOG_DEBUG("msg=\"a request's chat template does not compile: the byte estimate counts it\" error=\"%s\"",
                       err);
    }
    return c;
}

/* A chat request: vLLM's template input, rendered, then encoded through the cache (no special tokens unless the
 * body asks: vLLM's default for chat). */
static void encode_chat(struct rt_tok_job *j)
{
    int why = RT_CHAT_SHAPE;
    /* the body as it lies (checked when it arrived: body_src.h), not parsed into a tree: only what the template
     * reads is made one (chat_prompt.h) */
    cJSON *args = rt_chat_template_args(&j->chat_src), *req = NULL;
    struct xtok_chat *mine = NULL;
    const struct xtok_chat *chat = args ? template_for(j, args, &mine) : NULL;
    if (chat)
        req = rt_chat_as_vllm(&j->chat_src, xtok_chat_openai_content(chat), &why);
    cJSON_Delete(args);
    if (!req) {
        j->rc = -1;
        if (chat || !args)
            j->fallback = why == RT_CHAT_MEDIA ? RT_TF_MEDIA : RT_TF_SHAPE;
        xtok_chat_free(mine);
        return;
    }
    size_t bytes = (size_t)g_rt->cfg.max_body_bytes;
    struct xtpl_limits lim = {4 * bytes + (1u << 20), 8 * bytes + (64u << 20),
                              (uint64_t)g_rt->cfg.tokenizer_render_max_steps};
    char *text, err[400];
    size_t n;
    int rc = xtok_chat_render(chat, req, &lim, &text, &n, err, sizeof err);
    xtok_chat_free(mine);
    if (rc != 0) {
        cJSON_Delete(req);
        j->rc = -1;
        j->fallback = RT_TF_RENDER;
        XLOG_DEBUG("msg=\"the chat template failed on a request: the byte estimate counts it\" error=\"%s\"", err);
        return;
    }
    cJSON_Delete(req);
    uint32_t *ids = NULL;
    size_t nids = 0;
    j->rc = xtok_encode_cached(T.tok, T.cache, text, n, j->add_special, &ids, &nids);
    free(text);
    if (j->rc == 0 && j->truncate >= 0) /* the engine's prompt: its last tokens (vLLM's truncate_prompt_tokens) */
        nids = xtok_truncate_left(T.tok, ids, nids, (size_t)j->truncate, j->add_special);
    if (j->rc == 0) {
        j->tokens = j->longest = (int64_t)nids;
        if (j->block_tokens)
            j->nblocks = rw_id_blocks(ids, nids, j->block_tokens, j->has_extra ? j->extra : NULL, &j->blocks);
    } else {
        j->fallback = RT_TF_INVALID;
    }
    free(ids);
}

static void encode(struct rt_tok_job *j)
{
    double t0 = thread_cpu_s();
    const char *p = j->text;
    j->tokens = j->longest = 0;
    if (j->chat) {
        encode_chat(j);
        rt_hist_observe(&g_rt->ctr.tokenizer_time, thread_cpu_s() - t0);
        return;
    }
    for (size_t i = 0; i < j->n && j->rc == 0; i++) {
        uint32_t *ids = NULL;
        size_t nids = 0;
        j->rc = xtok_encode_cached(T.tok, T.cache, p, j->lens[i], j->add_special, &ids, &nids);
        if (j->rc == 0 && j->truncate >= 0) /* each prompt its last tokens */
            nids = xtok_truncate_left(T.tok, ids, nids, (size_t)j->truncate, j->add_special);
        if (j->rc == 0) {
            j->tokens += (int64_t)nids;
            j->longest = (int64_t)nids > j->longest ? (int64_t)nids : j->longest;
            if (j->n == 1 && j->block_tokens) /* blocks of the one prompt (a batch's are not placed by prefix) */
                j->nblocks = rw_id_blocks(ids, nids, j->block_tokens, j->has_extra ? j->extra : NULL, &j->blocks);
        } else {
            j->fallback = RT_TF_INVALID;
        }
        free(ids);
        p += j->lens[i];
    }
    rt_hist_observe(&g_rt->ctr.tokenizer_time, thread_cpu_s() - t0);
}

/* Every thread has been encoding one prompt for --tokenizer-wait-ms already (under T.mu): a prompt queued now
 * would only wait out its bound. */
static int stalled(uint64_t now)
{
    uint64_t wait = (uint64_t)g_rt->cfg.tokenizer_wait_ms * 1000u;
    for (long k = 0; k < T.nth; k++)
        if (!T.busy_since[k] || now - T.busy_since[k] < wait)
            return 0;
    return T.nth > 0;
}

static void *worker(void *arg)
{
    long k = (long)(intptr_t)arg;
    for (;;) {
        pthread_mutex_lock(&T.mu);
        while (!T.head && !T.stop)
            pthread_cond_wait(&T.cv, &T.mu);
        struct rt_tok_job *j = T.head;
        if (!j) {
            pthread_mutex_unlock(&T.mu);
            return NULL;
        }
        T.head = j->next;
        if (T.head)
            T.head->prev = NULL;
        else
            T.tail = NULL;
        j->taken = 1;
        T.busy_since[k] = xpyd_now_us();
        pthread_mutex_unlock(&T.mu);
        j->next = NULL;
        encode(j);
        pthread_mutex_lock(&T.mu);
        T.busy_since[k] = 0;
        pthread_mutex_unlock(&T.mu);
        rt_tok_refresh_metrics();
        struct rt_tok_inbox *in = j->t->tok_inbox;
        pthread_mutex_lock(&in->mu);
        if (in->tail)
            in->tail->next = j;
        else
            in->head = j;
        in->tail = j;
        pthread_mutex_unlock(&in->mu);
        event_active(in->ev, EV_READ, 0);
    }
}

int rt_tok_setup(struct router *rt)
{
    if (!rt->cfg.tokenizer[0])
        return 0;
    char err[600];
    if (!(T.tok = xtok_load(rt->cfg.tokenizer, err, sizeof err))) {
        fprintf(stderr, "xpyd_router: --tokenizer %s: %s\n", rt->cfg.tokenizer, err);
        return -1;
    }
    if (!(T.chat = xtok_chat_load(rt->cfg.tokenizer, rt->cfg.chat_template[0] ? rt->cfg.chat_template : NULL, err,
                                  sizeof err))) {
        if (rt->cfg.chat_template[0]) { /* a template the operator named must work */
            fprintf(stderr, "xpyd_router: --chat-template %s: %s\n", rt->cfg.chat_template, err);
            return -1;
        }
        XLOG_WARN("msg=\"no chat template the router can render: chat requests keep the byte estimate "
                  "(xpyd_tokenizer_fallbacks_total{reason=\\\"template\\\"})\" reason=\"%s\"", err);
    }
    if (T.chat && rt->cfg.trust_request_chat_template &&
        xtok_chat_keep_request_templates(T.chat, (size_t)rt->cfg.request_chat_template_cache_bytes) != 0) {
        fprintf(stderr, "xpyd_router: out of memory\n");
        return -1;
    }
    if (rt->cfg.tokenizer_cache_bytes > 0 && !(T.cache = xtok_cache_new((size_t)rt->cfg.tokenizer_cache_bytes, 1))) {
        fprintf(stderr, "xpyd_router: out of memory\n");
        return -1;
    }
    if (T.cache)
        xtok_cache_set_alike_max(T.cache, (size_t)rt->cfg.tokenizer_cache_alike_max);
    T.nth = rt->cfg.tokenizer_threads;
    T.th = XPYD_XALLOC(calloc((size_t)T.nth, sizeof *T.th));
    T.busy_since = XPYD_XALLOC(calloc((size_t)T.nth, sizeof *T.busy_since));
    for (long i = 0; i < T.nth; i++)
        if (pthread_create(&T.th[i], NULL, worker, (void *)(intptr_t)i) != 0) {
            fprintf(stderr, "xpyd_router: cannot start tokenizer threads\n");
            T.nth = i;
            return -1;
        }
    XLOG_INFO("msg=\"tokenizer loaded\" dir=\"%s\" vocab=%zu threads=%ld chat_template=%s cache_bytes=%ld",
              rt->cfg.tokenizer, xtok_vocab_size(T.tok), T.nth, T.chat ? "yes" : "no", rt->cfg.tokenizer_cache_bytes);
    return 0;
}

void rt_tok_stop(void)
{
    pthread_mutex_lock(&T.mu);
    T.stop = 1;
    pthread_cond_broadcast(&T.cv);
    pthread_mutex_unlock(&T.mu);
    for (long i = 0; i < T.nth; i++)
        pthread_join(T.th[i], NULL);
    free(T.th);
    T.th = NULL;
    free(T.busy_since);
    T.busy_since = NULL;
    T.nth = 0;
}

int64_t rt_tok_truncation(const struct request *r)
{
    if (r->truncate != -1) /* k, or none (-2) */
        return r->truncate >= 0 ? r->truncate : -1;
    int64_t k = -1; /* -1: each engine its own max_model_len; counted with the smallest the pools know */
    for (int role = 0; role < 2; role++) {
        long mml = xb_max_model_len(g_rt->pools[role]);
        if (mml > 0 && (k < 0 || mml < k))
            k = mml;
    }
    return k;
}

void rt_tok_truncation_in(struct request *r)
{
    struct jv v = rw_src_get(r->src, "truncate_prompt_tokens");
    double d;
    r->truncate = jv_type(v) == JV_NUMBER && jv_double(v, &d) == 0 && d == (double)(int64_t)d && d >= -1 &&
                          d < 1e15
                      ? (int64_t)d
                      : -2;
    int64_t k = rt_tok_truncation(r);
    if (k < 0)
        return;
    if (r->prompt_longest > k)
        r->prompt_longest = k;
    /* one prompt (a chat, a text, a list of ids): its count is cut too; a batch's stays the bound it was */
    struct jv p = rw_src_get(r->src, "prompt");
    int one = r->kind == RT_EP_CHAT || jv_type(p) == JV_STRING ||
              (r->prompt_src == RT_PS_IDS && r->prompt_tokens == r->prompt_longest);
    if (one && r->prompt_tokens > k)
        r->prompt_tokens = k;
}

int rt_tok_too_long(const struct request *r, char *msg, size_t size)
{
    int64_t prompt = r->prompt_longest, need = prompt + r->room_tokens; /* vLLM checks each prompt of a batch */
    for (int role = 0; role < 2; role++) {
        long mml = xb_max_model_len(g_rt->pools[role]);
        if (mml > 0 && r->truncate > mml) { /* vLLM's _validate_truncation_size */
            snprintf(msg, size,
                     "truncate_prompt_tokens value (%" PRId64 ") is greater than max_model_len (%ld). Please, select "
                     "a smaller truncation size.", r->truncate, mml);
            return 1;
        }
        if (mml <= 0 || need <= mml)
            continue;
        if (prompt >= mml)
            snprintf(msg, size,
                     "This model's maximum context length is %ld tokens. However, your request has %" PRId64
                     " input tokens. Please reduce the length of the input.", mml, prompt);
        else
            snprintf(msg, size,
                     "'max_tokens' or 'max_completion_tokens' is too large: %" PRId64 ". This model's maximum "
                     "context length is %ld tokens and your request has %" PRId64 " input tokens (%" PRId64
                     " > %ld - %" PRId64 ").", r->max_tokens, mml, prompt, r->max_tokens, mml, prompt);
        return 1;
    }
    return 0;
}

/* A finished job on its request's thread: the request goes on (or it had ended: the job is dropped). */
static void finish(struct rt_tok_job *j)
{
    struct request *r = j->r;
    pthread_mutex_lock(&T.mu);
    T.pending--;
    pthread_mutex_unlock(&T.mu);
    atomic_fetch_sub(&g_rt->ctr.tokenizer_pending, 1);
    if (!r) {
        job_free(j);
        return;
    }
    r->tok_job = NULL;
    if (j->rc != 0) {
        atomic_fetch_add(&g_rt->ctr.tokenizer_fallbacks[j->fallback], 1);
        rt_tok_go go = j->go;
        job_free(j);
        text_blocks(r);
        go(r, NULL);
        return;
    }
    atomic_fetch_add(&g_rt->ctr.tokenizer_prompts, 1);
    r->prompt_tokens = j->tokens;
    r->prompt_longest = j->longest;
    r->prompt_src = RT_PS_TOKENIZER;
    r->blocks = j->blocks;
    r->nblocks = j->nblocks;
    j->blocks = NULL;
    rt_tok_go go = j->go;
    job_free(j);
    char msg[400];
    go(r, rt_tok_too_long(r, msg, sizeof msg) ? msg : NULL);
}

static void on_inbox(evutil_socket_t fd, short what, void *arg)
{
    struct rt_tok_inbox *in = arg;
    pthread_mutex_lock(&in->mu);
    struct rt_tok_job *j = in->head;
    in->head = in->tail = NULL;
    pthread_mutex_unlock(&in->mu);
    while (j) {
        struct rt_tok_job *next = j->next;
        finish(j);
        j = next;
    }
}

void rt_tok_thread_init(struct rthread *t)
{
    if (!T.tok)
        return;
    struct rt_tok_inbox *in = XPYD_XALLOC(calloc(1, sizeof *in));
    pthread_mutex_init(&in->mu, NULL);
    in->ev = XPYD_XALLOC(event_new(t->base, -1, 0, on_inbox, in));
    t->tok_inbox = in;
}

void rt_tok_thread_free(struct rthread *t)
{
    struct rt_tok_inbox *in = t->tok_inbox;
    if (!in)
        return;
    for (struct rt_tok_job *j = in->head, *next; j; j = next) {
        next = j->next;
        job_free(j);
    }
    event_free(in->ev);
    pthread_mutex_destroy(&in->mu);
    free(in);
    t->tok_inbox = NULL;
}

int rt_tok_wants(const struct request *r)
{
    if (!T.tok)
        return 0;
    if (r->kind == RT_EP_CHAT)
        return T.chat != NULL;
    return r->prompt_src != RT_PS_IDS; /* ids: counted exactly already */
}

/* the chat members' views in copy, the job's copy of the body whose view is body (the body's member spans were
 * found when it arrived: nothing is scanned again) */
static void chat_src_in(const struct rw_src *src, struct jv body, const char *copy, struct rt_chat_src *cs)
{
    const struct {
        const char *key;
        struct jv *at;
    } m[] = {{"messages", &cs->messages},
             {"tools", &cs->tools},
             {"add_generation_prompt", &cs->add_generation_prompt},
             {"continue_final_message", &cs->continue_final_message},
             {"documents", &cs->documents},
             {"chat_template_kwargs", &cs->chat_template_kwargs},
             {"chat_template", &cs->chat_template}};
    for (size_t i = 0; i < sizeof m / sizeof *m; i++) {
        struct jv v = rw_src_get(src, m[i].key);
        *m[i].at = v.p ? (struct jv){copy + (v.p - body.p), v.n} : (struct jv){NULL, 0};
    }
}

/* A job taken back from the FIFO by its request (on the request's thread) before any tokenizer thread took it:
 * 1, the job freed (never encoded, no longer counted against --tokenizer-queue); 0 when a thread has it. */
static int give_up(struct rt_tok_job *j)
{
    pthread_mutex_lock(&T.mu);
    if (j->taken) {
        pthread_mutex_unlock(&T.mu);
        return 0;
    }
    if (j->prev)
        j->prev->next = j->next;
    else
        T.head = j->next;
    if (j->next)
        j->next->prev = j->prev;
    else
        T.tail = j->prev;
    T.pending--;
    pthread_mutex_unlock(&T.mu);
    atomic_fetch_sub(&g_rt->ctr.tokenizer_pending, 1);
    job_free(j);
    return 1;
}

/* --tokenizer-wait-ms passed and no tokenizer thread has taken the prompt (they are all busy, with a burst or
 * with prompts that take long to encode): the request goes on with the byte estimate, as when the queue is full */
static void on_wait_expired(evutil_socket_t fd, short what, void *arg)
{
    struct rt_tok_job *j = arg;
    struct request *r = j->r;
    rt_tok_go go = j->go;
    if (!r || !give_up(j))
        return; /* taken: the request waits for its ids */
    r->tok_job = NULL;
    atomic_fetch_add(&g_rt->ctr.tokenizer_fallbacks[RT_TF_BUSY], 1);
    text_blocks(r);
    go(r, NULL);
}

int rt_tok_start(struct request *r, rt_tok_go go)
{
    if (T.tok && r->kind == RT_EP_CHAT && !T.chat)
        atomic_fetch_add(&g_rt->ctr.tokenizer_fallbacks[RT_TF_TEMPLATE], 1);
    if (!rt_tok_wants(r))
        return 0;
    size_t *lens, n;
    char *text;
    struct rt_chat_src cs = {0};
    if (r->kind == RT_EP_CHAT) { /* the body, shaped and rendered on the tokenizer thread */
        struct jv body = rw_src_view(r->src);
        text = XPYD_XALLOC(malloc(body.n + 1));
        memcpy(text, body.p, body.n);
        text[body.n] = '\0';
        lens = XPYD_XALLOC(malloc(sizeof *lens));
        lens[0] = body.n;
        n = 1;
        chat_src_in(r->src, body, text, &cs);
    } else {
        n = rw_prompt_texts(r->src, &text, &lens, (size_t)g_rt->cfg.tokenizer_max_batch_prompts);
    }
    if (!n) {
        free(lens);
        atomic_fetch_add(&g_rt->ctr.tokenizer_fallbacks[RT_TF_SHAPE], 1);
        text_blocks(r);
        return 0;
    }
    pthread_mutex_lock(&T.mu);
    int room = T.pending < g_rt->cfg.tokenizer_queue, stuck = room && stalled(xpyd_now_us());
    if (room && !stuck)
        T.pending++;
    pthread_mutex_unlock(&T.mu);
    if (!room || stuck) {
        free(text);
        free(lens);
        atomic_fetch_add(&g_rt->ctr.tokenizer_fallbacks[stuck ? RT_TF_STALLED : RT_TF_BUSY], 1);
        text_blocks(r);
        return 0;
    }
    struct rt_tok_job *j = XPYD_XALLOC(calloc(1, sizeof *j));
    j->r = r;
    j->t = r->t;
    j->text = text;
    j->lens = lens;
    j->n = n;
    j->chat = r->kind == RT_EP_CHAT;
    j->chat_src = cs;
    j->go = go;
    enum jv_type as = jv_type(rw_src_get(r->src, "add_special_tokens"));
    j->add_special = j->chat ? as == JV_TRUE : as != JV_FALSE; /* vLLM: false for chat, true for completions */
    j->truncate = rt_tok_truncation(r);
    if (g_rt->prefix_on[RT_PREFILL] || g_rt->prefix_on[RT_DECODE]) {
        j->block_tokens = (size_t)g_rt->cfg.prefix_block_tokens;
        j->has_extra = rt_kv_extras(r->src, j->extra);
    }
    for (size_t i = 0; i < n; i++)
        j->held += (int64_t)lens[i];
    rt_body_memory_add(j->held); /* the decoded copy is request-body memory too, until the job is freed */
    r->tok_job = j;
    j->wait = XPYD_XALLOC(evtimer_new(r->t->base, on_wait_expired, j));
    struct timeval tv = {g_rt->cfg.tokenizer_wait_ms / 1000, (g_rt->cfg.tokenizer_wait_ms % 1000) * 1000};
    evtimer_add(j->wait, &tv);
    atomic_fetch_add(&g_rt->ctr.tokenizer_pending, 1);
    pthread_mutex_lock(&T.mu);
    j->prev = T.tail;
    if (T.tail)
        T.tail->next = j;
    else
        T.head = j;
    T.tail = j;
    pthread_cond_signal(&T.cv);
    pthread_mutex_unlock(&T.mu);
    return 1;
}

void rt_tok_detach(struct request *r)
{
    struct rt_tok_job *j = r->tok_job;
    if (!j)
        return;
    r->tok_job = NULL;
    if (give_up(j)) /* not encoded for nobody, unless a thread already took it */
        return;
    if (j->wait) {
        event_free(j->wait);
        j->wait = NULL;
    }
    j->r = NULL;
}

void rt_tok_check(struct request *r, int64_t engine_prompt_tokens)
{
    if (r->prompt_src == RT_PS_ESTIMATE) {
        r->prompt_src = RT_PS_ENGINE;
        return;
    }
    if (r->prompt_src != RT_PS_TOKENIZER || r->migrations || engine_prompt_tokens == r->prompt_tokens)
        return;
    int64_t n = atomic_fetch_add(&g_rt->ctr.tokenizer_mismatch, 1);
    if (n < 10 || n % 1000 == 0) /* 0 on a correct setup: the first ones say which request, then a sample */
        XLOG_WARN("msg=\"the prefill counted another number of prompt tokens than --tokenizer: is it the engine's "
                  "model?\" request_id=%s router=%" PRId64 " engine=%" PRId64 " mismatches=%" PRId64,
                  r->xid, r->prompt_tokens, engine_prompt_tokens, n + 1);
}

void rt_tok_refresh_metrics(void)
{
    if (T.chat) {
        struct xtok_chat_kept_stats k;
        xtok_chat_kept_stats(T.chat, &k);
        atomic_store(&g_rt->ctr.tokenizer_tpl_bytes, (int64_t)k.bytes);
        atomic_store(&g_rt->ctr.tokenizer_tpl_kept, (int64_t)k.hits);
        atomic_store(&g_rt->ctr.tokenizer_tpl_compiled, (int64_t)k.compiled);
    }
    if (!T.cache)
        return;
    struct xtok_cache_stats st;
    xtok_cache_stats(T.cache, &st);
    atomic_store(&g_rt->ctr.tokenizer_cache_bytes, (int64_t)st.bytes);
    atomic_store(&g_rt->ctr.tokenizer_cache_hits, (int64_t)st.hit_bytes);
    atomic_store(&g_rt->ctr.tokenizer_cache_misses, (int64_t)st.miss_bytes);
    atomic_store(&g_rt->ctr.tokenizer_cache_entries, (int64_t)st.entries);
    atomic_store(&g_rt->ctr.tokenizer_cache_alike, (int64_t)st.alike_refused);
}
