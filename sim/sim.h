/* SPDX-License-Identifier: Apache-2.0 */
/* sim.h - xpyd_sim, a simulated vLLM engine: configuration and entry point of the server. */
#ifndef SIM_H
#define SIM_H

#include <stdint.h>

enum sim_role { SIM_ROLE_BOTH = 0, SIM_ROLE_PREFILL, SIM_ROLE_DECODE };
enum sim_handoff {
    SIM_HANDOFF_KV_PARAMS = 0,
    SIM_HANDOFF_STORE,
    SIM_HANDOFF_BOOTSTRAP,
    SIM_HANDOFF_NONE,
    SIM_HANDOFF_XPYD,
    SIM_HANDOFF_MOONCAKE, /* vLLM's MooncakeConnector: both legs at once, meeting on transfer_id */
    SIM_NHANDOFFS
};
/* The modes' names, in enum order, NULL-terminated (--handoff, metrics). */
extern const char *const sim_handoff_names[];

struct sim_config {
    int role;
    char host[256];
    int port;
    char model[256];
    char lora_modules[1024];  /* --lora-modules: LoRA adapters served too, NAME[=PATH] separated by commas */
    long max_model_len;
    uint64_t seed;
    int dp_size;
    int dp_internal;
    long prefill_us_per_token;
    long decode_us_per_token;
    long max_batch;
    long kv_capacity_tokens;  /* KV a rank holds at most (prompt + generated of running requests); 0 = unbounded */
    long decode_ns_per_kv_token; /* extra step time per KV token the rank holds (attention cost); 0 = none */
    int prefix_caching;       /* 1: per-rank prefix cache (LRU of chained block hashes) */
    int prefill_serial;       /* 1: a rank computes one prompt at a time (--prefill-compute serial) */
    long block_size, num_gpu_blocks;
    char kv_events[256];        /* --kv-events ENDPOINT ("" off): KV-event publisher, rank r on its port + r */
    int kv_events_format;       /* 0 map, 1 array */
    char kv_events_replay[256]; /* --kv-events-replay ENDPOINT ("" none) */
    char kv_events_topic[128];
    long kv_events_buffer;      /* batches kept per rank for replays */
    int handoff;
    char store_dir[512];
    long store_wait_ms;
    long handoff_timeout_ms;
    long lease_ms;
    long kv_bytes_per_token;
    int bootstrap_port;       /* -1: per mode; 0: the HTTP port serves bootstrap pulls; after start: the bound one or 0 */
    double fail_rate;
    int status_code;          /* 0: off */
    long fail_after_tokens;   /* -1: off */
    long recompute_after_tokens; /* -1: off; else the request is given up (stop_reason "recomputed") after N */
    long stall_ms;
    long stream_buffer_bytes; /* a stream's unsent bytes above this pause its generation (backpressure) */
    long startup_delay_ms;
    double eos_prob;
    long max_body_bytes;
    int log_level;
    char port_file[512];      /* written with the bound port once listening (for --port 0) */
    char tls_cert[512], tls_key[512], tls_client_ca[512];
    int tls_min_version;      /* 0: 1.2, 1: 1.3 */
    char upstream_ca[512], upstream_cert[512], upstream_key[512];
    char register_url[1024];  /* etcd://.../prefix: register this engine (common/xpyd_register.c); "" off */
    char register_host[256];  /* the host routers should use ("" : --host) */
    char tokenizer[1024];     /* a Hugging Face model directory: prompts through its tokenizer ("" : word model) */
    int trust_request_chat_template; /* a chat request's own chat_template rendered (vLLM's flag), else 400 */
    long request_chat_template_cache_bytes; /* trusted request templates kept compiled */
    long register_ttl_s;
};

/* Fills the documented defaults. */
void sim_config_defaults(struct sim_config *c);
/* Runs the simulator until SIGINT/SIGTERM. Returns a process exit code. */
int sim_run(const struct sim_config *c);

const char *sim_role_name(int role);
const char *sim_handoff_name(int h);

#endif
