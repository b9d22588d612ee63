/* SPDX-License-Identifier: Apache-2.0 */
/* sim_request.h - parsing and validating a completion / chat request the way vLLM does. */
#ifndef SIM_REQUEST_H
#define SIM_REQUEST_H

#include "sim_tokens.h"

#include <stdint.h>

struct sim_limits {
    const char *model;   /* served model name */
    const char *loras;   /* --lora-modules: adapters served too, NAME[=PATH],... ("" none) */
    long max_model_len;
};

/* Handoff information a request carries. Strings are owned by the struct. */
struct sim_handoff_in {
    int do_remote_decode;   /* prefill side: keep the KV under a lease */
    int do_remote_prefill;  /* decode side: pull the KV */
    char *remote_engine_id;
    char *remote_request_id;
    char *remote_host;
    int remote_port;
    uint64_t block_sig;     /* FNV over remote_block_ids */
    int has_blocks;
    int has_bootstrap;      /* SGLang bootstrap_host/port/room present */
    char *bootstrap_host;
    int bootstrap_port;
    uint64_t bootstrap_room;
    long dp_rank;           /* body data_parallel_rank, -1 if absent */
    /* vLLM MooncakeConnector: the legs meet on transfer_id; a decode claims the KV from remote_bootstrap_addr
     * (parsed into remote_host/remote_port) and checks remote_engine_id */
    char *transfer_id;
    /* xpyd handoff (libxpyd_transfer): where the prefill's KV is, and the lease to release */
    int has_xpyd;
    char *xpyd_segment;     /* "host:port" of the prefill's transfer engine */
    uint64_t xpyd_addr;
    uint64_t xpyd_len;
    char *xpyd_key;
};

struct sim_params {
    int chat;
    int stream;
    int include_usage;
    int ignore_eos;
    long max_tokens;
    long min_tokens;
    struct sim_prompt prompt;
    struct sim_handoff_in h;
    char *rid; /* body "rid" (SGLang), owned, may be NULL */
    char *cache_salt; /* vLLM's cache_salt: in the first block's hash (and its KV event's extra_keys); NULL none */
};

/* An --lora-modules list (NAME[=PATH],...), one adapter at a time: 1 with *out (its name, and its path: the name
 * when none is given) and *list moved past it, 0 at the end. sim_lora_served: 1 when name is one of them. */
struct sim_lora {
    const char *name;
    size_t nname;
    const char *path;
    size_t npath;
};
int sim_lora_next(const char **list, struct sim_lora *out);
int sim_lora_served(const char *loras, const char *name);
/* Parses body (len bytes) as a completions (chat=0) or chat completions (chat=1) request.
 * Returns 0 and fills out, or the HTTP status of the error (400 or 404) with *err set to a malloc'ed
 * message; out is then already released. */
int sim_params_parse(const char *body, size_t len, int chat, const struct sim_limits *lim,
                     struct sim_params *out, char **err);
/* Builds the prompt of a /tokenize body ({"prompt":...} or {"messages":[...]}). Same return contract. */
int sim_tokenize_parse(const char *body, size_t len, struct sim_prompt *out, char **err);
void sim_params_free(struct sim_params *p);

#endif
