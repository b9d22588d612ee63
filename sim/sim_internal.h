/* SPDX-License-Identifier: Apache-2.0 */
/* sim_internal.h - xpyd_sim's shared internals: the simulator, its DP ranks and its requests (struct sreq),
 * and the calls between its files: sim_engine.c (a request's life: scheduling, handoff legs, generation),
 * sim_server.c (HTTP handlers and set-up), sim_metrics.c (/metrics), sim_kv.c (simulated KV bytes and the
 * store), sim_http.c (small helpers); complete answers are common/xpyd_reply.c's, shared with the router. */
#ifndef SIM_INTERNAL_H
#define SIM_INTERNAL_H

#include "sim.h"
#include "sim_lease.h"
#include "sim_request.h"
#include "sim_tokens.h"
#include "xpyd_http_client.h"
#include "xpyd_transfer.h"
#include "sim_blocks.h"
#include "sim_kvpub.h"
#include "xpyd_tls.h"

#include <cjson/cJSON.h>
#include <event2/event.h>
#include <evhtp/evhtp.h>
#include <stdint.h>
#include <sys/queue.h>

enum sreq_state { SREQ_NONE = 0, SREQ_STALLED, SREQ_WAITING, SREQ_HANDOFF, SREQ_PREFILL, SREQ_DECODE, SREQ_DONE };

enum { HO_DONE = 0, HO_FAILED, HO_RECOMPUTED, HO_NRESULTS };
extern const char *const ho_result_names[HO_NRESULTS];

struct sim;

struct sim_rank {
    struct sim *sim;
    int idx;
    evhtp_t *htp; /* external DP: this rank's own server; internal: NULL (rank 0 owns sim->htp) */
    evhtp_t *boot_htp;    /* external DP with a bootstrap server: this rank's own (bootstrap port + rank) */
    char engine_id[128];
    int port;             /* the port this rank is reached on */
    long running;
    TAILQ_HEAD(, sreq) waiting;
    long waiting_n;
    uint64_t kv_tokens_running; /* prompt + generated tokens of running requests */
    uint64_t next_block;
    /* counters */
    uint64_t prompt_tokens_total, generation_tokens_total, requests_total, success_total, aborted_total;
    uint64_t prefix_queries, prefix_hits; /* tokens looked up in / found in the prefix cache */
    uint64_t prefill_free_at;             /* --prefill-compute serial: when the rank's compute is next free (µs) */
    struct sim_pool *pool;                /* --prefix-caching on: its block pool (sim_blocks.h), else NULL */
    struct sim_kvrank *kv;                /* --kv-events: its publisher (sim_kvpub.c), else NULL */
};

struct xreg;
struct sim {
    struct sim_config cfg;
    struct event_base *base;
    evhtp_t *htp;            /* internal DP (or dp 1): the one server */
    evhtp_t *bootstrap_htp;  /* optional separate bootstrap listener */
    struct sim_rank *ranks;
    int nranks;
    struct sim_lease_table leases;
    SSL_CTX *tls_server, *tls_client; /* --tls-cert / --upstream-ca (NULL: plain) */
    LIST_HEAD(, sreq) all;
    struct event *sweep_ev;
    struct event *sig_int, *sig_term;
    struct xreg *reg;           /* --register */
    char model_json[300];    /* model name, JSON-escaped without quotes */
    uint64_t rng;
    uint64_t seq;
    /* counters */
    uint64_t handoffs[SIM_NHANDOFFS][HO_NRESULTS]; /* [handoff mode][result] */
    /* xpyd handoff: this engine's libxpyd_transfer engine, peers opened, notifications polled */
    xt_engine *xt;
    struct event *xt_ev;     /* the engine's event fd: a read finished or a notification arrived */
    struct xpull *pulls;     /* reads in flight (decode side) */
    uint64_t xt_releases;
    uint64_t leases_created, leases_released, leases_expired, leases_aborted;
    uint64_t kv_bytes_sent, kv_bytes_received;
    uint64_t faults_fail_rate, faults_status, faults_disconnect, faults_stall;
    uint64_t aborts_requested;
    uint64_t abort_calls; /* POST /abort_request received, whether or not it found its request */
    uint64_t stream_waits; /* token steps put off because a stream's reader was not taking its bytes */
    uint64_t release_notices, leases_cancelled;
    /* peers this engine pulls KV from or notifies: common/'s HTTP client, one endpoint per host:port */
    struct up_thread *up;
    struct up_endpoint *peers; /* SIM_MAX_PEERS entries, filled on first use */
    size_t npeers;
};
#define SIM_MAX_PEERS 256

struct sreq {
    struct sim *sim;
    struct sim_rank *rank;
    evhtp_request_t *ereq;  /* NULL once libevhtp has freed it */
    struct sim_params p;
    char id[200];           /* request id (X-Request-Id or generated) */
    char id_json[220];      /* "cmpl-<id>" or "chatcmpl-<id>", JSON-safe */
    int64_t created;
    int state;
    int in_slot;
    int stream_started;
    int aborted;
    int ho_mode;            /* index into sim->handoffs for the pull this request does */
    long cached_tokens;
    size_t pos;             /* tokens generated so far */
    uint64_t ctx;           /* generation context: the prompt's hash extended by each token (sim_tokens.h) */
    const char *stop_reason; /* "recomputed" when the engine gave the request up, else NULL */
    uint64_t next_due_us;   /* absolute deadline of the next token, so ITL does not drift */
    const char *finish_reason;
    struct event *timer;
    struct event *close_ev;
    struct evbuffer *text;  /* non-stream: generated text */
    struct up_leg *pull_leg;  /* decode: the KV pull in flight (common/'s HTTP client) */
    struct evbuffer *pull_buf; /* its answer */
    int pull_status;
    uint64_t deadline_us;
    char lease_key[240];    /* prefill: the lease created for this request */
    struct xpull *xp;       /* decode, xpyd handoff: the read in flight (outlives the request if aborted) */
    uint64_t kv_xfer_bytes, kv_xfer_us; /* decode, xpyd: what the transfer moved and took (X-KV-Transfer) */
    cJSON *kv_out;          /* prefill: kv_transfer_params to return */
    TAILQ_ENTRY(sreq) wq;
    LIST_ENTRY(sreq) all;
};

struct xpull {
    struct sim *sim;
    struct sreq *r;         /* NULL once the request went away (the read still has to finish) */
    xt_batch batch;
    xt_segment seg;
    unsigned char *buf;     /* registered with the engine while the read runs */
    size_t len;
    uint64_t t0;
    char key[240];
    struct xpull *next;
};



/* sim_http.c */
uint64_t sim_rand(struct sim *s);
void sim_json_escape_into(const char *in, char *out, size_t cap);
void sim_add_header(evhtp_request_t *req, const char *k, const char *v);
const char *sim_body_of(evhtp_request_t *req, size_t *len);
struct timeval sim_us_to_tv(uint64_t us);
struct sim_rank *sim_rank_of(void *arg);

/* sim_kv.c */
unsigned char *sim_kv_make(const struct sreq *r, size_t *len);
int sim_kv_verify(const struct sreq *r, const unsigned char *data, size_t len);
void sim_store_path(const struct sim *s, uint64_t hash, char *out, size_t cap);
int sim_store_write(struct sreq *r);
int sim_store_read(struct sreq *r);

/* sim_engine.c */
int sim_peer(struct sim *s, const char *host, int port);
evhtp_res sim_on_request_fini(evhtp_request_t *req, void *arg);
void sim_on_client_closed(evutil_socket_t fd, short ev, void *arg);
void sim_sreq_schedule(struct sreq *r, uint64_t us);
void sim_sreq_admit(struct sreq *r);
void sim_sreq_start(struct sreq *r);
void sim_sreq_tick(evutil_socket_t fd, short ev, void *arg);
void sim_sreq_fail(struct sreq *r, int status, const char *msg);
void sim_sreq_release(struct sreq *r);
void sim_sreq_reply(struct sreq *r, int status, const char *ctype, const char *body, size_t len);
void sim_notify_release(struct sreq *r);
/* sim_prefill.c: a lease's KV leaves the transfer engine before it is freed; a lease dropped. */
void sim_lease_drop(struct sim *s, struct sim_lease *l);
void sim_lease_unregister(void *arg, struct sim_lease *l);
/* A prefill's KV held for its decode, per handoff: the kv-params lease, the store key, the bootstrap room, the
 * mooncake transfer id (0, or -errno: -EEXIST for a room or id already in use). */
int sim_register_kv_params(struct sreq *r);
int sim_register_key(struct sreq *r, const char *key);
int sim_register_room(struct sreq *r);
int sim_register_transfer(struct sreq *r);
/* The prefix cache: tokens of r's prompt this rank has cached (counted as vLLM does), and r's blocks stored. */
long sim_prefix_store(struct sreq *r, int count);
void sim_xt_on_event(evutil_socket_t fd, short ev, void *arg);
void sim_sreq_cut(struct sreq *r);
void sim_pump_waiting(struct sim_rank *rk);

/* sim_metrics.c */
void sim_on_metrics(evhtp_request_t *req, void *arg);

/* sim_output.c: what a simulated engine writes */
char *sim_final_json(struct sreq *r);
struct evbuffer *sim_token_event(struct sreq *r, const char *tok, int last);
void sim_stream_begin(struct sreq *r);
void sim_kv_transfer_header(struct sreq *r);
void sim_usage_json(const struct sreq *r, char *out, size_t cap);

#endif
