/* SPDX-License-Identifier: Apache-2.0 */
/* decide.c - the request core's decisions, pure (see decide.h). */
#include "decide.h"

#include "router.h"
#include "xpyd_http_client.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

int rd_leg_fail_kind(int role, int err, int status)
{
    if (status)
        return role ? RF_DECODE_STATUS : RF_PREFILL_STATUS;
    if (err == -ETIME)
        return role ? RF_DECODE_TIMEOUT : RF_PREFILL_TIMEOUT;
    return role ? RF_DECODE_CONNECT : RF_PREFILL_CONNECT; /* refused, reset, connect timed out, TLS */
}

const char *rd_err_text(int err, char *buf, size_t cap)
{
    if (err == -ETIME)
        snprintf(buf, cap, "no answer within the timeout");
    else if (err == -ETIMEDOUT)
        snprintf(buf, cap, "connect timed out");
    else if (err == -EPROTO)
        snprintf(buf, cap, "malformed HTTP response");
    else if (err == -UP_ETLS)
        snprintf(buf, cap, "TLS handshake failed (see event=tls_handshake_failed in the log)");
    else if (err == -ECONNRESET)
        snprintf(buf, cap, "connection closed before the response was complete");
    else
        snprintf(buf, cap, "%s", strerror(-err));
    return buf;
}

enum rd_retry_answer rd_may_retry(const struct rd_retry *f)
{
    if (f->client_has_bytes || f->ended)
        return RD_NO;
    if (f->status && f->status < 500)
        return RD_NO; /* the engine judged the request itself: another one would too */
    if (f->attempts > f->max_retries || f->tried >= f->max_tried || (size_t)f->tried >= f->ranks)
        return RD_NO; /* out of attempts, or every instance was tried: the real error goes to the client */
    if (!f->retrying && !f->fallback) {
        /* the retry budget: in an outage, retries must not multiply the load on what is left */
        int64_t allowed = f->active * f->budget_percent / 100;
        if (allowed < f->budget_min)
            allowed = f->budget_min;
        if (f->retries_active >= allowed)
            return RD_BUDGET_SPENT;
    }
    return RD_RETRY;
}

double rd_backoff_ms(long base, int attempts, uint64_t rnd)
{
    if (base <= 0)
        return 0;
    double ms = (double)base;
    for (int k = 1; k < attempts && ms < 1000; k++)
        ms *= 2;
    if (ms > 1000)
        ms = 1000;
    return ms * (0.5 + (double)(rnd >> 11) / 9007199254740992.0);
}

int rd_may_migrate(int can_continue, int streaming, int done_seen, int ended, int migrations, long limit,
                   int decodes_tried, int max_tried, size_t decode_ranks)
{
    return can_continue && streaming && !done_seen && !ended && migrations < limit && decodes_tried < max_tried &&
           (size_t)decodes_tried < decode_ranks; /* another decode to go on at */
}

int rd_continue_through_prefill(int mode_local_prefill, long min_tokens, int64_t cont_prompt)
{
    return mode_local_prefill && min_tokens > 0 && cont_prompt >= min_tokens;
}

int rd_may_fall_back(int fallback_on, int mode_local_prefill, int client_has_bytes, int migrations, int ended,
                     int prefill_answered)
{
    return fallback_on && mode_local_prefill && (!client_has_bytes || migrations > 0) && !ended &&
           !prefill_answered;
}

int rd_local_prefill(int64_t prompt_tokens, int64_t cached, long max_tokens, long when_busy_tokens,
                     int prefills_full)
{
    int64_t uncached = prompt_tokens - cached;
    if (uncached < max_tokens)
        return 1;
    return uncached < when_busy_tokens && prefills_full;
}

enum rd_kv_fate rd_kv_after_decode_failure(int mode_local_prefill, int kv_on_prefill, int fallback_on, int accepted,
                                           int attempts, int status, int prefill_state)
{
    if (!mode_local_prefill)
        return RD_KV_KEEP;
    if (accepted)
        return RD_KV_TAKEN;
    if (!fallback_on)
        return RD_KV_KEEP;
    if (status >= 400 && status < 500)
        return attempts > 1 ? RD_KV_REFUSED : RD_KV_KEEP;
    if (!kv_on_prefill)
        return RD_KV_KEEP;
    if (prefill_state)
        return prefill_state == 1 ? RD_KV_UNREACHABLE : RD_KV_FAILING;
    return attempts > 1 ? RD_KV_SUSPECT : RD_KV_KEEP;
}
