/* SPDX-License-Identifier: Apache-2.0 */
/* workers.h - the listening sockets and the worker threads that serve them (workers.c). Each worker runs its own
 * event loop and libevhtp instance and accepts on the shared listening sockets itself; the main thread binds them
 * and never accepts. */
#ifndef XPYD_WORKERS_H
#define XPYD_WORKERS_H

struct event_base;
struct ssl_ctx_st;

struct rt_listen {
    const char *host;
    int port;
    struct ssl_ctx_st *tls; /* NULL: plain HTTP */
    int bound_port;         /* out: the port bound (port 0: the one the system chose) */
};
/* Binds each of the n listeners (listen queue of `backlog`) on the calling thread: connections wait in the
 * kernel until rt_workers_start. 0, or -1 with a message on stderr. */
int rt_workers_bind(struct event_base *main_base, struct rt_listen *ls, int n, int backlog);
/* Starts `threads` workers that each accept on every bound listener (once the process is ready to serve: its
 * signal handlers installed). 0, or -1 with a message on stderr. */
int rt_workers_start(int threads);
/* Draining: no connection is accepted from now on (the sockets are shut down at once, so a new connection is
 * refused); each worker then frees its listeners on its own thread. Idempotent. */
void rt_workers_stop_accepting(void);

#endif
