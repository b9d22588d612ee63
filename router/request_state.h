/* SPDX-License-Identifier: Apache-2.0 */
/* request_state.h - one client generate request inside the router: its state machine and its two legs, the data
 * the modules that drive it share (request.c: the core, request.h; stream.c: what the client receives,
 * stream.h; admission.c: waiting for a rank, admission.h; handoff_*.c: the handoff modes behind struct
 * handoff_ops).
 *
 * States and transitions (request.c, req_set_state() checks each one with assert):
 *
 *   NEW --start--> LEGS --prefill ok, decode next--> LEGS ... --last byte--> DONE
 *    |               |  \--leg failed, may retry--> BACKOFF --timer--> LEGS
 *    |               |  \--every rank full--------> QUEUED  --slot---> LEGS
 *    \---------------+--------------------------------------------------------> DONE (error, client gone)
 *
 * LEGS means one or two legs are in flight (legs[RT_PREFILL], legs[RT_DECODE]); which ones is the handoff's
 * business. What the client has received is the separate client state (CLIENT_NOTHING, CLIENT_STREAMING,
 * CLIENT_ANSWERED), because a stream may start before the decode leg does (--first-token prefill).
 *
 * Ownership: a request is created when a generate request's body is valid and freed only when libevhtp frees
 * the client request (req_free_cb), the single safe point. Every ending goes through req_end() (idempotent);
 * every ending with an error goes through req_fail(), whatever the client already received. */
#ifndef XPYD_REQUEST_STATE_H
#define XPYD_REQUEST_STATE_H

#include "router.h"
#include "xpyd_sse.h"
#include "xpyd_util.h"

#include <cjson/cJSON.h>
#include <stdint.h>

struct rw_src;
struct evbuffer;
struct event;
struct evhtp_request;

enum req_state {
    REQ_NEW = 0, /* created, nothing sent */
    REQ_LEGS,    /* legs in flight (or about to be sent) */
    REQ_BACKOFF, /* a leg failed; the next attempt waits for its backoff timer */
    REQ_QUEUED,  /* every eligible rank is full: waiting in the admission queue */
    REQ_DONE     /* ended: legs closed, charges released, counted; freed when libevhtp lets go */
};

enum req_client { CLIENT_NOTHING = 0, CLIENT_STREAMING, CLIENT_ANSWERED };

#define MAX_TRIED 16

/* One upstream leg (prefill or decode): the instance, its charge, the connection and its answer. */
struct leg {
    int role;                   /* RT_PREFILL / RT_DECODE */
    int idx;                    /* balancer instance of the current attempt, -1 none */
    int64_t charge;             /* tokens charged on it, released exactly */
    struct up_leg *up;          /* in flight, or NULL */
    struct evbuffer *buf;       /* its answer body (non-streamed, or an error body) */
    int status;                 /* its HTTP status, 0 before the head */
    int accepted;               /* some attempt of this leg answered 200 (decode: it took the prefill's KV) */
    int answered;               /* the leg finished with a usable answer (prefill: its KV is waiting) */
    int tried[MAX_TRIED];       /* instances tried, so retries go elsewhere */
    int ntried, attempts;
    int last_idx;               /* the last instance picked (access log), -1 none */
    char who[96];               /* with --access-log: who it was when picked ("host:port#dp") */
    uint64_t t_sent;            /* when the current attempt was sent */
    uint64_t kv_pending;        /* its prompt pending on the rank until released (rt_kv_picked), 0 none */
    void (*on_done)(struct up_leg *up, int err, void *leg); /* the current attempt's completion */
};

struct request {
    enum req_state state;
    enum req_client client;
    int fail;                   /* enum rt_fail, once DONE */
    int status;                 /* what the client got */
    struct rthread *t;
    struct evhtp_request *ereq; /* NULL once libevhtp freed it */
    const struct handoff_ops *ho;
    int kind;                   /* RT_EP_COMPLETIONS / RT_EP_CHAT */
    char *model;                /* the body's "model" (owned), or NULL: named by the prefill's first token */
    struct rw_src *src;         /* the client's body bytes, read in place, what engines receive (body_src.h); owned */
    int64_t body_bytes;         /* counted in the router's body memory (rt_body_memory_*) */
    int stream;
    char xid[128];              /* X-Request-Id sent on every leg */
    char client_addr[64];       /* the client's ip:port (access log) */
    char *fwd_headers;          /* client headers forwarded upstream, serialized; owned */
    int64_t prompt_tokens;      /* estimate, corrected by prefill's usage; exact with --tokenizer (tokenize.h) */
    int prompt_src;             /* where prompt_tokens came from: enum rt_prompt_src (tokenize.h) */
    struct rt_tok_job *tok_job; /* --tokenizer: the prompt's job while it is tokenized (tokenize.c), else NULL */
    int64_t max_tokens;
    int64_t room_tokens;    /* what max_model_len must hold beyond the prompt (rw_room_tokens: vLLM's check) */
    int64_t prompt_longest; /* exact counts: the longest prompt's tokens (a batch's prompts are checked alone) */
    int64_t truncate;       /* truncate_prompt_tokens: -2 none, -1 the engine's max_model_len, else k (tokenize.h) */
    uint64_t t_start, t_first, t_last_tok;
    struct leg legs[2];
    char retry_after[64];       /* the failing engine's Retry-After, passed through with its 429/503 */
    /* what the prefill handed over */
    char *kv_params;            /* kv-params / xpyd: returned by prefill, as compact JSON text (rewrite.h); owned */
    long cached_tokens;         /* prefill's usage.prompt_tokens_details.cached_tokens, -1 unknown */
    char *first_text;           /* prefill's token (first-token prefill mode); owned */
    char *resp_id;              /* the id the client sees in every event (prefill mode); owned */
    /* the client's stream (stream.c) */
    struct xpyd_sse_parser sse;
    int role_sent, first_dropped, done_seen; /* relay progress (relay.h) */
    int64_t tokens_out;
    int paused;                 /* the decode leg is paused: the client is slow */
    int in_read;                /* relaying one socket read of the decode: its events are written together */
    int finish_held;            /* the answer is complete but not yet written: req_end counts it first */
    struct xpyd_bytes chunk;    /* the next chunk's events, reused for every one (owned) */
    struct xpyd_bytes stage;    /* a TLS client's bytes not yet handed to OpenSSL (stream.c; owned) */
    int batch;                  /* relaying one upstream read: events collect in chunk (stream.c) */
    struct event *bp_timer;     /* while paused: watches the client's output drain (owned) */
    int first_token_seen;       /* the decode produced its first token (handoff_ops.first_token ran) */
    int prefill_token_sent;     /* the client's first token was the prefill's (client_prefill_first_token) */
    int local_prefill;          /* the decode computes the prompt: --prefill-fallback, or the local-prefill decision */
    int pd_local;               /* conditional disaggregation chose the decode alone (access log pd=local) */
    uint64_t *blocks;           /* prefix-block hashes of the prompt (a pool keeps a prefix index); owned */
    size_t nblocks;
    uint64_t session;           /* hash of the --session-key value, 0: none */
    int64_t predicted_cached[2]; /* tokens the index predicted cached on each leg's rank (last pick) */
    /* decode migration (--migration-limit): a stream whose decode fails goes on at another decode */
    struct evbuffer *gen_text;  /* the text the client has (NULL: this request cannot migrate); owned */
    int migrations;             /* continuations sent so far */
    int64_t tokens_before;      /* tokens the client had when the current continuation was sent (all of them
                                 * are in its prompt: its usage gives them back to completion_tokens) */
    int64_t base_tokens;        /* of those, the ones already in the request body's prompt (a continuation
                                 * that went through a prefill leg became the body); gen_text holds the rest */
    int preempted;              /* the decode gave the request up (stop_reason "recomputed") */
    unsigned attempt_seq;       /* attempts that sent both legs at once (mooncake: a new transfer_id each) */
    /* retries and waiting */
    int retrying;               /* counted in retries_active until the request ends or falls back */
    struct event *retry_timer;  /* backoff before the next attempt (owned) */
    void (*next)(struct request *r); /* what runs after the backoff or the queue */
    void (*expired)(struct request *r, int role); /* admission.c: the queue deadline passed */
    int queued_role;            /* admission.c: -1 when not queued */
    struct request *qprev, *qnext;
    struct event *queue_timer;  /* --queue-timeout-ms deadline (owned) */
};

#endif
