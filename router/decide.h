/* SPDX-License-Identifier: Apache-2.0 */
/* decide.h - the request core's decisions as pure functions of what they read (no router state, no clock, no
 * I/O): may a failed attempt be retried, may a broken stream migrate, may the decode compute the prompt itself
 * (fallback, conditional disaggregation), how long to back off, what a leg's failure was. request.c and
 * migrate.c gather the facts and act; tests/unit/test_decide.c holds every rule to its boundary. */
#ifndef XPYD_DECIDE_H
#define XPYD_DECIDE_H

#include <stddef.h>
#include <stdint.h>

/* What a failed attempt was, for the failure table (router.h's RF_*): a status (the engine answered >= 400),
 * a timeout (-ETIME: no answer in time), or a connection that failed. */
int rd_leg_fail_kind(int role, int err, int status);
/* An errno-style leg error in words. */
const char *rd_err_text(int err, char *buf, size_t cap);

/* The facts a retry decision reads. */
struct rd_retry {
    int client_has_bytes;  /* something reached the client already */
    int ended;             /* the request ended, or its client request is gone */
    int status;            /* the engine's status (0: no answer: a connection or timeout error) */
    int attempts, tried;   /* attempts made on this leg; instances tried */
    long max_retries;      /* --max-retries */
    size_t ranks;          /* ranks in the leg's pool */
    int max_tried;         /* how many tried instances a request remembers */
    int retrying;          /* the request already holds a retry slot of the budget */
    int fallback;          /* a decode failed for want of a gone prefill's KV: the next computes the prompt (a
                            * prefill fallback, outside the budget as --prefill-fallback is) */
    int64_t active, retries_active; /* requests in progress; requests retrying now */
    long budget_percent, budget_min; /* --retry-budget-percent, --retry-budget-min */
};
enum rd_retry_answer { RD_NO = 0, RD_RETRY, RD_BUDGET_SPENT };
/* Another attempt on a different instance: nothing reached the client, the engine did not judge the request
 * itself (4xx), attempts and untried instances remain, and (for a request not yet retrying) the budget allows
 * one more request to retry: max(active * percent / 100, min). */
enum rd_retry_answer rd_may_retry(const struct rd_retry *f);

/* The backoff before attempt `attempts + 1`: base doubled per earlier attempt up to 1 s, times a jitter in
 * [0.5, 1.5) drawn from rnd (53 random bits used). 0 when base is 0. */
double rd_backoff_ms(long base, int attempts, uint64_t rnd);

/* A broken stream may go on at another decode: the request can be continued (it kept its text), the client is
 * streaming and has not seen [DONE], migrations remain, and an untried decode exists. */
int rd_may_migrate(int can_continue, int streaming, int done_seen, int ended, int migrations, long limit,
                   int decodes_tried, int max_tried, size_t decode_ranks);
/* The continuation of a migrated stream goes through a prefill leg (rather than the decode alone) when the
 * mode's decode can run alone and its prompt reaches --migration-prefill-min-tokens (0: never). */
int rd_continue_through_prefill(int mode_local_prefill, long min_tokens, int64_t cont_prompt);

/* --prefill-fallback: no prefill can serve, and the decode can compute the prompt itself: the mode allows it,
 * the client has nothing yet (or the stream migrated), the request is live and no prefill answered. */
int rd_may_fall_back(int fallback_on, int mode_local_prefill, int client_has_bytes, int migrations, int ended,
                     int prefill_answered);

/* A decode attempt that was handed the prefill's KV (kv_transfer_params) failed (status: its answer's, 0 when
 * there was none): what becomes of that KV for the next attempt. KEEP: the next attempt gets it again (a 4xx on
 * the first attempt judges the request: it goes to the client). TAKEN: the failed decode answered 200 (it took
 * the KV, gone with it). REFUSED: a decode answered 4xx after an earlier attempt, which may have pulled the KV (it
 * died mid-pull or right after): the prefill no longer holds it (vLLM's connectors answer 4xx); a request bad in
 * itself gets the same 4xx again from the next attempt. UNREACHABLE: the prefill holding it is out of service
 * (prefill_state 1: down, ejected, removed): no decode can pull it. SUSPECT: an earlier decode already failed with
 * it (the router may not know yet that its prefill is gone; if the prefill still holds it, the mode's release
 * frees it now). FAILING: the prefill is failing (prefill_state 2: its last attempt failed, or two decodes failed
 * with its KV since its last success; in a crash these come before any ejection): as SUSPECT, from the first
 * attempt. In all but KEEP the next decode computes the prompt itself; TAKEN needs a mode whose decode can run
 * alone, REFUSED --prefill-fallback too, the last three also a mode whose KV stays on the prefill until pulled
 * (not store). */
enum rd_kv_fate { RD_KV_KEEP = 0, RD_KV_TAKEN, RD_KV_REFUSED, RD_KV_UNREACHABLE, RD_KV_SUSPECT, RD_KV_FAILING };
/* The KV was lost where it was held (its prefill gone or failing), not by the decode. */
static inline int rd_kv_lost_at_source(enum rd_kv_fate kv)
{
    return kv == RD_KV_UNREACHABLE || kv == RD_KV_FAILING;
}
enum rd_kv_fate rd_kv_after_decode_failure(int mode_local_prefill, int kv_on_prefill, int fallback_on, int accepted,
                                           int attempts, int status, int prefill_state);

/* Conditional disaggregation at a request's first placement: the decode computes the prompt when the tokens
 * its chosen rank does not hold cached are fewer than --local-prefill-max-tokens, or fewer than
 * --local-prefill-when-busy-tokens while every prefill is full. */
int rd_local_prefill(int64_t prompt_tokens, int64_t cached, long max_tokens, long when_busy_tokens,
                     int prefills_full);

#endif
