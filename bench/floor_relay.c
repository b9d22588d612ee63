/* SPDX-License-Identifier: Apache-2.0 */
/* floor_relay.c - the cheapest relay this machine allows, as a baseline for bench/overhead.sh: what any
 * user-space proxy must pay in the kernel for the same traffic, with next to nothing spent in user space.
 * It is not a product and has no HTTP beyond what the measurement needs: one thread, one epoll set, and
 * each client connection gets its own engine connection(s) for its whole life (no pool, no parsing of
 * the answer). Every engine read is written to the client at once (one write per read, as the router and
 * nginx with proxy_buffering off do).
 *   hop: the client's bytes go to the decode as they come, the decode's bytes to the client (a TCP relay).
 *   pd:  per request (head + Content-Length body, collected first; its request line kept), the request with
 *        "max_tokens":1,"stream":false,"stream_options":null,"kv_transfer_params":{"do_remote_decode":true}
 *        in front of its body's keys goes to the prefill; once the prefill's whole answer is in (its
 *        Content-Length), the client's request with the answer's "kv_transfer_params" member (copied as it
 *        came) put in front goes to the decode
 *        (which pulls the KV from the prefill engine, as behind the router), whose bytes go to the client as
 *        they come. That is the P->D path's two upstream exchanges without the router's JSON parsing,
 *        placement and accounting.
 *   xpyd_floor_relay hop|pd PORT DECODE_PORT [PREFILL_PORT]   (127.0.0.1 only; runs until killed)
 * Failure handling is minimal on purpose: a connection that fails or sends what it cannot frame is closed
 * with its partners. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define BUFSZ 65536
#define REQMAX 262144 /* a P->D request up to 256 KiB (bench/growth.sh: 128 KB prompts) */

enum { END_CLIENT = 0, END_DECODE = 1, END_PREFILL = 2 };

struct pair;
struct end { /* one socket of a pair; epoll's data points here */
    struct pair *pr;
    int which, fd;
    char *pend; /* bytes the socket did not take yet (rare on loopback) */
    size_t plen;
};
struct pair {
    struct end e[3];
    char req[REQMAX]; /* pd: the client's request being collected */
    size_t rlen;
    char *pans; /* pd: the prefill's answer being collected */
    size_t palen, pacap;
    size_t waiting_prefill; /* pd: the length of the request whose prefill is out, 0 if none */
};

static int ep, mode_pd;
static struct sockaddr_in dec_addr, pre_addr;
static char buf[BUFSZ];

static int connect_to(const struct sockaddr_in *a)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    if (fd < 0)
        return -1;
    if (connect(fd, (const struct sockaddr *)a, sizeof *a) != 0) {
        close(fd);
        return -1;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static void pair_close(struct pair *pr)
{
    for (int i = 0; i < 3; i++)
        if (pr->e[i].fd >= 0) {
            close(pr->e[i].fd);
            free(pr->e[i].pend);
        }
    free(pr->pans);
    free(pr);
}

static void watch(struct end *e, unsigned ev, int op)
{
    struct epoll_event x = {.events = ev, .data.ptr = e};
    epoll_ctl(ep, op, e->fd, &x);
}

/* Sends n bytes to e; what the socket does not take waits for EPOLLOUT. Returns -1 on a failed socket. */
static int send_to(struct end *e, const char *p, size_t n)
{
    if (e->plen) { /* keep the order behind what is pending */
        char *np = realloc(e->pend, e->plen + n);
        if (!np)
            return -1;
        memcpy(np + e->plen, p, n);
        e->pend = np;
        e->plen += n;
        return 0;
    }
    ssize_t w = send(e->fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno != EAGAIN)
        return -1;
    size_t done = w < 0 ? 0 : (size_t)w;
    if (done == n)
        return 0;
    e->pend = malloc(n - done);
    if (!e->pend)
        return -1;
    memcpy(e->pend, p + done, n - done);
    e->plen = n - done;
    watch(e, EPOLLIN | EPOLLOUT, EPOLL_CTL_MOD);
    return 0;
}

static int flush_pending(struct end *e)
{
    ssize_t w = send(e->fd, e->pend, e->plen, MSG_NOSIGNAL);
    if (w < 0)
        return errno == EAGAIN ? 0 : -1;
    memmove(e->pend, e->pend + w, e->plen - (size_t)w);
    e->plen -= (size_t)w;
    if (!e->plen) {
        free(e->pend);
        e->pend = NULL;
        watch(e, EPOLLIN, EPOLL_CTL_MOD);
    }
    return 0;
}

/* Length of a complete message (head + Content-Length body) at the start of p, 0 if not complete yet,
 * -1 if it cannot be framed (chunked requests are not supported). */
static long message_len(const char *p, size_t n)
{
    const char *end = memmem(p, n, "\r\n\r\n", 4);
    if (!end)
        return n >= REQMAX ? -1 : 0;
    size_t head = (size_t)(end - p) + 4;
    long body = 0;
    for (const char *l = memchr(p, '\n', head); l && l < end; l = memchr(l + 1, '\n', (size_t)(end - l)))
        if (!strncasecmp(l + 1, "content-length:", 15))
            body = strtol(l + 16, NULL, 10);
    if (body < 0 || head + (size_t)body > REQMAX)
        return -1;
    return head + (size_t)body <= n ? (long)(head + (size_t)body) : 0;
}

/* Sends the request of len bytes at req to e, its request line kept, with keys (`"name":value` pairs, klen
 * bytes) put in front of its body's members (an engine takes the first of a repeated key). */
static int send_with_keys(struct end *e, const char *req, size_t len, const char *keys, size_t klen)
{
    const char *line_end = memmem(req, len, "\r\n", 2);
    const char *body = (const char *)memmem(req, len, "\r\n\r\n", 4) + 4;
    const char *brace = memchr(body, '{', len - (size_t)(body - req));
    if (!brace)
        return -1;
    size_t after = len - (size_t)(brace + 1 - req), line = (size_t)(line_end - req);
    static char out[2 * REQMAX];
    int hl = snprintf(out, sizeof out,
                      "%.*s\r\nHost: engine\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n{",
                      (int)line, req, klen + (klen > 0) + after + 1);
    if (hl < 0 || (size_t)hl + klen + 1 + after > sizeof out)
        return -1;
    size_t o = (size_t)hl;
    memcpy(out + o, keys, klen), o += klen;
    if (klen)
        out[o++] = ',';
    memcpy(out + o, brace + 1, after), o += after;
    return send_to(e, out, o);
}

/* pd: the collected request (len bytes) goes to the prefill as a one-token prefill that keeps its KV. */
static int send_prefill(struct pair *pr, size_t len)
{
    static const char keys[] = "\"max_tokens\":1,\"stream\":false,\"stream_options\":null,"
                               "\"kv_transfer_params\":{\"do_remote_decode\":true,\"do_remote_prefill\":false}";
    pr->waiting_prefill = len;
    pr->palen = 0;
    return send_with_keys(&pr->e[END_PREFILL], pr->req, len, keys, sizeof keys - 1);
}

/* pd: the `"kv_transfer_params":{...}` member of the prefill's answer (alen bytes at a), in place, for the
 * decode; its length in *klen (0 if the answer has none). */
static const char *kv_member(const char *a, size_t alen, size_t *klen)
{
    static const char name[] = "\"kv_transfer_params\":";
    const char *p = memmem(a, alen, name, sizeof name - 1), *end = a + alen;
    *klen = 0;
    if (!p)
        return "";
    const char *v = p + sizeof name - 1;
    while (v < end && *v == ' ')
        v++;
    if (v >= end || *v != '{')
        return "";
    int depth = 0, in_str = 0;
    const char *q = v;
    for (; q < end; q++) {
        if (in_str) {
            if (*q == '\\')
                q++;
            else if (*q == '"')
                in_str = 0;
        } else if (*q == '"')
            in_str = 1;
        else if (*q == '{')
            depth++;
        else if (*q == '}' && --depth == 0)
            break;
    }
    if (q >= end)
        return "";
    *klen = (size_t)(q + 1 - p);
    return p;
}

static void consume(struct pair *pr, size_t len)
{
    memmove(pr->req, pr->req + len, pr->rlen - len);
    pr->rlen -= len;
}

/* pd: starts the next collected request: to the prefill, or, without a body (GET /v1/models, /health), to
 * the decode at once. */
static int next_request(struct pair *pr)
{
    for (;;) {
        long len = message_len(pr->req, pr->rlen);
        if (len <= 0)
            return (int)len;
        const char *body = (const char *)memmem(pr->req, (size_t)len, "\r\n\r\n", 4) + 4;
        if (body < pr->req + len)
            return send_prefill(pr, (size_t)len);
        if (send_to(&pr->e[END_DECODE], pr->req, (size_t)len) != 0)
            return -1;
        consume(pr, (size_t)len);
    }
}

static int on_client_bytes(struct pair *pr, const char *p, size_t n)
{
    if (!mode_pd)
        return send_to(&pr->e[END_DECODE], p, n);
    if (pr->rlen + n > REQMAX)
        return -1;
    memcpy(pr->req + pr->rlen, p, n);
    pr->rlen += n;
    return pr->waiting_prefill ? 0 : next_request(pr);
}

static int on_prefill_bytes(struct pair *pr, const char *p, size_t n)
{
    if (pr->palen + n > pr->pacap) {
        size_t cap = (pr->palen + n) * 2;
        char *np = realloc(pr->pans, cap);
        if (!np)
            return -1;
        pr->pans = np;
        pr->pacap = cap;
    }
    memcpy(pr->pans + pr->palen, p, n);
    pr->palen += n;
    long alen = message_len(pr->pans, pr->palen);
    if (alen <= 0)
        return (int)alen;
    if (strncmp(pr->pans, "HTTP/1.1 200 ", 13) != 0) /* a refused prefill fails the request: the client sees it */
        return -1;
    /* the request the answer was for goes to the decode, with the prefill's kv_transfer_params (the decode
     * engine then pulls the KV from the prefill engine, as behind the router) */
    size_t rlen = pr->waiting_prefill, klen;
    const char *kv = kv_member(pr->pans, (size_t)alen, &klen);
    if (send_with_keys(&pr->e[END_DECODE], pr->req, rlen, kv, klen) != 0)
        return -1;
    consume(pr, rlen);
    pr->waiting_prefill = 0;
    return next_request(pr); /* a pipelined one */
}

static void accept_client(int lfd)
{
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK), one = 1;
    if (fd < 0)
        return;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct pair *pr = calloc(1, sizeof *pr);
    if (!pr) {
        close(fd);
        return;
    }
    pr->e[END_CLIENT].fd = fd;
    pr->e[END_DECODE].fd = connect_to(&dec_addr);
    pr->e[END_PREFILL].fd = mode_pd ? connect_to(&pre_addr) : -1;
    if (pr->e[END_DECODE].fd < 0 || (mode_pd && pr->e[END_PREFILL].fd < 0)) {
        pair_close(pr);
        return;
    }
    for (int i = 0; i < 3; i++) {
        pr->e[i].pr = pr;
        pr->e[i].which = i;
        if (pr->e[i].fd < 0)
            continue;
        fcntl(pr->e[i].fd, F_SETFL, fcntl(pr->e[i].fd, F_GETFL) | O_NONBLOCK);
        watch(&pr->e[i], EPOLLIN, EPOLL_CTL_ADD);
    }
}

static int on_readable(struct end *e)
{
    struct pair *pr = e->pr;
    ssize_t n = recv(e->fd, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN))
        return -1;
    if (n < 0)
        return 0;
    switch (e->which) {
    case END_CLIENT:
        return on_client_bytes(pr, buf, (size_t)n);
    case END_DECODE:
        return send_to(&pr->e[END_CLIENT], buf, (size_t)n);
    default:
        return on_prefill_bytes(pr, buf, (size_t)n);
    }
}

static int port_arg(const char *s, struct sockaddr_in *a)
{
    long p = strtol(s, NULL, 10);
    if (p <= 0 || p > 65535)
        return -1;
    memset(a, 0, sizeof *a);
    a->sin_family = AF_INET;
    a->sin_port = htons((unsigned short)p);
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return 0;
}

int main(int argc, char **argv)
{
    struct sockaddr_in me;
    mode_pd = argc > 1 && !strcmp(argv[1], "pd");
    if (argc < 4 || (strcmp(argv[1], "hop") && !mode_pd) || (mode_pd && argc < 5) || port_arg(argv[2], &me) ||
        port_arg(argv[3], &dec_addr) || (mode_pd && port_arg(argv[4], &pre_addr))) {
        fprintf(stderr, "usage: %s hop|pd PORT DECODE_PORT [PREFILL_PORT]\n", argv[0]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&me, sizeof me) != 0 || listen(lfd, 4096) != 0) {
        perror("listen");
        return 1;
    }
    ep = epoll_create1(0);
    struct epoll_event lev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &lev);
    struct epoll_event evs[256];
    for (;;) {
        int k = epoll_wait(ep, evs, 256, -1);
        for (int i = 0; i < k; i++) {
            struct end *e = evs[i].data.ptr;
            if (!evs[i].events) /* skipped: its pair was closed earlier in this batch */
                continue;
            if (!e) {
                accept_client(lfd);
                continue;
            }
            int rc = 0;
            if (evs[i].events & EPOLLOUT)
                rc = flush_pending(e);
            if (rc == 0 && (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)))
                rc = on_readable(e);
            if (rc != 0) {
                /* the other ends of this pair may still be in evs: closed fds are taken out of the set by
                 * close(), and this batch's remaining events for them are skipped by marking them */
                struct pair *pr = e->pr;
                for (int j = i + 1; j < k; j++) {
                    struct end *o = evs[j].data.ptr;
                    if (o && o->pr == pr)
                        evs[j].data.ptr = NULL, evs[j].events = 0;
                }
                pair_close(pr);
            }
        }
    }
}
