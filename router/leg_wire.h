/* SPDX-License-Identifier: Apache-2.0 */
/* leg_wire.h - what a leg puts on the wire and how its engine is named (leg_wire.c). */
#ifndef XPYD_LEG_WIRE_H
#define XPYD_LEG_WIRE_H

#include "decide.h"
#include "request_state.h"

#include <stddef.h>

struct evbuffer;
struct up_timeouts;

/* The head of a request to legs[role]'s instance idx, into b; the whole request (head, body). */
void req_head(struct evbuffer *b, struct request *r, int role, int idx, const char *method, const char *path,
              const char *body, size_t len);
/* An upstream request to legs[role]'s instance idx: request line, our headers, the client's, the body. */
struct evbuffer *req_build(struct request *r, int role, int idx, const char *method, const char *path, const char *body,
                           size_t len);
int req_endpoint(int role, int idx);
const struct up_timeouts *req_timeouts(void);
const char *req_path(const struct request *r);
const char *req_role_name(int role);
/* A rank for errors and logs: "decode 10.0.0.2:8200 (dp rank 1)"; for the access log: "10.0.0.2:8200#1". */
void req_inst_desc(int role, int idx, char *out, size_t cap);
void req_inst_short(int role, int idx, char *out, size_t cap);
/* 1: the rank is out of service right now (health checks took it down, ejected after failures, removed, or not
 * known); 0 for idx < 0 (no rank) */
int req_inst_gone(int role, int idx);
/* What a failed decode attempt (err, or its status) leaves of the prefill's KV for the next one: decide.h's rule
 * with the request's mode, --prefill-fallback and whether its prefill is out of service now or failing. */
enum rd_kv_fate req_decode_kv_fate(const struct request *r, int err, int status);
/* A decode answered status with KV that stays on its prefill until pulled: a 200 counts as a use of that
 * prefill's KV (xb_report_used); a 5xx before taking it is reported against the prefill (xb_report_kv_lost: a
 * second decode doing so marks it failing) and returns the prefill's rank, *uses its uses so far (the source the
 * decode lacked, for req_report). Else -1. */
int req_decode_kv_outcome(const struct request *r, int status, uint64_t *uses);

#endif
