/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_upstream.c - libFuzzer harness: what the router does with an engine's HTTP response. The input is
 * sent, as the engine's answer, over a real loopback connection to an up_leg (common/xpyd_http_client.c:
 * http-parser, keep-alive, timeouts, EOF handling); the body goes through the router's SSE splitter and
 * each event through the usage rewrite, and the whole body through the prefill-answer reader, as the
 * router's relay does. Checks: exactly one on_done, callbacks in order, no crash, no UB, no leak. */
#include "rewrite.h"
#include "xpyd_http_client.h"
#include "xpyd_sse.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static struct event_base *base;
static struct up_thread *up;
static struct up_endpoint ep;
static int lfd = -1;

struct st {
    int head, done, sent, err;
    struct xpyd_sse_parser sse;
    struct evbuffer *body;
};

static int on_event(void *arg, const char *data, size_t len, const char *raw, size_t rawlen)
{
    if (len == 6 && memcmp(data, "[DONE]", 6) == 0)
        return 0;
    cJSON *o = cJSON_ParseWithLength(data, len);
    if (o) {
        rw_patch_usage(o, 3);
        (void)rw_event_text(o);
        cJSON_Delete(o);
    }
    return 0;
}

static void on_head(struct up_leg *leg, int status, void *arg)
{
    struct st *s = arg;
    if (s->head || s->done || status < 200 || status > 599)
        abort();
    s->head = 1;
}

static void on_body(struct up_leg *leg, const char *data, size_t len, void *arg)
{
    struct st *s = arg;
    if (!s->head || s->done)
        abort(); /* body before the head, or after the end */
    xpyd_sse_feed(&s->sse, data, len, on_event, s);
    if (evbuffer_get_length(s->body) < 65536)
        evbuffer_add(s->body, data, len);
}

static void on_done(struct up_leg *leg, int err, void *arg)
{
    struct st *s = arg;
    if (s->done)
        abort(); /* ended twice */
    s->done = 1;
    s->err = err;
    event_base_loopbreak(base);
}

static void on_header(struct up_leg *leg, const char *name, const char *value, void *arg)
{
    struct st *s = arg;
    if (s->head || strlen(name) > 63 || strlen(value) > 255)
        abort(); /* headers come before the head callback, within the documented sizes */
}

static void on_sent(struct up_leg *leg, void *arg)
{
    ((struct st *)arg)->sent = 1;
    event_base_loopbreak(base);
}

static void setup(void)
{
    signal(SIGPIPE, SIG_IGN);
    base = event_base_new();
    lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (!base || lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof a) || listen(lfd, 16) ||
        getsockname(lfd, (struct sockaddr *)&a, &al))
        abort();
    if (up_endpoint_resolve(&ep, "127.0.0.1", ntohs(a.sin_port)) != 0)
        abort();
    up = up_thread_new(base, &ep, 1, 0); /* no idle pooling: one fresh connection per input */
    if (!up)
        abort();
}

static void run_until(struct st *s, int *flag)
{
    for (int i = 0; i < 200 && !*flag && !s->done; i++) {
        struct timeval tv = {0, 10000};
        event_base_loopexit(base, &tv);
        event_base_dispatch(base);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!base)
        setup();
    struct st s = {0};
    s.sse.max_event = 4096;
    s.body = evbuffer_new();
    struct evbuffer *req = evbuffer_new();
    up_request_line(req, &ep, "POST", "/v1/completions");
    evbuffer_add_printf(req, "Content-Length: 2\r\n\r\n{}");
    static const struct up_timeouts to = {1000, 1000, 1000};
    static const struct up_leg_cbs cbs = {on_head, on_body, on_done, on_sent, on_header, NULL};
    struct up_leg *leg = up_leg_start(up, 0, req, &to, &cbs, &s);
    evbuffer_free(req);
    if (!leg)
        abort();
    int cfd = accept(lfd, NULL, NULL);
    if (cfd < 0)
        abort();
    run_until(&s, &s.sent);
    char buf[4096]; /* read the request so closing does not reset the connection */
    struct pollfd pfd = {cfd, POLLIN, 0};
    while (poll(&pfd, 1, 0) > 0 && recv(cfd, buf, sizeof buf, MSG_DONTWAIT) > 0)
        ;
    size_t off = 0;
    while (off < size) {
        ssize_t w = send(cfd, data + off, size - off, MSG_NOSIGNAL);
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    shutdown(cfd, SHUT_WR);
    run_until(&s, &s.done);
    if (!s.done)
        abort(); /* the leg never ended although the engine closed its side */
    size_t n = evbuffer_get_length(s.body);
    struct rw_prefill_answer a;
    if (rw_absorb_prefill((const char *)evbuffer_pullup(s.body, -1), n, &a) == 0)
        rw_prefill_answer_free(&a);
    close(cfd);
    xpyd_sse_reset(&s.sse);
    evbuffer_free(s.body);
    return 0;
}
