/* SPDX-License-Identifier: Apache-2.0 */
/* models.c - GET /v1/models: the first healthy backend's answer (decode ranks first, then prefill ranks),
 * passed through with its status and body; 502 when none answers. */
#include "loopguard.h"
#include "request.h"

#include "xpyd_util.h"

#include <errno.h>
#include <event2/buffer.h>
#include <evhtp/evhtp.h>
#include <stdlib.h>
#include <string.h>

struct models_req {
    evhtp_request_t *ereq;
    char via[768];      /* the X-Xpyd-Via line sent on (loopguard.h) */
    int status;
    struct evbuffer *body;
    int tries;
};

static void models_try(struct models_req *m);

static void models_fini(void *arg)
{
    struct models_req *m = arg;
    m->ereq = NULL;
}

static void m_head(struct up_leg *leg, int status, void *arg)
{
    ((struct models_req *)arg)->status = status;
}

static void m_body(struct up_leg *leg, const char *data, size_t len, void *arg)
{
    struct models_req *m = arg;
    if (evbuffer_get_length(m->body) < (1u << 20))
        evbuffer_add(m->body, data, len);
}

static void m_done(struct up_leg *leg, int err, void *arg)
{
    struct models_req *m = arg;
    if (!m->ereq) {
        evbuffer_free(m->body);
        free(m);
        return;
    }
    if ((err || m->status != 200) && m->tries < (int)g_rt->reg.n_ranks[RT_DECODE] + (int)g_rt->reg.n_ranks[RT_PREFILL]) {
        models_try(m);
        return;
    }
    evhtp_request_t *req = m->ereq;
    rt_client_set_owner(req, NULL, NULL);
    if (err || m->status != 200)
        xpyd_reply_error(req, 502, "no backend answered GET /v1/models");
    else
        xpyd_reply_buffer(req, 200, "application/json", m->body);
    evhtp_request_resume(req);
    evbuffer_free(m->body);
    free(m);
}

static void models_try(struct models_req *m)
{
    /* decode ranks first, then prefill ranks, healthy ones only */
    int total = (int)(g_rt->reg.n_ranks[RT_DECODE] + g_rt->reg.n_ranks[RT_PREFILL]);
    while (m->tries < total) {
        int k = m->tries++;
        int role = k < (int)g_rt->reg.n_ranks[RT_DECODE] ? RT_DECODE : RT_PREFILL;
        int idx = role == RT_DECODE ? k : k - (int)g_rt->reg.n_ranks[RT_DECODE];
        struct xb_instance_stats st;
        if (xb_stats(g_rt->pools[role], idx, &st) != 0 || !st.healthy || st.removed)
            continue;
        const struct up_endpoint *ep = &g_rt->endpoints[req_endpoint(role, idx)];
        struct evbuffer *req = XPYD_XALLOC(evbuffer_new());
        up_request_line(req, ep, "GET", "/v1/models");
        const char *auth = evhtp_header_find(m->ereq->headers_in, "Authorization");
        if (auth && !strpbrk(auth, "\r\n"))
            evbuffer_add_printf(req, "Authorization: %s\r\n", auth);
        evbuffer_add(req, m->via, strlen(m->via));
        evbuffer_add_printf(req, "\r\n");
        evbuffer_drain(m->body, evbuffer_get_length(m->body));
        m->status = 0;
        static const struct up_leg_cbs cbs = {m_head, m_body, m_done, NULL, NULL, NULL};
        struct up_leg *leg = up_leg_start(rt_thread_self()->up, req_endpoint(role, idx), req, req_timeouts(), &cbs, m);
        evbuffer_free(req);
        if (leg)
            return;
    }
    m->tries = total;
    m_done(NULL, -ENOENT, m);
}

void rt_models_handler(evhtp_request_t *req, void *arg)
{
    if (!rt_authorized(req) || !xpyd_method_allowed(req, "GET, HEAD"))
        return;
    char via[768];
    if (rt_loop_check(req, via, sizeof via) != 0)
        return;
    struct models_req *m = XPYD_XALLOC(calloc(1, sizeof *m));
    memcpy(m->via, via, sizeof via);
    m->ereq = req;
    m->body = XPYD_XALLOC(evbuffer_new());
    rt_client_set_owner(req, models_fini, m);
    evhtp_request_pause(req);
    models_try(m);
}

