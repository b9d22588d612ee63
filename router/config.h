/* SPDX-License-Identifier: Apache-2.0 */
/* config.h - xpyd_router configuration: one table of settings, pools of hosts, topology expansion. */
#ifndef XPYD_CONFIG_H
#define XPYD_CONFIG_H

#include <stddef.h>
#include <stdio.h>

enum rt_role { RT_PREFILL = 0, RT_DECODE = 1 };
/* kv-params and xpyd share the two-stage flow with kv_transfer_params */
enum rt_first_token { RT_FIRST_DECODE = 0, RT_FIRST_PREFILL };

/* One configured host of a pool, before expansion into ranks. -1 / 0 fields mean "pool default". */
struct rt_host {
    char host[256];
    int port;
    int dp, tp, weight;
    long max_model_len;
    int bootstrap_port;
    int max_inflight;
    int tls;             /* https:// */
    char kv_events[300]; /* "tcp://HOST:PORT": its rank 0's KV-event publisher (rank r on PORT + r), "" none */
};

struct rt_pool_cfg {
    struct rt_host *hosts;
    size_t n, cap;
    int dp, tp;          /* pool-wide defaults */
    int max_inflight;    /* per rank, 0 = unknown */
    int policy;          /* balancer policy */
};

/* One rank of the plan (the configuration after expansion): who it is and what placement should know of it.
 * The registry turns each into a live rank (router.h) and the balancer's instance of the same index. */
struct rt_rank {
    int endpoint;        /* index into rt_config.endpoints (connection pool key) */
    int dp_rank;         /* X-data-parallel-rank to send (internal DP), else -1 */
    int tp, weight, bootstrap_port, max_inflight;
    long max_model_len;
    int tls;             /* the endpoint speaks https */
    char kv_events[300]; /* "tcp://HOST:PORT" of this rank's KV-event publisher, "" none */
};

struct rt_endpoint_cfg {
    char host[256];
    int port;
    int tls;             /* https:// (the client side of xpyd_tls) */
};

struct rt_config {
    char listen_host[256];
    int listen_port;
    int threads;
    int handoff;               /* enum rt_handoff_mode (handoff_traits.h) */
    int first_token;
    int prefill_fallback;      /* 1: a decode computes the prompt when no prefill can (sequential modes) */
    int allow_both_pools;      /* 1: an engine may be listed in both pools (refused otherwise) */
    long prefix_block_tokens, prefix_cache_blocks, prefix_index_max_bytes, prefix_ttl_ms;
    double cache_max_imbalance, cache_uncached_weight;
    long local_prefill_max_tokens, local_prefill_when_busy_tokens;
    char session_key[128];     /* header:NAME | body:FIELD | "" */
    double session_epsilon;
    long migration_limit;      /* continuations a failed stream may get (decode migration); 0 = off */
    long migration_prefill_min_tokens; /* a continuation this long gets a prefill leg (0: never) */
    int dp_internal;
    int repeat_d_times;
    long max_body_bytes;
    long max_body_keys;        /* top-level members of a request body */
    long max_body_memory_bytes; /* request-body bytes held at once, all requests */
    long max_response_bytes;
    long connect_timeout_ms;
    long first_token_timeout_ms;
    long stream_idle_timeout_ms;
    long max_retries;
    long upstream_idle_max;
    long client_buffer_bytes;  /* backpressure: pause decode reads above this much unsent client data */
    double bytes_per_token;
    char tokenizer[1024];      /* --tokenizer DIR: prompts counted exactly (tokenize.c); "" off */
    long tokenizer_threads, tokenizer_queue, tokenizer_wait_ms, tokenizer_cache_bytes, tokenizer_cache_alike_max,
        tokenizer_max_batch_prompts, tokenizer_render_max_steps;
    long kv_events_port[2], kv_events_replay_offset, kv_events_bind_replay_port, kv_events_stale_ms, kv_events_pending_ms, kv_events_max_bytes, kv_events_hwm;
    char kv_events_bind[300];  /* --kv-events-bind tcp://ADDR:PORT: engines connect here (kv_sub.c); "" off */
    long kv_events_bind_ranks; /* bound on PORT .. PORT + N - 1 (an engine's DP rank r connects to PORT + r) */
    long kv_events_replay_timeout_ms, kv_events_recheck_ms, kv_index_max_blocks, kv_index_max_adapters;
    char chat_template[1024];  /* --chat-template FILE: instead of the model directory's; "" none */
    int trust_request_chat_template; /* a request's own chat_template rendered to count it (vLLM's flag) */
    long request_chat_template_cache_bytes; /* memory of request templates kept compiled */
    char id_prefix[32];
    int log_level;
    int access_log;            /* 0 off, 1 logfmt, 2 json */
    int metrics;               /* 1: histograms recorded (default); 0: off (overhead measurements) */
    long health_interval_ms;   /* active health checks; 0 = off */
    int learn_max_model_len;   /* 0 auto (on with --tokenizer), 1 on, 2 off: rt_learn_max_model_len */
    long health_timeout_ms;
    long health_rise, health_fall;
    long query_interval_ms, query_timeout_ms; /* --handoff mooncake: GET /query on the prefills */
    int prefill_bootstrap_port; /* --prefill-bootstrap-port; 0: per mode (rt_config_bootstrap_port) */
    long drain_timeout_ms;
    long eject_after, eject_base_ms, eject_max_ms; /* passive ejection */
    long retry_backoff_ms, retry_budget_percent, retry_budget_min;
    long max_connections;      /* client connections; over it: 503 */
    long listen_backlog;       /* the kernel's queue of connections not yet accepted */
    long header_timeout_ms, body_idle_timeout_ms, keepalive_timeout_ms, linger_ms; /* client guard */
    long max_header_bytes, max_headers, max_header_line_bytes;
    long admission_queue, queue_timeout_ms; /* waiting for a rank under max_inflight */
    long scrape_interval_ms;   /* engine /metrics feedback; 0 = off */
    long feedback_waiting_tokens; /* tokens one waiting engine request counts as */
    long feedback_kv_tokens;      /* tokens a full KV cache (usage 1.0) counts as */
    long feedback_running_tokens; /* tokens one running engine request counts as */
    int dry_run;
    char port_file[512];
    char tls_cert[512], tls_key[512], tls_client_ca[512];
    int tls_min_version;        /* 0: 1.2, 1: 1.3 */
    long plain_port;            /* -1: no plain listener */
    char plain_host[256];
    char upstream_ca[512], upstream_cert[512], upstream_key[512];
    char api_key[256];
    char admin_key[256];       /* admin API; empty = admin API off */
    char metadata_write_key[256]; /* PUT/DELETE /metadata; empty = only the admin key writes */
    long max_instances;        /* per pool, including runtime additions */
    long max_hops;             /* routers a request may have passed through (X-Xpyd-Via) before 508 */
    char discovery[1024];      /* etcd://h:p[,h:p]/prefix: membership and router replicas on etcd; "" off */
    char router_id[128];       /* this replica's name in etcd ("" : hostname:port) */
    long load_sync_ms;         /* publish and read router replicas' load; 0 off */
    long discovery_ttl_s, discovery_timeout_ms, discovery_retry_max_ms;
    long metadata_max_keys, metadata_max_value_bytes;
    int metadata_backend;      /* 0 memory, 1 etcd (the --discovery cluster) */         /* clients must send Authorization: Bearer <key>; empty = no auth */
    char config_path[512];
    struct rt_pool_cfg pools[2];
    /* expansion results */
    struct rt_endpoint_cfg *endpoints;
    size_t n_endpoints;
    struct rt_rank *ranks[2];
    size_t n_ranks[2];
};

/* Parses argv (and the --config JSON file, which the command line overrides). Prints a clear message and
 * returns -1 on error, 1 when --help was printed, 0 otherwise. Then expands pools into ranks. */
int rt_config_load(struct rt_config *c, int argc, char **argv);
void rt_config_free(struct rt_config *c);
/* Writes the expanded topology (the --dry-run output). */
void rt_config_print(const struct rt_config *c, FILE *f);
/* The names of the settings (table rows, not pools) whose values differ between a and b, comma-separated into
 * out; returns how many. A SIGHUP reload reports them: only the pools change at runtime. */
size_t rt_config_changed(const struct rt_config *a, const struct rt_config *b, char *out, size_t cap);
/* The default bootstrap server port of SGLang (--disaggregation-bootstrap-port) and vLLM's MooncakeConnector
 * (VLLM_MOONCAKE_BOOTSTRAP_PORT). */
#define RT_BOOTSTRAP_PORT 8998
/* 1 when the prefill pool's ranks are learned from each prefill's bootstrap server (GET /query), i.e.
 * `--handoff mooncake`: then every prefill's DP ranks share its one HTTP port, pinned by the rank header. */
int rt_config_prefill_by_query(const struct rt_config *c);
/* 1 when ranks without a configured max_model_len take their engine's (--learn-max-model-len; probe.c). */
int rt_learn_max_model_len(const struct rt_config *c);
/* A prefill's bootstrap port: its own when set, else --prefill-bootstrap-port, else 8998 (the engines' default)
 * in the modes that use one (bootstrap, mooncake); in the others it is unused (its HTTP port). */
int rt_config_bootstrap_port(const struct rt_config *c, int bootstrap_port, int http_port);
/* 1 when role's ranks share their host's one port, pinned by X-data-parallel-rank (--dp-mode internal, and
 * the prefill pool under --handoff mooncake). */
int rt_config_ranks_by_header(const struct rt_config *c, int role);
/* Index of host:port in c->endpoints, appended when new (the configuration's own arrays, before start). */
int rt_config_endpoint_index(struct rt_config *c, const char *host, int port);


#endif
