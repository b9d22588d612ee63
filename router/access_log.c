/* SPDX-License-Identifier: Apache-2.0 */
/* access_log.c - the access log's one format (decisions): a UTC timestamp with milliseconds first, then the
 * request id (the client's X-Request-Id or the router's own, also for refused requests), client address,
 * method, path, status, the instances, token counts, and durations in seconds always with six decimals
 * (ttft_s -1.000000 when no token reached the client). logfmt quotes nothing (every value is a token the
 * router made or checked); json is one object per line. */
#include "access_log.h"

#include "request_state.h"
#include "router.h"
#include "tokenize.h"
#include "xpyd_util.h"

#include <arpa/inet.h>
#include <evhtp/evhtp.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

void rt_client_addr(struct evhtp_request *req, char *out, size_t cap)
{
    rt_client_addr_of(req ? req->conn : NULL, out, cap);
}

void rt_client_addr_of(struct evhtp_connection *c, char *out, size_t cap)
{
    const struct sockaddr *sa = c ? c->saddr : NULL;
    char ip[INET6_ADDRSTRLEN];
    if (sa && sa->sa_family == AF_INET && cap >= 22) { /* a.b.c.d:port by hand, without printf: every request */
        const struct sockaddr_in *s = (const struct sockaddr_in *)sa;
        const unsigned char *a = (const unsigned char *)&s->sin_addr;
        char *e = out;
        for (int i = 0; i < 4; i++) {
            e = xpyd_put_u64(e, a[i]);
            *e++ = i < 3 ? '.' : ':';
        }
        *xpyd_put_u64(e, ntohs(s->sin_port)) = '\0';
        return;
    }
    snprintf(out, cap, "-");
    if (sa && sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)sa;
        if (inet_ntop(AF_INET6, &s->sin6_addr, ip, sizeof ip))
            snprintf(out, cap, "[%s]:%u", ip, (unsigned)ntohs(s->sin6_port));
    }
}

void rt_access_log(const struct access_entry *e)
{
    if (!g_rt->cfg.access_log)
        return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[80];
    snprintf(when, sizeof when, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
             tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    double ttft = e->ttft_s < 0 ? -1 : e->ttft_s;
    if (g_rt->cfg.access_log == 2)
        fprintf(stderr,
                "{\"ts\":\"%s\",\"request_id\":\"%s\",\"client\":\"%s\",\"method\":\"%s\",\"path\":\"%s\","
                "\"status\":%d,\"stream\":%s,\"prefill\":\"%s\",\"decode\":\"%s\",\"prompt_tokens\":%" PRId64
                ",\"output_tokens\":%" PRId64 ",\"ttft_s\":%.6f,\"total_s\":%.6f,\"error\":\"%s\",\"migrations\":%d,\"pd\":\"%s\","
                "\"prompt_src\":\"%s\"}\n",
                when, e->request_id, e->client, e->method, e->path, e->status, e->stream ? "true" : "false",
                e->prefill, e->decode, e->prompt_tokens, e->output_tokens, ttft, e->total_s, e->error, e->migrations,
                e->pd, e->prompt_src);
    else
        fprintf(stderr,
                "ts=%s access request_id=%s client=%s method=%s path=%s status=%d stream=%d prefill=%s decode=%s "
                "prompt_tokens=%" PRId64 " output_tokens=%" PRId64 " ttft_s=%.6f total_s=%.6f error=%s migrations=%d pd=%s "
                "prompt_src=%s\n",
                when, e->request_id, e->client, e->method, e->path, e->status, e->stream, e->prefill, e->decode,
                e->prompt_tokens, e->output_tokens, ttft, e->total_s, e->error, e->migrations, e->pd, e->prompt_src);
}

void rt_access_log_request(const struct request *r, int fail)
{
    if (!g_rt->cfg.access_log)
        return;
    /* who each leg went to, as it was when picked (the rank's slot may be another engine's by now) */
    const char *pi = r->local_prefill ? "local" /* the decode computed the prompt */
                     : r->legs[RT_PREFILL].last_idx >= 0 ? r->legs[RT_PREFILL].who : "-";
    const char *di = r->legs[RT_DECODE].last_idx >= 0 ? r->legs[RT_DECODE].who : "-";
    struct access_entry e = {r->xid, r->client_addr, "POST", r->kind == RT_EP_CHAT ? "/v1/chat/completions" : "/v1/completions", r->status, r->stream, pi, di,
                             r->prompt_tokens, r->tokens_out,
                             r->t_first ? (double)(r->t_first - r->t_start) / 1e6 : -1,
                             (double)(xpyd_now_us() - r->t_start) / 1e6, rt_fail_table[fail].name, r->migrations,
                             rt_prompt_src_names[r->prompt_src],
                             r->pd_local ? "local" : r->local_prefill ? "fallback"
                                                   : r->legs[RT_PREFILL].attempts ? "remote" : "-"};
    rt_access_log(&e);
}
