/* SPDX-License-Identifier: Apache-2.0 */
/* access_log.h - one line per generate request (--access-log logfmt|json), for the ones the router served,
 * failed or refused before routing alike, in one format (access_log.c). */
#ifndef XPYD_ACCESS_LOG_H
#define XPYD_ACCESS_LOG_H

#include <stddef.h>
#include <stdint.h>

struct evhtp_request;
struct evhtp_connection;

struct access_entry {
    const char *request_id;
    const char *client;        /* "ip:port" of the client, "-" unknown */
    const char *method, *path;
    int status;                /* what the client got (499: it left first) */
    int stream;
    const char *prefill, *decode; /* "host:port[#dp rank]" of the last pick, "-" none */
    int64_t prompt_tokens, output_tokens;
    double ttft_s;             /* first token reached the client after this long; < 0: none did */
    double total_s;
    const char *error;         /* the failure table's name, "none" */
    int migrations;            /* continuations the stream needed (decode migration) */
    const char *prompt_src;    /* where prompt_tokens came from: tokenizer (--tokenizer), ids (a token-id prompt),
                                * engine (the prefill's usage replaced the estimate), estimate, - (refused
                                * before it was read) */
    const char *pd;            /* who computed the prompt: remote (a prefill leg), local (conditional
                                * disaggregation chose the decode alone), fallback (no prefill could), - (the
                                * mode has no prefill leg) */
};

/* Writes the line (nothing with --access-log off). Any thread. */
void rt_access_log(const struct access_entry *e);
struct request;
/* The line of a generate request as it ended (fail: enum rt_fail), when --access-log is on. */
void rt_access_log_request(const struct request *r, int fail);
/* The client's address of req as "ip:port" ("[v6]:port") into out, "-" when unknown. */
void rt_client_addr(struct evhtp_request *req, char *out, size_t cap);
/* The same for a connection (no request yet, e.g. a failed TLS handshake). */
void rt_client_addr_of(struct evhtp_connection *c, char *out, size_t cap);

#endif
