/* SPDX-License-Identifier: Apache-2.0 */
/* metrics.c - the router's Prometheus page: counters, latency histograms, per-rank numbers. Updates are
 * atomics on the hot path; a scrape only reads them and never blocks request handling. */
#include "kv_sub.h"
#include "etcd_sync.h"
#include "router.h"
#include "tokenize.h"
#include "xpyd_reply.h"
#include "xpyd_util.h"
#include "xpyd_version.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <evhtp/evhtp.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

static const double bounds[RT_HIST_NB] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                          1,     2.5,    5,     10,   25,    50,   100, 240};
void rt_hist_observe(struct rt_hist *h, double seconds)
{
    if (!g_rt->cfg.metrics || seconds < 0)
        return;
    int i = 0;
    while (i < RT_HIST_NB && seconds > bounds[i])
        i++;
    if (i < RT_HIST_NB)
        atomic_fetch_add_explicit(&h->b[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, (int64_t)(seconds * 1e9), memory_order_relaxed);
}

static void hist_print(struct evbuffer *b, const char *n, const struct rt_hist *h)
{
    int64_t cum = 0, count = atomic_load(&h->count);
    for (int i = 0; i < RT_HIST_NB; i++) {
        cum += atomic_load(&h->b[i]);
        evbuffer_add_printf(b, "%s_bucket{le=\"%g\"} %" PRId64 "\n", n, bounds[i], cum);
    }
    /* count is read last; +Inf must not be below the last bucket even if observations raced the scrape */
    evbuffer_add_printf(b, "%s_bucket{le=\"+Inf\"} %" PRId64 "\n", n, count > cum ? count : cum);
    evbuffer_add_printf(b, "%s_sum %.9f\n%s_count %" PRId64 "\n", n, (double)atomic_load(&h->sum_ns) / 1e9, n,
                        count > cum ? count : cum);
}

/* The rows of metrics_table.h, with where each one's storage is. */
enum { L_NONE, L_ROLE, L_REASON, L_GUARD, L_STATUS, L_HIST, L_PD, L_SIDE, L_MSEC, L_OUTCOME, L_TOKFB };
struct metric_desc {
    const char *name, *type, *help;
    int labels;
    size_t off; /* in struct rt_counters */
};
#define RT_METRIC_DESC(field, name, type, labels, help) {name, #type, help, L_##labels, offsetof(struct rt_counters, field)},
static const struct metric_desc metrics[] = {RT_METRICS(RT_METRIC_DESC)};

static const char *const roles[2] = {"prefill", "decode"};

static void metric_print(struct evbuffer *b, const struct metric_desc *m, const char *base)
{
    const atomic_int_fast64_t *v = (const atomic_int_fast64_t *)(base + m->off);
    evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s %s\n", m->name, m->help, m->name, m->type);
    switch (m->labels) {
    case L_MSEC: /* kept in milliseconds, shown in seconds (Prometheus' base unit) */
        evbuffer_add_printf(b, "%s %.3f\n", m->name, (double)atomic_load(v) / 1000.0);
        break;
    case L_NONE:
        evbuffer_add_printf(b, "%s %" PRId64 "\n", m->name, (int64_t)atomic_load(v));
        break;
    case L_ROLE:
        for (int r = 0; r < 2; r++)
            evbuffer_add_printf(b, "%s{role=\"%s\"} %" PRId64 "\n", m->name, roles[r], (int64_t)atomic_load(&v[r]));
        break;
    case L_PD:
        for (int r = 0; r < 2; r++)
            evbuffer_add_printf(b, "%s{decision=\"%s\"} %" PRId64 "\n", m->name, r ? "local_prefill" : "remote_prefill",
                                (int64_t)atomic_load(&v[r]));
        break;
    case L_SIDE:
        for (int r = 0; r < 2; r++)
            evbuffer_add_printf(b, "%s{side=\"%s\"} %" PRId64 "\n", m->name, r ? "upstream" : "client",
                                (int64_t)atomic_load(&v[r]));
        break;
    case L_REASON:
        for (int f = 1; f < RF_COUNT; f++)
            evbuffer_add_printf(b, "%s{reason=\"%s\"} %" PRId64 "\n", m->name, rt_fail_table[f].name,
                                (int64_t)atomic_load(&v[f]));
        break;
    case L_TOKFB:
        for (int i = 0; i < RT_TF_COUNT; i++)
            evbuffer_add_printf(b, "%s{reason=\"%s\"} %" PRId64 "\n", m->name, rt_tok_fallback_names[i],
                                (int64_t)atomic_load(&v[i]));
        break;
    case L_GUARD:
        for (int i = 0; i < RT_CR_COUNT; i++)
            evbuffer_add_printf(b, "%s{reason=\"%s\"} %" PRId64 "\n", m->name, rt_client_reject_names[i],
                                (int64_t)atomic_load(&v[i]));
        break;
    case L_STATUS:
        for (int e = 0; e < RT_EP_COUNT; e++)
            for (int k = 100; k < 600; k++) {
                int64_t n = atomic_load(&v[e * 600 + k]);
                if (n || k == 200) /* 200 always present, so dashboards have a series from the start */
                    evbuffer_add_printf(b, "%s{endpoint=\"%s\",status=\"%d\"} %" PRId64 "\n", m->name,
                                        e ? "/v1/chat/completions" : "/v1/completions", k, n);
            }
        break;
    case L_OUTCOME:
        for (int e = 0; e < RT_EP_COUNT; e++)
            for (int o = 0; o < RT_OUT_COUNT; o++)
                evbuffer_add_printf(b, "%s{endpoint=\"%s\",outcome=\"%s\"} %" PRId64 "\n", m->name,
                                    e ? "/v1/chat/completions" : "/v1/completions", rt_outcome_names[o],
                                    (int64_t)atomic_load(&v[e * RT_OUT_COUNT + o]));
        break;
    case L_HIST:
        hist_print(b, m->name, (const struct rt_hist *)(base + m->off));
        break;
    }
}

/* Per rank (DP rank) series, from the balancer's numbers: one row each. */
static int64_t i_inflight(const struct xb_instance_stats *st, int role, size_t i) { return st->inflight; }
static int64_t i_outstanding(const struct xb_instance_stats *st, int role, size_t i) { return st->outstanding; }
static int64_t i_selected(const struct xb_instance_stats *st, int role, size_t i) { return (int64_t)st->selected; }
static int64_t i_healthy(const struct xb_instance_stats *st, int role, size_t i) { return st->healthy && st->ready && !st->ejected; }
static int64_t i_feedback(const struct xb_instance_stats *st, int role, size_t i) { return st->feedback; }
static int64_t i_ejections(const struct xb_instance_stats *st, int role, size_t i) { return (int64_t)st->ejections; }
static int64_t i_prefix_blocks(const struct xb_instance_stats *st, int role, size_t i) { return st->prefix_blocks; }
static int64_t i_prefix_capacity(const struct xb_instance_stats *st, int role, size_t i) { return st->prefix_capacity; }
static int64_t i_remote(const struct xb_instance_stats *st, int role, size_t i) { return st->remote; }

struct instance_metric {
    const char *name, *type, *help;
    int64_t (*value)(const struct xb_instance_stats *st, int role, size_t i);
};
static const struct instance_metric instance_metrics[] = {
    {"xpyd_instance_inflight_requests", "gauge", "Requests in flight on the rank.", i_inflight},
    {"xpyd_instance_outstanding_tokens", "gauge", "Tokens the router has outstanding on the rank (its load).",
     i_outstanding},
    {"xpyd_instance_selected_total", "counter", "Times the balancer picked the rank.", i_selected},
    {"xpyd_instance_healthy", "gauge", "1 while the rank may be picked (healthy, ready, not ejected).", i_healthy},
    {"xpyd_instance_feedback_tokens", "gauge", "Load the engine's own /metrics add (--scrape-interval-ms).",
     i_feedback},
    {"xpyd_instance_ejections_total", "counter", "Passive ejections of the rank.", i_ejections},
    {"xpyd_instance_prefix_blocks", "gauge", "Prefix blocks the router's index records on the rank (0: index off).",
     i_prefix_blocks},
    {"xpyd_instance_remote_tokens", "gauge",
     "Outstanding tokens the other router replicas publish for the rank (--discovery with --load-sync-ms).",
     i_remote},
    {"xpyd_instance_prefix_capacity_blocks", "gauge",
     "The rank's prefix-cache size in blocks as the index assumes it (--prefix-cache-blocks, or the engine's own "
     "num_gpu_blocks when scraped; 0: index off).", i_prefix_capacity},
};

/* Failed attempts per rank and cause (xpyd_instance_errors_total{cause}); ranks removed at runtime not listed. */
static void instance_errors_print(struct evbuffer *b)
{
    evbuffer_add_printf(b, "# HELP xpyd_instance_errors_total Failed attempts on the rank, by cause: connect (refused, "
                           "reset before an answer, TLS), timeout, status (5xx), broken_stream (cut or given up "
                           "mid-answer), bad_response (malformed, not JSON, too large).\n"
                           "# TYPE xpyd_instance_errors_total counter\n");
    for (int role = 0; role < 2; role++)
        for (size_t i = 0; i < g_rt->reg.n_ranks[role] && i < 4096; i++) {
            struct xb_instance_stats st;
            xb_stats(g_rt->pools[role], (int)i, &st);
            if (st.removed)
                continue;
            char hp[300];
            int dp = rt_rank_identity(role, (int)i, hp, sizeof hp);
            for (int k = 0; k < RT_CAUSE_COUNT; k++)
                evbuffer_add_printf(b, "xpyd_instance_errors_total{role=\"%s\",engine=\"%s\",dp_rank=\"%d\",cause=\"%s\"} "
                                       "%" PRId64 "\n", roles[role], hp, dp < 0 ? 0 : dp, rt_cause_names[k],
                                    (int64_t)atomic_load(&g_rt->ctr.instance_errors[role][i][k]));
        }
}

/* The standard process metrics (as Prometheus' client libraries export them) and the build. */
static void process_print(struct evbuffer *b)
{
    evbuffer_add_printf(b, "# HELP xpyd_build_info The router's version and the git revision it was built from.\n"
                           "# TYPE xpyd_build_info gauge\nxpyd_build_info{version=\"%s\",git_revision=\"%s\"} 1\n",
                        xpyd_version(), xpyd_git_revision());
    long tck = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
    unsigned long long ut = 0, st = 0, start = 0, vsize = 0, rss = 0, btime = 0;
    FILE *f = fopen("/proc/self/stat", "r");
    if (f) {
        char line[1024];
        if (fgets(line, sizeof line, f)) {
            const char *p = strrchr(line, ')'); /* past the command, which may hold spaces */
            if (p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d %*d %*d %llu "
                                   "%llu %llu", &ut, &st, &start, &vsize, &rss) != 5)
                ut = st = start = vsize = rss = 0;
        }
        fclose(f);
    }
    if ((f = fopen("/proc/stat", "r"))) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "btime %llu", &btime) == 1)
                break;
        fclose(f);
    }
    long fds = 0;
    DIR *d = opendir("/proc/self/fd");
    for (struct dirent *e; d && (e = readdir(d));)
        fds += e->d_name[0] != '.';
    if (d)
        closedir(d);
    fds -= d ? 1 : 0; /* the directory's own descriptor */
    struct rlimit rl = {0, 0};
    getrlimit(RLIMIT_NOFILE, &rl);
    evbuffer_add_printf(b,
                        "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"
                        "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total %.2f\n"
                        "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
                        "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes %llu\n"
                        "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
                        "# TYPE process_virtual_memory_bytes gauge\nprocess_virtual_memory_bytes %llu\n"
                        "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n"
                        "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds %.2f\n"
                        "# HELP process_open_fds Number of open file descriptors.\n"
                        "# TYPE process_open_fds gauge\nprocess_open_fds %ld\n"
                        "# HELP process_max_fds Maximum number of open file descriptors.\n"
                        "# TYPE process_max_fds gauge\nprocess_max_fds %llu\n",
                        tck > 0 ? (double)(ut + st) / (double)tck : 0.0, rss * (unsigned long long)(page > 0 ? page : 4096),
                        vsize, tck > 0 ? (double)btime + (double)start / (double)tck : 0.0, fds,
                        (unsigned long long)rl.rlim_cur);
}

void rt_metrics_handler(evhtp_request_t *req, void *arg)
{
    if (!xpyd_method_allowed(req, "GET, HEAD"))
        return;
    struct rt_counters *c = &g_rt->ctr;
    atomic_store(&c->metadata_keys, (int64_t)rt_metadata_count()); /* a gauge sampled when scraped */
    atomic_store(&c->discovery_sync_age_ms, esync_age_ms());
    atomic_store(&c->discovery_up, g_rt->cfg.discovery[0] ? esync_up() : 0);
    for (int role = 0; role < 2; role++)
        atomic_store(&c->prefix_index_bytes[role], (int64_t)xb_prefix_memory(g_rt->pools[role]));
    struct evbuffer *b = evbuffer_new();
    for (size_t i = 0; i < sizeof metrics / sizeof metrics[0]; i++)
        metric_print(b, &metrics[i], (const char *)c);
    for (size_t m = 0; m < sizeof instance_metrics / sizeof instance_metrics[0]; m++) {
        const struct instance_metric *im = &instance_metrics[m];
        evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s %s\n", im->name, im->help, im->name, im->type);
        for (int role = 0; role < 2; role++) {
            for (size_t i = 0; i < g_rt->reg.n_ranks[role]; i++) {
                struct xb_instance_stats st;
                xb_stats(g_rt->pools[role], (int)i, &st);
                if (st.removed)
                    continue;
                char hp[300];
                int dp = rt_rank_identity(role, (int)i, hp, sizeof hp);
                evbuffer_add_printf(b, "%s{role=\"%s\",engine=\"%s\",dp_rank=\"%d\"} %" PRId64 "\n", im->name,
                                    roles[role], hp, dp < 0 ? 0 : dp, im->value(&st, role, i));
            }
        }
    }
    evbuffer_add_printf(b, "# HELP xpyd_rank_slots Rank slots of each pool (--max-instances) by state: active, "
                           "draining (removed, requests still in flight), free (never used, or removed and idle: "
                           "the next engine to join takes it).\n# TYPE xpyd_rank_slots gauge\n");
    for (int role = 0; role < 2; role++) {
        long a, d, f;
        rt_registry_slots(role, &a, &d, &f);
        evbuffer_add_printf(b, "xpyd_rank_slots{role=\"%s\",state=\"active\"} %ld\n"
                               "xpyd_rank_slots{role=\"%s\",state=\"draining\"} %ld\n"
                               "xpyd_rank_slots{role=\"%s\",state=\"free\"} %ld\n",
                            roles[role], a, roles[role], d, roles[role], f);
    }
    long eu, ef;
    rt_registry_endpoint_slots(&eu, &ef);
    evbuffer_add_printf(b, "# HELP xpyd_endpoint_slots Endpoint (host:port) slots (2 x --max-instances): used by a "
                           "rank, or free.\n# TYPE xpyd_endpoint_slots gauge\n"
                           "xpyd_endpoint_slots{state=\"used\"} %ld\nxpyd_endpoint_slots{state=\"free\"} %ld\n",
                        eu, ef);
    instance_errors_print(b);
    rt_kv_metrics(b);
    process_print(b);
    xpyd_reply_buffer(req, 200, "text/plain; version=0.0.4; charset=utf-8", b);
    evbuffer_free(b);
}

