/* SPDX-License-Identifier: Apache-2.0 */
/* sim_server.c - xpyd_sim's HTTP server: the OpenAI endpoints, KV pulls and aborts, DP ranks' listeners,
 * signals and set-up. One process, one event loop. */
#include "sim_internal.h"
#include "xpyd_register.h"
#include "xpyd_reply.h"

#include "xpyd_oai.h"
#include "xpyd_sse.h"
#include "xpyd_util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <netinet/in.h>
#include <evhtp/evhtp.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------- HTTP handlers ---------- */

static struct sim_rank *pick_rank(struct sim *s, struct sim_rank *own, evhtp_request_t *req,
                                  const struct sim_params *p, char *err, size_t errcap)
{
    const char *hdr = evhtp_header_find(req->headers_in, "X-data-parallel-rank");
    long r = -1;
    if (hdr && xpyd_parse_long(hdr, 0, 1 << 20, &r) != 0) {
        snprintf(err, errcap, "X-data-parallel-rank must be a non-negative integer");
        return NULL;
    }
    if (r < 0 && p && p->h.dp_rank >= 0)
        r = p->h.dp_rank;
    if (!s->cfg.dp_internal) { /* external LB: each rank is its own server and only knows itself */
        if (r > 0) {
            snprintf(err, errcap, "data parallel rank %ld is out of range for this engine (external LB: only 0)", r);
            return NULL;
        }
        return own;
    }
    if (r >= s->nranks) {
        snprintf(err, errcap, "data parallel rank %ld is out of range [0, %d)", r, s->nranks);
        return NULL;
    }
    if (r >= 0)
        return &s->ranks[r];
    if (p && p->h.has_bootstrap && s->cfg.role == SIM_ROLE_PREFILL)
        return &s->ranks[p->h.bootstrap_room % (uint64_t)s->nranks]; /* SGLang's rule */
    struct sim_rank *best = &s->ranks[0];
    for (int i = 1; i < s->nranks; i++)
        if (s->ranks[i].running + s->ranks[i].waiting_n < best->running + best->waiting_n)
            best = &s->ranks[i];
    return best;
}

static void handle_generate(evhtp_request_t *req, struct sim_rank *own, int chat)
{
    struct sim *s = own->sim;
    if (!xpyd_method_allowed(req, "POST"))
        return;
    if (s->cfg.status_code) {
        s->faults_status++;
        xpyd_reply_error(req, s->cfg.status_code, "xpyd_sim: injected status (--status-code)");
        return;
    }
    if (s->cfg.fail_rate > 0 && (double)(sim_rand(s) >> 11) / 9007199254740992.0 < s->cfg.fail_rate) {
        s->faults_fail_rate++;
        xpyd_reply_error(req, 500, "xpyd_sim: injected failure (--fail-rate)");
        return;
    }
    size_t len;
    const char *body = sim_body_of(req, &len);
    struct sim_limits lim = {s->cfg.model, s->cfg.lora_modules, s->cfg.max_model_len};
    struct sim_params p;
    char *err = NULL;
    int status = sim_params_parse(body, len, chat, &lim, &p, &err);
    if (status) {
        xpyd_reply_error(req, status, err);
        free(err);
        return;
    }
    char rerr[160];
    if ((p.h.do_remote_prefill && s->cfg.role == SIM_ROLE_PREFILL) ||
        (p.h.do_remote_decode && s->cfg.role == SIM_ROLE_DECODE)) {
        sim_params_free(&p);
        xpyd_reply_error(req, 400, s->cfg.role == SIM_ROLE_PREFILL
                                  ? "this engine is a KV producer (prefill): it cannot take do_remote_prefill"
                                  : "this engine is a KV consumer (decode): it cannot take do_remote_decode");
        return;
    }
    struct sim_rank *rk = pick_rank(s, own, req, &p, rerr, sizeof rerr);
    if (!rk) {
        sim_params_free(&p);
        xpyd_reply_error(req, 400, rerr);
        return;
    }
    struct sreq *r = XPYD_XALLOC(calloc(1, sizeof *r));
    r->sim = s;
    r->rank = rk;
    r->ereq = req;
    r->p = p;
    r->created = xpyd_wall_s();
    r->text = p.stream ? NULL : XPYD_XALLOC(evbuffer_new());
    const char *xid = evhtp_header_find(req->headers_in, "X-Request-Id");
    if (p.rid)
        snprintf(r->id, sizeof r->id, "%.190s", p.rid);
    else if (xid && *xid)
        snprintf(r->id, sizeof r->id, "%.190s", xid);
    else
        snprintf(r->id, sizeof r->id, "%016" PRIx64, sim_rand(s));
    char esc[220];
    sim_json_escape_into(r->id, esc, sizeof esc);
    snprintf(r->id_json, sizeof r->id_json, "%s%.200s", chat ? "chatcmpl-" : "cmpl-", esc);
    LIST_INSERT_HEAD(&s->all, r, all);
    rk->requests_total++;
    evhtp_request_set_hook(req, evhtp_hook_on_request_fini, (evhtp_hook)sim_on_request_fini, r);
    evhtp_request_pause(req);
    /* libevhtp's pause turns EV_WRITE off too: without it a reader that fell behind is never written again */
    bufferevent_enable(evhtp_connection_get_bev(evhtp_request_get_connection(req)), EV_WRITE);
    evutil_socket_t fd = bufferevent_getfd(evhtp_connection_get_bev(evhtp_request_get_connection(req)));
    r->close_ev = event_new(s->base, fd, EV_CLOSED, sim_on_client_closed, r);
    if (r->close_ev)
        event_add(r->close_ev, NULL);
    if (s->cfg.stall_ms > 0) {
        s->faults_stall++;
        r->state = SREQ_STALLED;
        sim_sreq_schedule(r, (uint64_t)s->cfg.stall_ms * 1000u);
        return;
    }
    sim_sreq_admit(r);
}


static void on_completions(evhtp_request_t *req, void *arg)
{
    handle_generate(req, sim_rank_of(arg), 0);
}

static void on_chat(evhtp_request_t *req, void *arg)
{
    handle_generate(req, sim_rank_of(arg), 1);
}

static void on_health(evhtp_request_t *req, void *arg)
{
    xpyd_reply(req, 200, "application/json", "", 0);
}

static void on_models(evhtp_request_t *req, void *arg)
{
    struct sim *s = sim_rank_of(arg)->sim;
    long long now = (long long)xpyd_wall_s();
    struct evbuffer *b = XPYD_XALLOC(evbuffer_new());
    evbuffer_add_printf(b,
                        "{\"object\":\"list\",\"data\":[{\"id\":\"%s\",\"object\":\"model\",\"created\":%lld,"
                        "\"owned_by\":\"vllm\",\"root\":\"%s\",\"parent\":null,\"max_model_len\":%ld,"
                        "\"permission\":[]}",
                        s->model_json, now, s->model_json, s->cfg.max_model_len);
    /* --lora-modules: as vLLM lists an adapter (its path as root, the base model as parent) */
    const char *list = s->cfg.lora_modules;
    struct sim_lora a;
    while (sim_lora_next(&list, &a)) {
        char name[1024], path[1024], ename[6 * 1024], epath[6 * 1024]; /* (the list: 1023 bytes at most; an
                                                                         * escape: 6 bytes at most) */
        snprintf(name, sizeof name, "%.*s", (int)a.nname, a.name);
        snprintf(path, sizeof path, "%.*s", (int)a.npath, a.path);
        sim_json_escape_into(name, ename, sizeof ename);
        sim_json_escape_into(path, epath, sizeof epath);
        evbuffer_add_printf(b,
                            ",{\"id\":\"%s\",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"vllm\","
                            "\"root\":\"%s\",\"parent\":\"%s\",\"max_model_len\":null,\"permission\":[]}",
                            ename, now, epath, s->model_json);
    }
    evbuffer_add(b, "]}", 2);
    xpyd_reply_buffer(req, 200, "application/json", b);
    evbuffer_free(b);
}

static void on_tokenize(evhtp_request_t *req, void *arg)
{
    struct sim *s = sim_rank_of(arg)->sim;
    if (!xpyd_method_allowed(req, "POST"))
        return;
    size_t len;
    const char *body = sim_body_of(req, &len);
    struct sim_prompt pr;
    char *err = NULL;
    int st = sim_tokenize_parse(body, len, &pr, &err);
    if (st) {
        xpyd_reply_error(req, st, err);
        free(err);
        return;
    }
    struct evbuffer *b = XPYD_XALLOC(evbuffer_new());
    evbuffer_add_printf(b, "{\"count\":%zu,\"max_model_len\":%ld,\"tokens\":[", pr.n, s->cfg.max_model_len);
    for (size_t i = 0; i < pr.n; i++)
        evbuffer_add_printf(b, i ? ",%u" : "%u", pr.ids[i]);
    evbuffer_add_printf(b, "],\"token_strs\":null}");
    sim_prompt_free(&pr);
    xpyd_reply_buffer(req, 200, "application/json", b);
    evbuffer_free(b);
}

static void kv_take(evhtp_request_t *req, struct sim_rank *rk, int release);

/* The prefill's KV channel: a decode pulls a lease (kv-params) or a bootstrap room... */
static void on_kv_pull(evhtp_request_t *req, void *arg)
{
    kv_take(req, sim_rank_of(arg), 0);
}

/* ...or, aborted before pulling, asks the prefill to free it. */
static void on_kv_release(evhtp_request_t *req, void *arg)
{
    kv_take(req, sim_rank_of(arg), 1);
}

/* rk: the rank whose listener the pull came to. An external DP rank's bootstrap server knows only its own rooms
 * (SGLang's: each rank a server of its own): a decode sent to another rank's bootstrap port finds nothing. */
static void kv_take(evhtp_request_t *req, struct sim_rank *rk, int release)
{
    struct sim *s = rk->sim;
    size_t len;
    const char *body = sim_body_of(req, &len);
    cJSON *o = cJSON_ParseWithLength(body, len);
    const cJSON *room = cJSON_GetObjectItemCaseSensitive(o, "bootstrap_room");
    const cJSON *eid = cJSON_GetObjectItemCaseSensitive(o, "remote_engine_id");
    const cJSON *rid = cJSON_GetObjectItemCaseSensitive(o, "remote_request_id");
    const cJSON *sig = cJSON_GetObjectItemCaseSensitive(o, "block_sig");
    const cJSON *xfer = cJSON_GetObjectItemCaseSensitive(o, "transfer_id");
    char key[260], msg[400];
    if (cJSON_IsString(xfer) && cJSON_IsString(eid)) {
        snprintf(key, sizeof key, "xfer:%.240s", xfer->valuestring);
    } else if (cJSON_IsString(room)) {
        snprintf(key, sizeof key, "room:%s", room->valuestring);
    } else if (cJSON_IsString(eid) && cJSON_IsString(rid) && cJSON_IsString(sig)) {
        snprintf(key, sizeof key, "req:%.240s", rid->valuestring);
    } else {
        cJSON_Delete(o);
        xpyd_reply_error(req, 400, "kv pull needs transfer_id + remote_engine_id, bootstrap_room, or remote_engine_id "
                                   "+ remote_request_id + block_sig");
        return;
    }
    struct sim_lease *l = sim_lease_find(&s->leases, key);
    if (l && cJSON_IsString(room) && rk->boot_htp && strcmp(l->engine_id, rk->engine_id) != 0)
        l = NULL; /* another rank's room */
    if (!l) {
        cJSON_Delete(o);
        if (cJSON_IsString(room) || cJSON_IsString(xfer)) {
            xpyd_reply_error(req, 409, cJSON_IsString(xfer) ? "transfer_id not produced yet" : "bootstrap room not registered yet");
            return;
        }
        snprintf(msg, sizeof msg, "no KV held for remote_request_id '%.200s' (expired, already pulled, or never "
                                  "issued)", key + 4);
        xpyd_reply_error(req, 404, msg);
        return;
    }
    if (cJSON_IsString(xfer)) {
        if (strcmp(l->engine_id, eid->valuestring) != 0) {
            snprintf(msg, sizeof msg, "remote_engine_id '%.100s' does not match the engine that produced transfer_id "
                                      "'%.100s' (%.100s)", eid->valuestring, xfer->valuestring, l->engine_id);
            cJSON_Delete(o);
            xpyd_reply_error(req, 404, msg);
            return;
        }
    } else if (!cJSON_IsString(room)) {
        char want[32];
        snprintf(want, sizeof want, "%016" PRIx64, l->block_sig);
        if (strcmp(l->engine_id, eid->valuestring) != 0 || strcmp(want, sig->valuestring) != 0) {
            snprintf(msg, sizeof msg, "remote_engine_id or remote_block_ids do not match the KV held for '%.200s'",
                     key + 4);
            cJSON_Delete(o);
            xpyd_reply_error(req, 404, msg);
            return;
        }
    }
    cJSON_Delete(o);
    l = sim_lease_take(&s->leases, key);
    if (release) {
        s->leases_cancelled++;
        sim_lease_drop(s, l);
        xpyd_reply(req, 200, "application/json", "{\"released\":true}", 17);
        return;
    }
    s->leases_released++;
    s->kv_bytes_sent += l->kv_len;
    xpyd_reply(req, 200, "application/octet-stream", (const char *)l->kv, l->kv_len);
    sim_lease_drop(s, l);
}

/* POST /reset_prefix_cache (vLLM's): the rank's cached blocks forgotten (internal DP: every rank's, the one
 * server's), AllBlocksCleared published */
static void on_reset_prefix_cache(evhtp_request_t *req, void *arg)
{
    if (!xpyd_method_allowed(req, "POST"))
        return;
    struct sim_rank *rk = sim_rank_of(arg);
    struct sim *s = rk->sim;
    for (int r = 0; r < s->nranks; r++)
        if (s->ranks[r].pool && (s->cfg.dp_internal || &s->ranks[r] == rk))
            sim_pool_clear(s->ranks[r].pool, &s->ranks[r]);
    xpyd_reply_buffer(req, 200, "application/json", NULL);
}

static void on_abort(evhtp_request_t *req, void *arg)
{
    struct sim *s = sim_rank_of(arg)->sim;
    s->abort_calls++;
    size_t len;
    const char *body = sim_body_of(req, &len);
    cJSON *o = cJSON_ParseWithLength(body, len);
    const cJSON *rid = cJSON_GetObjectItemCaseSensitive(o, "rid");
    if (!cJSON_IsString(rid)) {
        cJSON_Delete(o);
        xpyd_reply_error(req, 400, "abort_request needs a string 'rid'");
        return;
    }
    int n = 0;
    struct sreq *r, *next;
    for (r = LIST_FIRST(&s->all); r; r = next) {
        next = LIST_NEXT(r, all);
        if (r->state != SREQ_DONE && strcmp(r->id, rid->valuestring) == 0) {
            char msg[300];
            snprintf(msg, sizeof msg, "request %.200s was aborted (abort_request)", r->id);
            r->aborted = 1;
            s->aborts_requested++;
            sim_sreq_fail(r, 400, msg);
            n++;
        }
    }
    cJSON_Delete(o);
    char out[64];
    int k = snprintf(out, sizeof out, "{\"aborted\":%d}", n);
    xpyd_reply(req, 200, "application/json", out, (size_t)k);
}

/* GET /query (vLLM MooncakeConnector's bootstrap server): {"<dp rank>": {"engine_id": "..."}, ...}. */
static void on_query(evhtp_request_t *req, void *arg)
{
    struct sim *s = sim_rank_of(arg)->sim;
    if (!xpyd_method_allowed(req, "GET"))
        return;
    cJSON *o = XPYD_XALLOC(cJSON_CreateObject());
    for (int i = 0; i < s->nranks; i++) {
        char k[16];
        snprintf(k, sizeof k, "%d", i);
        cJSON *e = XPYD_XALLOC(cJSON_AddObjectToObject(o, k));
        cJSON_AddStringToObject(e, "engine_id", s->ranks[i].engine_id);
    }
    char *txt = XPYD_XALLOC(cJSON_PrintUnformatted(o));
    cJSON_Delete(o);
    xpyd_reply(req, 200, "application/json", txt, strlen(txt));
    free(txt);
}

static void on_not_found(evhtp_request_t *req, void *arg)
{
    xpyd_reply_error(req, 404, "Not Found");
}

/* ---------- setup ---------- */

static void on_sweep(evutil_socket_t fd, short ev, void *arg)
{
    struct sim *s = arg;
    size_t n = sim_lease_expire(&s->leases, xpyd_now_us());
    if (n) {
        s->leases_expired += n;
        XLOG_WARN("msg=\"KV leases expired unpulled\" count=%zu", n);
    }
}

static void on_deregistered(void *arg)
{
    struct sim *s = arg;
    event_base_loopexit(s->base, NULL);
}

/* SIGINT/SIGTERM: leave etcd first (--register), then stop; a second signal stops at once. */
static void on_signal(evutil_socket_t sig, short ev, void *arg)
{
    struct sim *s = arg;
    static int once;
    if (s->reg && !once++) {
        xreg_stop(s->reg, 2000, on_deregistered, s);
        return;
    }
    event_base_loopexit(s->base, NULL);
}

/* --register: the value routers read (the admin API's fields) and the health-gated registration. */
static int start_register(struct sim *s)
{
    const struct sim_config *c = &s->cfg;
    cJSON *v = XPYD_XALLOC(cJSON_CreateObject());
    cJSON_AddNumberToObject(v, "dp", c->dp_size);
    cJSON_AddNumberToObject(v, "max_model_len", (double)c->max_model_len);
    cJSON_AddNumberToObject(v, "max_inflight", (double)c->max_batch);
    if (c->bootstrap_port > 0)
        cJSON_AddNumberToObject(v, "bootstrap_port", c->bootstrap_port);
    if (s->tls_server)
        cJSON_AddBoolToObject(v, "tls", 1);
    char *value = XPYD_XALLOC(cJSON_PrintUnformatted(v));
    cJSON_Delete(v);
    const char *host = c->register_host[0] ? c->register_host : c->host;
    int roles = c->role == SIM_ROLE_PREFILL ? 1 : c->role == SIM_ROLE_DECODE ? 2 : 3;
    struct xreg_opts o = {c->register_url, roles, host, c->port, value, c->register_ttl_s, 2000,
                          c->host, c->port, s->tls_server != NULL, "/health", 500, 1000, 2};
    char err[600];
    s->reg = xreg_start(s->base, &o, s->tls_client, err, sizeof err);
    free(value);
    if (!s->reg) {
        XLOG_ERR("msg=\"--register\" reason=\"%s\"", err);
        return -1;
    }
    return 0;
}

static evhtp_res on_accept(evhtp_connection_t *c, void *arg)
{
    xpyd_tcp_nodelay(c->sock);
    return EVHTP_RES_OK;
}

enum srv_kind {
    SRV_FULL = 0, /* the OpenAI server, also serving KV pulls and /query (no bootstrap listener) */
    SRV_KV_ONLY,  /* the bootstrap listener: KV pulls and /query only */
    SRV_NO_KV     /* the OpenAI server next to a bootstrap listener: no KV routes, as a real engine's */
};

/* A listener for rank rk on port (0: any free one, written to *bound). */
static evhtp_t *make_server(struct sim *s, struct sim_rank *rk, int port, enum srv_kind kind, int *bound)
{
    evhtp_t *h = evhtp_new(s->base, rk);
    if (!h)
        return NULL;
    h->ssl_ctx = s->tls_server; /* NULL: plain HTTP */
    if (h->ssl_ctx)
        SSL_CTX_up_ref(h->ssl_ctx); /* evhtp_free frees its listener's context: each listener holds a reference */
    evhtp_set_max_body_size(h, (uint64_t)s->cfg.max_body_bytes);
    evhtp_set_post_accept_cb(h, on_accept, NULL);
    if (kind != SRV_NO_KV) {
        evhtp_set_cb(h, "/kv/pull", on_kv_pull, rk);
        evhtp_set_cb(h, "/kv/release", on_kv_release, rk);
        evhtp_set_cb(h, "/query", on_query, rk);
    }
    if (kind != SRV_KV_ONLY) {
        evhtp_set_cb(h, "/v1/completions", on_completions, rk);
        evhtp_set_cb(h, "/v1/chat/completions", on_chat, rk);
        evhtp_set_cb(h, "/v1/models", on_models, rk);
        evhtp_set_cb(h, "/health", on_health, rk);
        evhtp_set_cb(h, "/metrics", sim_on_metrics, rk);
        evhtp_set_cb(h, "/tokenize", on_tokenize, rk);
        evhtp_set_cb(h, "/abort_request", on_abort, rk);
        evhtp_set_cb(h, "/reset_prefix_cache", on_reset_prefix_cache, rk);
    }
    evhtp_set_gencb(h, on_not_found, rk);
    char addr[300];
    if (strchr(s->cfg.host, ':'))
        snprintf(addr, sizeof addr, "ipv6:%s", s->cfg.host);
    else
        snprintf(addr, sizeof addr, "%s", s->cfg.host);
    if (evhtp_bind_socket(h, addr, (uint16_t)port, 4096) != 0) {
        XLOG_ERR("msg=\"cannot listen\" host=%s port=%d errno=%d", s->cfg.host, port, errno);
        evhtp_free(h);
        return NULL;
    }
    *bound = port;
    if (port == 0) { /* ephemeral: learn what the kernel gave us */
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        getsockname(evconnlistener_get_fd(h->server), (struct sockaddr *)&ss, &sl);
        *bound = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                : ((struct sockaddr_in *)&ss)->sin_port);
    }
    return h;
}

const char *sim_role_name(int role)
{
    return role == SIM_ROLE_PREFILL ? "prefill" : role == SIM_ROLE_DECODE ? "decode" : "both";
}

const char *const sim_handoff_names[] = {"kv-params", "store", "bootstrap", "none", "xpyd", "mooncake", NULL};

const char *sim_handoff_name(int h)
{
    return h >= 0 && h < SIM_NHANDOFFS ? sim_handoff_names[h] : "?";
}

int sim_run(const struct sim_config *cfg)
{
    struct sim *s = XPYD_XALLOC(calloc(1, sizeof *s));
    int rc = 1;
    s->cfg = *cfg;
    xpyd_log_level = cfg->log_level;
    s->rng = xpyd_mix64(cfg->seed ^ 0xabcdefu ^ (uint64_t)cfg->port);
    LIST_INIT(&s->all);
    sim_json_escape_into(cfg->model, s->model_json, sizeof s->model_json);
    signal(SIGPIPE, SIG_IGN);
    xpyd_raise_nofile();
    if (cfg->handoff == SIM_HANDOFF_STORE && mkdir(cfg->store_dir, 0755) != 0 && errno != EEXIST) {
        XLOG_ERR("msg=\"cannot create store dir\" dir=%s errno=%d", cfg->store_dir, errno);
        free(s);
        return 1;
    }
    struct event_config *ec = event_config_new();
    event_config_require_features(ec, EV_FEATURE_EARLY_CLOSE);
    event_config_set_flag(ec, EVENT_BASE_FLAG_PRECISE_TIMER); /* sub-millisecond token timing */
    s->base = event_base_new_with_config(ec);
    event_config_free(ec);
    if (!s->base) {
        s->base = event_base_new(); /* no early-close: disconnects are noticed on the next write */
        XLOG_WARN("msg=\"event backend without early close detection\"");
    }
    s->peers = XPYD_XALLOC(calloc(SIM_MAX_PEERS, sizeof *s->peers));
    s->up = up_thread_new_shared(s->base, s->peers, SIM_MAX_PEERS, 16);
    if (!s->up)
        abort();
    char terr[600];
    int minv = cfg->tls_min_version ? TLS1_3_VERSION : TLS1_2_VERSION;
    if (cfg->tls_cert[0]) {
        struct xpyd_tls_server_opts so = {cfg->tls_cert, cfg->tls_key, cfg->tls_client_ca, minv};
        if (!(s->tls_server = xpyd_tls_server_new(&so, terr, sizeof terr))) {
            XLOG_ERR("msg=\"TLS\" reason=\"%s\"", terr);
            rc = 2;
            goto out;
        }
    }
    if (cfg->upstream_ca[0]) {
        struct xpyd_tls_client_opts co = {cfg->upstream_ca, cfg->upstream_cert, cfg->upstream_key, minv};
        if (!(s->tls_client = xpyd_tls_client_new(&co, terr, sizeof terr))) {
            XLOG_ERR("msg=\"TLS to peers\" reason=\"%s\"", terr);
            rc = 2;
            goto out;
        }
        up_thread_set_tls(s->up, s->tls_client);
    }
    s->nranks = cfg->dp_size;
    s->ranks = XPYD_XALLOC(calloc((size_t)s->nranks, sizeof *s->ranks));
    for (int r = 0; cfg->prefix_caching && r < s->nranks; r++)
        s->ranks[r].pool = XPYD_XALLOC(sim_pool_new((size_t)cfg->num_gpu_blocks, (size_t)cfg->block_size));
    if (sim_kvpub_start(s) != 0) {
        rc = 2;
        goto out;
    }
    if (cfg->startup_delay_ms > 0) /* (vLLM's engine core, its KV-event publisher with it, is up before its API) */
        usleep((useconds_t)cfg->startup_delay_ms * 1000u);
    uint64_t nonce = xpyd_mix64(xpyd_now_us() ^ (uint64_t)getpid());
    /* The bootstrap server (SGLang's, vLLM MooncakeConnector's /query) is a listener of its own, as in the real
     * engines: by default in the modes that have one, on a free port (the port file's second line); the HTTP
     * port then serves no KV route, so a router that sends pulls to the wrong port fails in the tests. */
    int want_boot = cfg->bootstrap_port;
    if (want_boot < 0)
        want_boot = cfg->role != SIM_ROLE_DECODE &&
                            (cfg->handoff == SIM_HANDOFF_BOOTSTRAP || cfg->handoff == SIM_HANDOFF_MOONCAKE) ? 0 : -1;
    s->cfg.bootstrap_port = 0;
    for (int i = 0; i < s->nranks; i++) {
        struct sim_rank *rk = &s->ranks[i];
        rk->sim = s;
        rk->idx = i;
        TAILQ_INIT(&rk->waiting);
        int port = cfg->dp_internal ? cfg->port : cfg->port + i;
        snprintf(rk->engine_id, sizeof rk->engine_id, "xpyd-sim-%d-dp%d-%08" PRIx64, port, i, nonce & 0xffffffffu);
        if (!cfg->dp_internal || i == 0) {
            int bound;
            rk->htp = make_server(s, rk, port, want_boot >= 0 ? SRV_NO_KV : SRV_FULL, &bound);
            if (!rk->htp)
                goto out;
            if (port == 0)
                s->cfg.port = bound;
        }
        rk->port = (cfg->dp_internal || port == 0) ? s->cfg.port : port;
    }
    if (want_boot >= 0 && (cfg->dp_internal || s->nranks == 1)) {
        s->bootstrap_htp = make_server(s, &s->ranks[0], want_boot, SRV_KV_ONLY, &s->cfg.bootstrap_port);
        if (!s->bootstrap_htp)
            goto out;
    } else if (want_boot >= 0) { /* external DP: rank i's own bootstrap server on the base port + i */
        for (int i = 0; i < s->nranks; i++) {
            int bound = 0, want = i ? s->cfg.bootstrap_port + i : want_boot;
            s->ranks[i].boot_htp = make_server(s, &s->ranks[i], want, SRV_KV_ONLY, &bound);
            if (!s->ranks[i].boot_htp)
                goto out;
            if (i == 0)
                s->cfg.bootstrap_port = bound;
        }
    }
    if (cfg->handoff == SIM_HANDOFF_XPYD) {
        char name[64];
        snprintf(name, sizeof name, "xpyd-sim-%d", s->cfg.port);
        struct xt_config xc = {.name = name, .listen_host = cfg->host, .transport = "auto", .threads = 2,
                               .io_timeout_ms = (int)(cfg->handoff_timeout_ms > 0 ? cfg->handoff_timeout_ms : 10000)};
        int xrc = xt_engine_create(&xc, &s->xt);
        if (xrc) {
            XLOG_ERR("msg=\"cannot start the transfer engine\" error=\"%s\"", strerror(-xrc));
            goto out;
        }
        s->leases.on_drop = sim_lease_unregister;
        s->leases.on_drop_arg = s;
        s->xt_ev = event_new(s->base, xt_engine_event_fd(s->xt), EV_READ | EV_PERSIST, sim_xt_on_event, s);
        event_add(s->xt_ev, NULL);
    }
    s->sweep_ev = event_new(s->base, -1, EV_PERSIST, on_sweep, s);
    struct timeval sweep = {0, 50000};
    event_add(s->sweep_ev, &sweep);
    s->sig_int = evsignal_new(s->base, SIGINT, on_signal, s);
    s->sig_term = evsignal_new(s->base, SIGTERM, on_signal, s);
    event_add(s->sig_int, NULL);
    event_add(s->sig_term, NULL);
    if (cfg->port_file[0]) {
        char tmp[600];
        snprintf(tmp, sizeof tmp, "%s.tmp", cfg->port_file);
        FILE *pf = fopen(tmp, "w");
        int ok = pf && fprintf(pf, "%d\n", s->cfg.port) > 0;
        if (ok && s->cfg.bootstrap_port)
            ok = fprintf(pf, "%d\n", s->cfg.bootstrap_port) > 0;
        if (!pf || !ok || fclose(pf) != 0 || rename(tmp, cfg->port_file) != 0) {
            XLOG_ERR("msg=\"cannot write port file\" path=%s", cfg->port_file);
            goto out;
        }
    }
    if (cfg->register_url[0] && start_register(s) != 0)
        goto out;
    XLOG_INFO("msg=\"xpyd_sim ready\" role=%s host=%s port=%d bootstrap_port=%d dp=%d dp_mode=%s handoff=%s model=%s",
              sim_role_name(cfg->role), cfg->host, s->cfg.port, s->cfg.bootstrap_port, cfg->dp_size,
              cfg->dp_internal ? "internal" : "external", sim_handoff_name(cfg->handoff), cfg->model);
    fflush(stderr);
    event_base_dispatch(s->base);
    rc = 0;
out:
    for (int i = 0; i < s->nranks; i++)
        if (s->ranks[i].htp) {
            evhtp_unbind_socket(s->ranks[i].htp);
            evhtp_free(s->ranks[i].htp);
        }
    for (int i = 0; s->ranks && i < s->nranks; i++)
        if (s->ranks[i].boot_htp) {
            evhtp_unbind_socket(s->ranks[i].boot_htp);
            evhtp_free(s->ranks[i].boot_htp);
        }
    if (s->bootstrap_htp) {
        evhtp_unbind_socket(s->bootstrap_htp);
        evhtp_free(s->bootstrap_htp);
    }
    xreg_free(s->reg);
    if (s->sweep_ev)
        event_free(s->sweep_ev);
    if (s->sig_int)
        event_free(s->sig_int);
    if (s->sig_term)
        event_free(s->sig_term);
    if (s->xt_ev)
        event_free(s->xt_ev);
    sim_lease_clear(&s->leases);
    if (s->xt)
        xt_engine_destroy(s->xt); /* reads still in flight end with it; their buffers go below */
    for (struct xpull *xp = s->pulls, *next; xp; xp = next) {
        next = xp->next;
        free(xp->buf);
        free(xp);
    }
    up_thread_free(s->up);
    SSL_CTX_free(s->tls_client); /* after the connections that used it */
    SSL_CTX_free(s->tls_server); /* ours; the listeners freed theirs, open connections keep their own */
    free(s->peers);
    XLOG_INFO("msg=\"xpyd_sim stopped\" port=%d", s->cfg.port);
    /* Connections still open are reclaimed by the OS at exit; evhtp has no safe bulk close for them. */
    sim_kvpub_stop(s);
    for (int r = 0; s->ranks && r < s->nranks; r++)
        sim_pool_free(s->ranks[r].pool);
    free(s->ranks);
    /* A start that failed (a port in use, a bad certificate) had no connection yet: its base goes too. After a
     * run, connections still open hang on the base (evhtp has no safe bulk close), so it stays with the process,
     * which exits next, and they stay reachable through it. */
    if (rc != 0)
        event_base_free(s->base);
    free(s);
    return rc;
}

