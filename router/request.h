/* SPDX-License-Identifier: Apache-2.0 */
/* request.h - the request core (request.c): a generate request's legs picked, sent, answered, retried, and the
 * one way it ends. The request itself: request_state.h. */
#ifndef XPYD_REQUEST_H
#define XPYD_REQUEST_H

#include "leg_wire.h"
#include "request_state.h"

/* A request whose fields the server filled (t, ereq, ho, kind, src, stream, xid, fwd_headers, prompt_tokens,
 * max_tokens, t_start) starts: it owns the client request from here, and ho->start runs. */
void req_begin(struct request *r);
void req_set_state(struct request *r, enum req_state to);
/* Ends the request (idempotent): legs closed, charges released, counted, logged. */
void req_end(struct request *r, int fail);
/* Ends the request with an error, whatever the client already received: an OpenAI error answer before the
 * first byte, an error event then [DONE] after. msg is the whole message. */
void req_fail(struct request *r, int fail, int status, const char *msg);
/* req_fail with the failure table's status and "<role> <instance> failed: <detail>". */
void req_leg_fail(struct request *r, int fail, int role, int idx, const char *detail);
/* Picks an instance for role and charges it; -1 when the request waits (queued) or ended (no instance). */
int req_pick(struct request *r, int role, int64_t charge, void (*again)(struct request *r));
/* Sends a leg's attempt to legs[role].idx; on_done is the handoff's (or the core's) completion. body (malloc'd)
 * is the leg's from the call on. */
void req_send(struct request *r, int role, char *body, size_t len, void (*on_done)(struct up_leg *, int, void *));
/* The core's leg completions: what a prefill or a decode answer means, for every handoff. */
void req_prefill_done(struct up_leg *leg, int err, void *arg);
void req_decode_done(struct up_leg *leg, int err, void *arg);
/* A prefill attempt finished (any mode): the leg lets go of its connection and the outcome counts against its
 * instance (200 a success; an error or a 5xx a failure). *ok: usable answer. NULL: the request had ended. */
struct request *req_prefill_finished(struct leg *p, int err, int *ok);
/* Decode migration, a layer above the core (migrate.c): whether a broken stream may go on at another decode,
 * and the step that sends it there. Installed once at start; the core only asks. */
struct req_migration {
    int (*may)(const struct request *r);
    void (*go)(struct request *r, int err);
};
void req_set_migration(const struct req_migration *m);
/* Runs next (the next attempt) after a jittered exponential backoff (decide.c), in state BACKOFF. */
void req_retry_later(struct request *r, int role, void (*next)(struct request *r));
/* A failed prefill attempt (err, or its status): retries through next when allowed, else fails the request. */
void req_prefill_failed(struct request *r, int err, void (*next)(struct request *r));
void req_release(struct request *r, int role);
/* Reads the prefill's JSON answer (legs[RT_PREFILL].buf): exact prompt tokens, cached tokens, the response id,
 * its token, kv_transfer_params. 0, or -1 when it is not a usable completion. */
int req_absorb_prefill(struct request *r);
/* One attempt's outcome against its instance (passive ejection; an ejection is logged); src: the prefill whose KV
 * a failed decode lacked and src_uses its uses then (xb_report_from), else -1 and 0. */
void req_report(int role, int idx, int ok, int src, uint64_t src_uses);
/* A pick given back, as if it had not been made (bootstrap waiting for its decode returns its prefill; in the
 * modes that send both legs at once, the leg whose partner failed may be picked again for the retry). */
void req_unpick(struct request *r, int role);
/* The modes that send both legs at once (bootstrap, mooncake): a prefill and a decode picked and charged for
 * one attempt (again: what a freed rank or a retry restarts); 0, or -1 when the request waits or ended. */
int req_pick_pair(struct request *r, void (*again)(struct request *r));
/* Their decode retry: the prefill did not fail, so its leg (if still running) is closed, its pick given back so
 * it may serve the retry too, and start sends both legs again, never one leg of the old pair. */
void req_restart_pair(struct request *r, void (*start)(struct request *r));
/* The sequential flow (kv-params, xpyd, store, none): a prefill leg, then a decode leg. */
void req_start_prefill(struct request *r);
void req_start_decode(struct request *r);
void req_decode_charge(struct request *r, int64_t *charge);

#endif
