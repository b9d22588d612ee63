/* SPDX-License-Identifier: Apache-2.0 */
/* router.h - xpyd_router internals shared by its modules: global state, per-thread state, failure table,
 * counters. */
#ifndef XPYD_ROUTER_H
#define XPYD_ROUTER_H

#include "config.h"
#include "metrics_table.h"
#include "xpyd_http_client.h"
#include "xpyd_reply.h"
#include "xb.h"

#include <stdatomic.h>
#include <stdint.h>

struct event_base;
struct evhtp_request;

/* Marker the body reader adds to a request whose body exceeded --max-body-bytes. */
#define XPYD_TOO_LARGE_HEADER "X-Xpyd-Body-Too-Large"
/* Marker the body reader adds when the request-body bytes held would exceed --max-body-memory-bytes. */
#define XPYD_BODY_MEMORY_HEADER "X-Xpyd-Body-Memory-Full"

/* Every way a request can fail, one row each in rt_fail_table (state.c). */
enum rt_fail {
    RF_NONE = 0,
    RF_BAD_REQUEST,
    RF_BODY_TOO_LARGE,
    RF_NO_PREFILL,
    RF_NO_DECODE,
    RF_CONTEXT_TOO_LONG,
    RF_PREFILL_CONNECT,
    RF_PREFILL_TIMEOUT,
    RF_PREFILL_STATUS,
    RF_PREFILL_BAD_RESPONSE,
    RF_DECODE_CONNECT,
    RF_DECODE_TIMEOUT,
    RF_DECODE_STATUS,
    RF_DECODE_BROKEN_STREAM,
    RF_RESPONSE_TOO_LARGE,
    RF_CLIENT_DISCONNECT,
    RF_QUEUE_FULL,
    RF_QUEUE_TIMEOUT,
    RF_UNAUTHORIZED,
    RF_METHOD_NOT_ALLOWED,
    RF_DRAINING,
    RF_DECODE_PREEMPTED,
    RF_LOOP_DETECTED,
    RF_BODY_MEMORY,
    RF_COUNT
};

/* What a request's ending means to whoever watches the error rate: xpyd_request_outcomes_total{outcome}. A stream
 * that fails after its 200 head is an error although its status was 200. */
enum rt_outcome { RT_OUT_OK = 0, RT_OUT_ERROR, RT_OUT_CLIENT_ERROR, RT_OUT_CLIENT_ABORT, RT_OUT_OVERLOADED, RT_OUT_COUNT };
extern const char *const rt_outcome_names[RT_OUT_COUNT];
/* What an engine's failed attempt was: xpyd_instance_errors_total{cause}. */
enum rt_cause { RT_CAUSE_CONNECT = 0, RT_CAUSE_TIMEOUT, RT_CAUSE_STATUS, RT_CAUSE_BROKEN_STREAM, RT_CAUSE_BAD_RESPONSE,
                RT_CAUSE_COUNT };
extern const char *const rt_cause_names[RT_CAUSE_COUNT];

struct rt_fail_row {
    const char *name;   /* metrics `reason` label and access-log value */
    int status;         /* HTTP status the client gets when it happens before the first byte */
    int outcome;        /* enum rt_outcome */
    int cause;          /* enum rt_cause when an engine attempt failed this way, else -1 */
};
/* Counts one failed attempt of role's rank idx, by the failure reason it stands for. Any thread. */
void rt_count_instance_error(int role, int idx, int fail);
extern const struct rt_fail_row rt_fail_table[RF_COUNT];
/* registry.c: who rank idx of role is ("host:port" into hp; returns its pinned DP rank or -1), read under the
 * registry's lock (a removed rank's slot may be given to another engine). The registry is the one owner of
 * identities; the balancer knows ranks by index only. */
int rt_rank_identity(int role, int idx, char *hp, size_t cap);
/* Rank idx's KV-event endpoint into ep ("" none); 1 when the rank exists and is not removed, else 0. */
int rt_rank_kv_events(int role, int idx, char *ep, size_t cap);
/* state.c: request-body bytes the router holds (the guard's bodies being read, requests' sources): reserve
 * under --max-body-memory-bytes (1 when taken, 0 over it), add without a check (bytes already admitted),
 * release. Any thread. */
int rt_body_memory_reserve(int64_t n);
void rt_body_memory_add(int64_t n);
void rt_body_memory_release(int64_t n);
/* 1 when rank idx of role was taken out at runtime (admin API, reload): the balancer's fact. */
int rt_rank_removed(int role, int idx);

/* What the client connection guard (client_conn.c) answered or closed, one counter each. */
enum rt_client_reject {
    RT_CR_OVER_CAPACITY = 0, /* 503: over --max-connections */
    RT_CR_HEADER_TIMEOUT,    /* 408: head not complete within --header-timeout-ms */
    RT_CR_BODY_TIMEOUT,      /* 408: body stalled over --body-idle-timeout-ms */
    RT_CR_HEADERS_TOO_LARGE, /* 431 */
    RT_CR_IDLE,              /* closed quietly: --keepalive-timeout-ms with no request */
    RT_CR_MALFORMED,         /* 400/501/505/417: a malformed or ambiguous request head or chunked body */
    RT_CR_COUNT
};
extern const char *const rt_client_reject_names[RT_CR_COUNT];

enum rt_endpoint_kind { RT_EP_COMPLETIONS = 0, RT_EP_CHAT, RT_EP_COUNT };

/* Latency histograms, buckets 1 ms .. 240 s (+Inf implied by count). */
#define RT_HIST_NB 17
struct rt_hist {
    atomic_int_fast64_t b[RT_HIST_NB]; /* non-cumulative; summed when scraped */
    atomic_int_fast64_t count;
    atomic_int_fast64_t sum_ns;
};
/* Records one observation (seconds) in h (&g_rt->ctr.<field>). Lock-free; any thread; a no-op with --metrics off. */
void rt_hist_observe(struct rt_hist *h, double seconds);

/* Process-wide counters: atomics, summed at scrape time, never locked on the hot path. The exported ones are
 * generated from metrics_table.h (one row per metric), in the shape their labels need. */
#define RT_STORE_NONE(f) atomic_int_fast64_t f;
#define RT_STORE_MSEC(f) atomic_int_fast64_t f;
#define RT_STORE_ROLE(f) atomic_int_fast64_t f[2];
#define RT_STORE_PD(f) atomic_int_fast64_t f[2];
#define RT_STORE_TOKFB(f) atomic_int_fast64_t f[8];
#define RT_STORE_SIDE(f) atomic_int_fast64_t f[2];
#define RT_STORE_REASON(f) atomic_int_fast64_t f[RF_COUNT];
#define RT_STORE_GUARD(f) atomic_int_fast64_t f[RT_CR_COUNT];
#define RT_STORE_STATUS(f) atomic_int_fast64_t f[RT_EP_COUNT][600];
#define RT_STORE_OUTCOME(f) atomic_int_fast64_t f[RT_EP_COUNT][RT_OUT_COUNT];
#define RT_STORE_HIST(f) struct rt_hist f;
#define RT_METRIC_FIELD(field, name, type, labels, help) RT_STORE_##labels(field)
struct rt_counters {
    RT_METRICS(RT_METRIC_FIELD)
    /* used by the router itself, not exported as such */
    atomic_int_fast64_t instance_errors[2][4096][RT_CAUSE_COUNT]; /* shown per rank as xpyd_instance_errors_total */
    atomic_int_fast64_t discovery_synced;        /* etcd_sync.c: range answered and watch open (xpyd_discovery_up
                                                  * is this while etcd answered within a lease TTL) */
};

/* One live rank: who it is. What placement uses (tp, weight, max_model_len, max_inflight), whether it is in
 * the pool (removed at runtime: rt_rank_removed), its health and its load are the balancer's, by the same
 * index. */
struct rt_live_rank {
    int endpoint;        /* index into rt_registry.endpoints (and router.endpoints: the connection pool key) */
    int dp_rank;         /* X-data-parallel-rank to send (internal DP), else -1 */
    int bootstrap_port;  /* the prefill's bootstrap server (SGLang; vLLM MooncakeConnector's /query) */
    char engine_id[128]; /* --handoff mooncake: this rank's engine id from /query ("" unknown); read it with
                          * rt_rank_engine_id (it changes when the prefill restarts) */
    int source;          /* enum rt_source: who put it there (who may take it out) */
    char kv_events[300]; /* its KV-event publisher ("" none): read with rt_rank_kv_events, under the lock */
};

/* Where a rank came from. The configuration (-p/-d, --config, SIGHUP) and the admin API own theirs; etcd
 * discovery (etcd_sync.c) adds and removes only its own and leaves a configured endpoint alone; a SIGHUP reload
 * leaves discovered ranks alone. */
enum rt_source { RT_SRC_CONFIG = 0, RT_SRC_ADMIN, RT_SRC_ETCD };

/* The live ranks and endpoints (registry.c owns them; they start from the configuration's plan). */
struct rt_registry {
    struct rt_endpoint_cfg *endpoints; /* ep_cap entries; the first n_endpoints are in use */
    size_t n_endpoints;
    struct rt_live_rank *ranks[2];     /* --max-instances entries per role */
    size_t n_ranks[2];
    unsigned generation;               /* bumped (release) when a rank slot is given to another engine */
};

struct handoff_ops;
struct router {
    struct rt_config cfg;          /* the configuration as loaded: not changed after start */
    const struct handoff_ops *ho;  /* the --handoff mode (handoffs.c) */
    struct rt_registry reg;
    struct xb_pool *pools[2];
    int prefix_on[2];              /* the pool keeps a prefix index (policy cache, or local-prefill decisions) */
    struct ssl_ctx_st *tls_server; /* --tls-cert: the clients' listener speaks HTTPS (NULL: plain) */
    struct ssl_ctx_st *tls_client; /* for https engines (NULL when none is configured and no --upstream-ca) */
    struct up_endpoint *endpoints; /* ep_cap entries; the first n_endpoints are in use (registry.c) */
    size_t n_endpoints, ep_cap;
    int argc;                      /* the command line, for SIGHUP reloads */
    char **argv;
    struct rt_counters ctr;
    int64_t started_wall;
    atomic_uint_fast64_t id_seq;
    atomic_int draining;  /* SIGTERM received: new generate requests are refused with 503 */
};

extern struct router *g_rt;

/* Per event-loop thread. */
struct request;
struct rthread {
    struct event_base *base;
    struct up_thread *up;
    uint64_t rng;
    struct request *qhead[2], *qtail[2]; /* admission queues (FIFO), per role */
    struct event *kick;               /* activated (from any thread) when an instance frees a slot */
    int kick_role, kick_blocked;
    struct rthread *next_thread;      /* all threads, for kicking */
    struct etcd *etcd;                /* --metadata-backend etcd: this thread's client (made on first use) */
    void *parser;                     /* libevhtp's request parser, shared by this thread's client connections
                                       * (client_conn.c; made on first use) */
    struct rt_tok_inbox *tok_inbox;   /* --tokenizer: prompts tokenized for this thread's requests (tokenize.c) */
};

/* auth.c: the client --api-key, a leaf every module may call (answers: xpyd_reply.h, common/).
 * With --api-key: 1 when the request carries the key (constant-time compare), else answers 401 and returns 0.
 * Without a key configured: 1. */
int rt_authorized(struct evhtp_request *req);
/* 1 when the request carries Authorization: Bearer <key> (constant-time compare). Replies nothing. */
int rt_bearer_ok(struct evhtp_request *req, const char *key);

/* The live pools (registry.c): fixed-capacity arrays filled from the configuration, grown at runtime. */
int rt_registry_setup(struct router *rt);
/* Rank slots of role: active ones, removed ones with requests still in flight, and the rest (free to take). */
void rt_registry_slots(int role, long *active, long *draining, long *unused);
/* Endpoint slots some rank refers to, and the rest. */
void rt_registry_endpoint_slots(long *used, long *unused);
/* Once the listeners are bound (loopguard.h): -1 with err when a configured endpoint is one of them. */
int rt_registry_self_check(char *err, size_t cap);
/* --handoff mooncake (discovery.c): the prefill endpoints to ask GET /query, each with the endpoint of its
 * bootstrap server (appended to the endpoint table when new). Returns how many were written. */
struct rt_query_target {
    int endpoint;       /* the prefill's HTTP endpoint */
    int query_endpoint; /* host:bootstrap_port */
};
size_t rt_registry_query_targets(struct rt_query_target *out, size_t cap);
/* What /query answered for a prefill endpoint: ids[r] the engine id of DP rank r (NULL: no such rank), for r
 * < n; n < 0: the query failed. Ranks are added, revived, given new ids and made ready, or taken out (ranks
 * the answer lacks), or, on failure, made unready; nothing happens to an endpoint with no active rank. */
void rt_registry_learned(int endpoint, const char *const *ids, int n, const char *why);
/* Copies rank idx's engine id into out; 0, or -1 when it has none (not learned, or unready). */
int rt_rank_engine_id(int role, int idx, char *out, size_t cap);
/* Adds (or revives, or updates) every rank of one host as POST /admin/instances describes it, owned by
 * source. report (optional): an array that gets each rank's JSON with "result". Returns 0, or 400 / 507 (no
 * room) with err set; *changed: 1 when a rank was added or revived. With RT_SRC_ETCD an endpoint that has
 * active ranks of another source is left as it is (returns 0, *changed 0, err says why). */
struct rt_admin_instance;
struct cJSON;
int rt_registry_add(const struct rt_admin_instance *in, int source, struct cJSON *report, int *changed, char *err,
                    size_t cap);
/* Takes out every active rank of host:port in role (of that source only, or any when source < 0) whose DP
 * rank is at least min_dp_rank (-1: all; ranks on their own ports have -1); the ones in flight finish. report (optional) gets each removed rank's JSON. Returns how many. */
int rt_registry_remove(int role, const char *host, int port, int source, int min_dp_rank, struct cJSON *report);
/* SIGHUP: reads the configuration again and applies the pools as a difference (add, revive, update,
 * remove); streams in flight are untouched. 0 or -1 (logged). */
int rt_reload(void);

/* Installs the request handlers on an evhtp server. */
struct evhtp;
void rt_install_handlers(struct evhtp *htp);
void rt_admin_handlers(struct evhtp *htp);
void rt_metadata_handlers(struct evhtp *htp);
size_t rt_metadata_count(void);
/* GET /metrics (metrics.c). */
struct evhtp_request;
void rt_metrics_handler(struct evhtp_request *req, void *arg);
/* The client connection guard (client_conn.c): timeouts, head limits, over-capacity answers. */
struct evhtp_connection;
int rt_client_pre_accept_check(void);
void *rt_client_attach(struct evhtp_connection *c);
int rt_client_headers_hook(struct evhtp_request *req, void *guard);
/* The handler's cleanup for req, run once when libevhtp frees the request (answer sent, or connection gone);
 * NULL to cancel. Handlers use this instead of libevhtp's request hooks, which would hide the guard's. */
void rt_client_set_owner(struct evhtp_request *req, void (*fini)(void *arg), void *arg);
/* A generate request's body, which the guard keeps out of libevhtp's parser (owned by the caller from here),
 * or NULL: the body is in req->buffer_in. */
struct evbuffer *rt_client_take_body(struct evhtp_request *req);
/* Pauses req (its answer comes later, evhtp_request_resume ends the pause) while the connection is still read:
 * gone(owner's arg) is called if the client hangs up, and returns 1 when it freed the connection. */
void rt_client_pause_reading_on(struct evhtp_request *req, int (*gone)(void *arg));
/* An answer finished without evhtp_request_resume ends that pause itself, when rt_client_pause_ours (0: the
 * connection has an error, a write pending, or is not paused: libevhtp's resume ends it). */
int rt_client_pause_ours(struct evhtp_request *req);
void rt_client_unpause(struct evhtp_request *req);

/* --handoff xpyd (kvxfer.c): the router's transfer engine and its release notifications. */
struct cJSON;
int rt_kvxfer_start(void);
void rt_kvxfer_stop(void);
/* Queues "release <xpyd_key>" to the prefill segment named in kv_params; 0 or -errno (not an xpyd answer). */
int rt_kvxfer_release(const char *kv_params);

/* server.c: a router thread's state (its upstream pools, its admission queues). */
struct rthread *rt_thread_new(struct event_base *base);
void rt_thread_free(struct rthread *t);
/* threads.c: the list of router threads, and the calling thread's. */
void rt_threads_add(struct rthread *t);
void rt_threads_remove(struct rthread *t);
struct rthread *rt_thread_self(void);
void rt_threads_kick_all(void);
/* models.c: GET /v1/models */
void rt_models_handler(struct evhtp_request *req, void *arg);
void rt_status_handlers(struct evhtp *htp);

#endif
