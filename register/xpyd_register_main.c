/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_register_main.c - xpyd_register: runs beside a real engine (vLLM, SGLang, ...) and keeps it registered in
 * etcd for xpyd routers started with --discovery while its health check passes (common/xpyd_register.c).
 * SIGTERM/SIGINT deregister at once; if this process dies the registration expires after --ttl-s. */
#include "xpyd_register.h"
#include "xpyd_settings.h"
#include "xpyd_tls.h"
#include "xpyd_util.h"
#include "xpyd_version.h"

#include <cjson/cJSON.h>
#include <event2/event.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct reg_config {
    char etcd[1024];
    int role;
    char engine[300], advertise[300];
    int tls;
    long dp, tp, weight, max_inflight, max_model_len, bootstrap_port;
    long ttl_s, etcd_timeout_ms;
    char health_path[200];
    long health_interval_ms, health_timeout_ms, health_fall;
    char ca[512], cert[512], key[512];
    int log_level;
};

static const char *const roles[] = {"prefill", "decode", "both", NULL};
static const char *const on_off[] = {"off", "on", NULL};
static const char *const log_levels[] = {"none", "error", "warn", "info", "debug", NULL};

#define F(m) XPYD_FIELD(struct reg_config, m)
static const struct xpyd_setting settings[] = {
    {"etcd", XS_STR, F(etcd), 0, 0, "", NULL,
     "`etcd://HOST:PORT[,HOST:PORT...]/PREFIX` (or `etcds://` for https): the cluster the routers watch (their "
     "`--discovery`)"},
    {"role", XS_ENUM, F(role), 0, 0, "decode", roles, "the pool the engine joins"},
    {"engine", XS_STR, F(engine), 0, 0, "", NULL, "the engine's HTTP address HOST:PORT (checked, and registered)"},
    {"advertise", XS_STR, F(advertise), 0, 0, "", NULL,
     "HOST:PORT routers should use, when not the one checked (e.g. another interface)"},
    {"tls", XS_ENUM, F(tls), 0, 0, "off", on_off, "the engine speaks https (routers connect with TLS)"},
    {"dp", XS_LONG, F(dp), 0, 1024, "0", NULL, "DP ranks (0: the routers' pool default)"},
    {"tp", XS_LONG, F(tp), 0, 1024, "0", NULL, "tensor-parallel size (0: the routers' pool default)"},
    {"weight", XS_LONG, F(weight), 0, 1000000, "0", NULL, "relative capacity (0: 1)"},
    {"max-inflight", XS_LONG, F(max_inflight), 0, 1000000, "0", NULL,
     "requests the engine runs at once (vLLM --max-num-seqs; 0: unknown)"},
    {"max-model-len", XS_LONG, F(max_model_len), 0, 1L << 30, "0", NULL, "context length (0: unknown)"},
    {"bootstrap-port", XS_LONG, F(bootstrap_port), 0, 65535, "0", NULL,
     "a prefill's bootstrap server port (SGLang, vLLM MooncakeConnector; 0: the routers' default)"},
    {"ttl-s", XS_LONG, F(ttl_s), 2, 3600, "5", NULL,
     "lease TTL: if this process dies, routers drop the engine this long after"},
    {"etcd-timeout-ms", XS_LONG, F(etcd_timeout_ms), 1, 600000, "2000", NULL,
     "one etcd call's deadline; on failure the next endpoint is tried"},
    {"health-path", XS_STR, F(health_path), 0, 0, "/health", NULL, "the engine's health check path (200 = healthy)"},
    {"health-interval-ms", XS_LONG, F(health_interval_ms), 10, 3600000, "1000", NULL, "time between checks"},
    {"health-timeout-ms", XS_LONG, F(health_timeout_ms), 1, 600000, "1000", NULL, "one check's deadline"},
    {"health-fall", XS_LONG, F(health_fall), 1, 100, "2", NULL,
     "failed checks in a row that deregister the engine (one good check registers it again)"},
    {"ca", XS_STR, F(ca), 0, 0, "", NULL, "CA file for https engines and etcds:// (default: the system store)"},
    {"cert", XS_STR, F(cert), 0, 0, "", NULL, "client certificate for mutual TLS (with `--key`)"},
    {"key", XS_STR, F(key), 0, 0, "", NULL, "its private key"},
    {"log-level", XS_ENUM, F(log_level), 0, 0, "info", log_levels, "none, error, warn, info, debug"},
};
#define NSETTINGS (sizeof settings / sizeof settings[0])

static void usage(FILE *f)
{
    fprintf(f, "Usage: xpyd_register --etcd etcd://HOST:PORT/PREFIX --role prefill|decode --engine HOST:PORT [options]\n"
               "Keeps an engine registered for xpyd routers (--discovery) while its health check passes.\n\n"
               "Options:\n");
    xpyd_settings_usage(f, settings, NSETTINGS);
    fprintf(f, "  --help, --version\n");
}

/* HOST:PORT (a port required) into its parts; 0 or -1. */
static int split_hostport(const char *s, char *host, size_t cap, int *port)
{
    *port = 0;
    return xpyd_parse_hostport(s, host, cap, port) == 0 && *port ? 0 : -1;
}

static void on_done(void *arg)
{
    event_base_loopexit(arg, NULL);
}

static struct xreg *g_reg;

static void on_signal(evutil_socket_t sig, short ev, void *arg)
{
    static int once;
    if (once++) {
        event_base_loopexit(arg, NULL);
        return;
    }
    xreg_stop(g_reg, 2000, on_done, arg);
}

int main(int argc, char **argv)
{
    struct reg_config c;
    memset(&c, 0, sizeof c);
    if (xpyd_settings_defaults(&c, settings, NSETTINGS, "xpyd_register") != 0)
        return 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--version")) {
            xpyd_print_version("xpyd_register");
            return 0;
        }
        const struct xpyd_setting *s = strncmp(a, "--", 2) ? NULL : xpyd_setting_find(settings, NSETTINGS, a + 2);
        if (!s || i + 1 >= argc) {
            fprintf(stderr, "xpyd_register: %s '%s' (see --help)\n", s ? "missing value for" : "unknown option", a);
            return 2;
        }
        if (xpyd_setting_set(&c, s, argv[++i], "xpyd_register") != 0)
            return 2;
    }
    xpyd_log_level = c.log_level;
    char host[256], ahost[256];
    int port, aport;
    if (!c.etcd[0] || !c.engine[0] || split_hostport(c.engine, host, sizeof host, &port) != 0) {
        fprintf(stderr, "xpyd_register: --etcd and --engine HOST:PORT are required (see --help)\n");
        return 2;
    }
    if (c.advertise[0] ? split_hostport(c.advertise, ahost, sizeof ahost, &aport) != 0
                       : (snprintf(ahost, sizeof ahost, "%s", host), aport = port, 0)) {
        fprintf(stderr, "xpyd_register: --advertise must be HOST:PORT\n");
        return 2;
    }
    if (!c.cert[0] != !c.key[0]) {
        fprintf(stderr, "xpyd_register: --cert and --key go together\n");
        return 2;
    }
    cJSON *v = cJSON_CreateObject();
    const struct { const char *name; long val; } fields[] = {
        {"dp", c.dp}, {"tp", c.tp}, {"weight", c.weight}, {"max_inflight", c.max_inflight},
        {"max_model_len", c.max_model_len}, {"bootstrap_port", c.bootstrap_port}};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (fields[i].val > 0)
            cJSON_AddNumberToObject(v, fields[i].name, (double)fields[i].val);
    if (c.tls)
        cJSON_AddBoolToObject(v, "tls", 1);
    char *value = cJSON_PrintUnformatted(v);
    cJSON_Delete(v);
    signal(SIGPIPE, SIG_IGN);
    struct event_base *base = event_base_new();
    char err[600];
    struct xpyd_tls_client_opts co = {c.ca, c.cert, c.key, TLS1_2_VERSION};
    SSL_CTX *tls = xpyd_tls_client_new(&co, err, sizeof err);
    if (!base || !value || !tls) {
        fprintf(stderr, "xpyd_register: %s\n", tls ? "out of memory" : err);
        return 1;
    }
    struct xreg_opts o = {c.etcd, c.role == 2 ? 3 : 1 << c.role, ahost, aport, value, c.ttl_s, c.etcd_timeout_ms,
                          host, port, c.tls, c.health_path, c.health_interval_ms, c.health_timeout_ms, c.health_fall};
    g_reg = xreg_start(base, &o, tls, err, sizeof err);
    if (!g_reg) {
        fprintf(stderr, "xpyd_register: %s\n", err);
        return 2;
    }
    struct event *si = evsignal_new(base, SIGINT, on_signal, base), *st = evsignal_new(base, SIGTERM, on_signal, base);
    event_add(si, NULL);
    event_add(st, NULL);
    xpyd_log_event(XPYD_LOG_INFO, "event=xpyd_register_start etcd=%s engine=%s role=%s value=%s", c.etcd, c.engine,
                   roles[c.role], value);
    event_base_dispatch(base);
    xreg_free(g_reg);
    event_free(si);
    event_free(st);
    event_base_free(base);
    SSL_CTX_free(tls);
    free(value);
    xpyd_log_event(XPYD_LOG_INFO, "event=xpyd_register_stopped");
    return 0;
}
