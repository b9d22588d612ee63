/* SPDX-License-Identifier: Apache-2.0 */
/* workers.c - the router's worker threads and how a connection reaches one (workers.h). */
#include "workers.h"

#include "router.h"
#include "xpyd_util.h"

#include <errno.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <evhtp/evhtp.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The worker threads, and how a connection reaches one. Each worker runs its own event loop and accepts on the
 * listening sockets itself (a dup of each, polled by its loop): an idle worker takes the next connection, a busy
 * one leaves it in the kernel's listen queue (--listen-backlog). libevhtp's own thread pool is not used: its
 * accept thread hands every connection to a worker through a socket pair that holds a few hundred, and resets a
 * connection it cannot hand over; a burst of clients did that (1,000 streams opened at once: 208 reset on the
 * CI machine, 1,125 of 3,000 here). A worker takes at most ACCEPT_BATCH connections a loop turn, so that a burst
 * is spread over the workers that are free. */
#define ACCEPT_BATCH 16
#define MAX_LISTENERS 2

struct worker {
    pthread_t tid;
    struct event_base *base;
    evhtp_t *htp[MAX_LISTENERS];
    struct event *resume;        /* a loop turn later: accepting again */
    struct event *unbind;        /* activated by rt_workers_stop_accepting */
    int accepted;                /* connections accepted since the last resume */
    atomic_int stopping;
    uint64_t error_logged_us;
};

static struct worker *workers;
static int n_workers, n_listeners;
static evhtp_t *bound[MAX_LISTENERS]; /* on the main thread's base, bound and never accepting there */
static SSL_CTX *ls_tls[MAX_LISTENERS];
static __thread struct worker *me;

/* The guard has read and checked the whole request (the body limit included) before libevhtp sees it. */
static evhtp_res on_headers(evhtp_request_t *req, evhtp_headers_t *hdr, void *arg)
{
    rt_client_headers_hook(req, arg);
    return EVHTP_RES_OK;
}

static evhtp_res on_pre_accept(evhtp_connection_t *c, void *arg)
{
    return rt_client_pre_accept_check() == 0 ? EVHTP_RES_OK : EVHTP_RES_ERROR;
}

static evhtp_res on_accept(evhtp_connection_t *c, void *arg)
{
    xpyd_tcp_nodelay(c->sock);
    void *guard = rt_client_attach(c);
    evhtp_connection_set_hook(c, evhtp_hook_on_headers, (evhtp_hook)on_headers, guard);
    if (me && ++me->accepted == 1)
        event_active(me->resume, EV_READ, 0);
    if (me && me->accepted >= ACCEPT_BATCH && c->htp->server)
        evconnlistener_disable(c->htp->server); /* the rest of the burst to whichever worker is free */
    return EVHTP_RES_OK;
}

static void on_resume(evutil_socket_t fd, short ev, void *arg)
{
    struct worker *w = arg;
    w->accepted = 0;
    for (int k = 0; k < n_listeners && !atomic_load(&w->stopping); k++)
        if (w->htp[k]->server)
            evconnlistener_enable(w->htp[k]->server);
}

/* accept() failed for another reason than "none left" (out of descriptors, out of memory; the socket shut down
 * by rt_workers_stop_accepting): this worker stops polling it for 100 ms rather than spin on it */
static void on_accept_error(struct evconnlistener *lev, void *arg)
{
    struct worker *w = me;
    int err = EVUTIL_SOCKET_ERROR();
    evconnlistener_disable(lev);
    if (!w || atomic_load(&w->stopping))
        return;
    atomic_fetch_add(&g_rt->ctr.accept_errors, 1);
    uint64_t now = xpyd_now_us();
    if (now - w->error_logged_us >= 1000000u) {
        w->error_logged_us = now;
        XLOG_WARN("msg=\"accept failed; this worker pauses accepting for 100 ms\" error=\"%s\"", strerror(err));
    }
    struct timeval tv = {0, 100000};
    event_add(w->resume, &tv);
}

static void on_unbind(evutil_socket_t fd, short ev, void *arg)
{
    struct worker *w = arg;
    for (int k = 0; k < n_listeners; k++)
        evhtp_unbind_socket(w->htp[k]);
}

static pthread_barrier_t all_ready; /* no worker serves before every one has its state */

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    me = w;
    struct rthread *t = rt_thread_new(w->base);
    pthread_barrier_wait(&all_ready);
    event_base_loop(w->base, EVLOOP_NO_EXIT_ON_EMPTY);
    rt_thread_free(t);
    return NULL;
}

/* A worker's server on listening socket fd: its own libevhtp instance on the worker's loop */
static evhtp_t *serve(struct event_base *base, SSL_CTX *tls, evutil_socket_t fd)
{
    evhtp_t *htp = XPYD_XALLOC(evhtp_new(base, NULL));
    htp->ssl_ctx = tls; /* libevhtp makes each accepted connection a TLS bufferevent when set */
    evhtp_set_pre_accept_cb(htp, on_pre_accept, NULL);
    evhtp_set_post_accept_cb(htp, on_accept, NULL);
    rt_install_handlers(htp);
    rt_status_handlers(htp);
    int d = dup(fd);
    if (d < 0 || evhtp_accept_socket(htp, d, 0) != 0) { /* backlog 0: already listening */
        fprintf(stderr, "xpyd_router: cannot poll the listening socket: %s\n", strerror(errno));
        exit(1);
    }
    evconnlistener_set_error_cb(htp->server, on_accept_error);
    return htp;
}

static int port_of(evutil_socket_t fd)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0)
        return -1;
    return ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                          : ((struct sockaddr_in *)&ss)->sin_port);
}

int rt_workers_bind(struct event_base *main_base, struct rt_listen *ls, int n, int backlog)
{
    if (n > MAX_LISTENERS)
        return -1;
    for (int k = 0; k < n; k++) {
        char addr[300];
        snprintf(addr, sizeof addr, "%s%s", strchr(ls[k].host, ':') ? "ipv6:" : "", ls[k].host);
        bound[k] = XPYD_XALLOC(evhtp_new(main_base, NULL));
        if (evhtp_bind_socket(bound[k], addr, (uint16_t)ls[k].port, backlog) != 0) {
            fprintf(stderr, "xpyd_router: cannot listen on %s:%d: %s\n", ls[k].host, ls[k].port, strerror(errno));
            return -1;
        }
        evconnlistener_disable(bound[k]->server); /* the workers accept */
        ls[k].bound_port = port_of(evconnlistener_get_fd(bound[k]->server));
        ls_tls[k] = ls[k].tls;
    }
    n_listeners = n;
    return 0;
}

int rt_workers_start(int threads)
{
    workers = XPYD_XALLOC(calloc((size_t)threads, sizeof *workers));
    for (int i = 0; i < threads; i++) { /* every loop and its descriptors first: none is made once one serves */
        struct worker *w = &workers[i];
        w->base = XPYD_XALLOC(event_base_new());
        w->resume = XPYD_XALLOC(event_new(w->base, -1, 0, on_resume, w));
        w->unbind = XPYD_XALLOC(event_new(w->base, -1, 0, on_unbind, w));
        for (int k = 0; k < n_listeners; k++)
            w->htp[k] = serve(w->base, ls_tls[k], evconnlistener_get_fd(bound[k]->server));
    }
    pthread_barrier_init(&all_ready, NULL, (unsigned)threads + 1);
    for (int i = 0; i < threads; i++) {
        struct worker *w = &workers[i];
        if (pthread_create(&w->tid, NULL, worker_main, w) != 0) {
            fprintf(stderr, "xpyd_router: cannot start %d threads\n", threads);
            exit(1); /* the ones started wait at the barrier: nothing was served */
        }
        n_workers = i + 1;
    }
    pthread_barrier_wait(&all_ready);
    return 0;
}

void rt_workers_stop_accepting(void)
{
    static atomic_int stopped;
    if (atomic_exchange(&stopped, 1))
        return;
    for (int i = 0; i < n_workers; i++)
        atomic_store(&workers[i].stopping, 1); /* first: the shutdown's accept errors are then expected */
    for (int k = 0; k < n_listeners; k++) /* at once: new connections are refused, those not yet accepted reset */
        shutdown(evconnlistener_get_fd(bound[k]->server), SHUT_RDWR);
    for (int i = 0; i < n_workers; i++)
        event_active(workers[i].unbind, EV_READ, 0); /* each frees its listeners on its own thread */
}
