/* SPDX-License-Identifier: Apache-2.0 */
/* bench.h - xpyd_bench's parts: the options and the per-request record (xpyd_bench.c: flags, driver, callbacks),
 * the workload (bench_workload.c: lengths, arrivals, prompts, bodies), the report (bench_report.c: the result
 * table and JSON, as benchmark_serving prints them). */
#ifndef XPYD_BENCH_H
#define XPYD_BENCH_H

#include "xpyd_sse.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

struct evbuffer;
struct up_leg;

struct opts {
    char host[256];
    int port;
    char endpoint[256];
    int chat;
    char model[256];
    int num_prompts;
    int input_len, output_len;
    double range_ratio;
    double rate; /* requests/s, 0 = inf */
    double burstiness;
    int max_concurrency; /* 0 = unlimited */
    int ignore_eos;
    uint64_t seed;
    char percentile_metrics[128];
    char metric_percentiles[128];
    int save_result;
    char result_filename[512];
    int disable_tqdm;
    long timeout_ms;
    int pareto;               /* --length-dist pareto: heavy-tailed lengths (shape 1.5, mean kept, cap 10x) */
    int token_ids;            /* --tokenizer-free: prompts as token-id arrays (completions only) */
    double slo_ttft_ms, slo_tpot_ms, slo_e2el_ms; /* --goodput: 0 = not part of the SLO */
    int goodput;
    char direct_prefill[300]; /* HOST:PORT: do the kv-params P->D sequence from the client (baseline) */
    int prefix_rep;           /* --dataset-name prefix-repetition */
    int pr_prefix_len, pr_suffix_len, pr_num_prefixes, pr_output_len;
    uint64_t pr_prefix_seed; /* 0: the prefixes come from --seed's stream */
    int multi_turn;           /* --multi-turn N: conversations of N turns, each re-sending its history */
    int tls;                  /* --base-url https://...: TLS to the server */
    char tls_ca[512];         /* --tls-ca FILE: the CA the server's certificate is checked against ("" system) */
    char dp_host[256];
    int dp_port;
};

struct req {
    int i;
    int in_len, out_len;
    uint64_t t_start, t_last;
    double ttft;         /* s, <0 until the first token */
    double *itl;         /* s, owned */
    size_t n_itl, cap_itl;
    long out_tokens;     /* from usage, else counted */
    long in_tokens;      /* the server's usage.prompt_tokens, -1 when it sent none */
    struct evbuffer *text; /* generated text (result file: generated_texts) */
    long counted;
    int status;
    int done_seen;
    int ok;
    double e2el;
    char err[200];
    struct xpyd_sse_parser sse;
    struct evbuffer *errbody;
    struct up_leg *leg;
    char *prompt;        /* owned: the text (or token ids) of this request's new user turn */
    struct evbuffer *pbody; /* direct mode: the prefill's answer */
    long cached_tokens;  /* usage.prompt_tokens_details.cached_tokens, -1 when the server sent none */
    int sent;
};

/* xpyd_bench.c: the options, every request's record, the random state, the run's start and end (µs). */
extern struct opts O;
extern struct req *reqs;
extern uint64_t rng, t0, t_end;

/* bench_workload.c */
double bench_urand(void);                        /* uniform in [0, 1) */
double bench_gamma(double shape, double scale);  /* gamma-distributed (inter-arrival gaps with --burstiness) */
int bench_rand_len(int mean);                    /* a length: uniform +-range ratio, or Pareto (--length-dist) */
void bench_prefix_init(void);                    /* --dataset-name prefix-repetition: the shared prefixes */
void bench_make_prompt(struct req *r);           /* r's new user turn */
/* r's body (prefill: the direct P->D baseline's prefill leg; kv: the prefill's kv_transfer_params for the
 * decode leg); malloc'd. */
char *bench_make_body(struct req *r, int prefill, const cJSON *kv);

/* bench_report.c: the result table (and --save-result's JSON) from reqs. */
void bench_report(void);

#endif
