/* SPDX-License-Identifier: Apache-2.0 */
/* config_load.c - xpyd_router's configuration as it is loaded: the JSON file first (config_file.c), then the
 * command line over it (with the Python proxies' aliases), the environment's keys, the checks across settings,
 * and the pools expanded and checked (config_topology.c). The settings themselves are config.c's table. */
#include "config.h"
#include "kv_endpoint.h"
#include "config_internal.h"

#include "xb.h"
#include "xpyd_etcd.h"
#include "xpyd_util.h"
#include "xpyd_version.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Hosts and ports given as separate lists (the Python proxies' flags). */
struct alias_lists {
    char hosts[2][4096];
    char ports[2][1024];
};

static int apply_alias(struct rt_config *c, struct alias_lists *a, int role)
{
    if (!a->hosts[role][0]) {
        if (!a->ports[role][0])
            return 0;
        fprintf(stderr, "xpyd_router: --%s-ports needs --%s-hosts\n", role ? "decoder" : "prefiller",
                role ? "decoder" : "prefiller");
        return -1;
    }
    /* Pairing (decisions): as many ports as hosts pair in order; one port serves every host; one host with
     * several ports is that host on each port; hosts without ports, or any other mix, are an error, never a
     * default port or a drop. */
    const char *who = role ? "decoder" : "prefiller";
    char hb[4096], pb[1024], *hv[256], *pv[256];
    int nh = 0, np = 0;
    snprintf(hb, sizeof hb, "%s", a->hosts[role]);
    snprintf(pb, sizeof pb, "%s", a->ports[role]);
    char *sp = NULL;
    for (char *h = strtok_r(hb, ",", &sp); h; h = strtok_r(NULL, ",", &sp))
        if (nh < 256)
            hv[nh++] = h;
    for (char *p = strtok_r(pb, ",", &sp); p; p = strtok_r(NULL, ",", &sp))
        if (np < 256)
            pv[np++] = p;
    if (np > 1 && nh > 1 && np != nh) {
        fprintf(stderr, "xpyd_router: --%s-hosts lists %d hosts and --%s-ports %d ports: give one port, one host, "
                        "or as many ports as hosts\n", who, nh, who, np);
        return -1;
    }
    if (np == 0) {
        fprintf(stderr, "xpyd_router: --%s-hosts needs --%s-ports (the engines' ports: no default)\n", who, who);
        return -1;
    }
    int n = nh > np ? nh : np;
    for (int i = 0; i < n; i++) {
        long port = 0;
        if (xpyd_parse_long(pv[np == 1 ? 0 : i], 1, 65535, &port) != 0) {
            fprintf(stderr, "xpyd_router: bad --%s-ports value '%s'\n", who, pv[np == 1 ? 0 : i]);
            return -1;
        }
        struct rt_host *rh = rt_pool_add(&c->pools[role]);
        if (!rh)
            return -1;
        snprintf(rh->host, sizeof rh->host, "%s", hv[nh == 1 ? 0 : i]);
        rh->port = (int)port;
    }
    return 0;
}

static void append_list(char *dst, size_t cap, const char *v)
{
    size_t l = strlen(dst);
    snprintf(dst + l, cap - l, "%s%s", l ? "," : "", v);
}

int rt_config_load(struct rt_config *c, int argc, char **argv)
{
    if (rt_config_defaults(c) != 0)
        return -1;
    /* The JSON file first: the command line overrides it. */
    for (int i = 1; i < argc - 1; i++)
        if (strcmp(argv[i], "--config") == 0) {
            snprintf(c->config_path, sizeof c->config_path, "%s", argv[i + 1]);
            if (rt_config_load_file(c, argv[i + 1]) != 0)
                return -1;
        }
    struct alias_lists al;
    memset(&al, 0, sizeof al);
    int cli_pool[2] = {0, 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int role = -1;
        char *alias_dst = NULL;
        size_t alias_cap = 0;
        if (!strcmp(a, "-p") || !strcmp(a, "--prefill"))
            role = RT_PREFILL;
        else if (!strcmp(a, "-d") || !strcmp(a, "--decode"))
            role = RT_DECODE;
        else if (!strcmp(a, "--prefiller-hosts") || !strcmp(a, "--prefiller-host"))
            alias_dst = al.hosts[0], alias_cap = sizeof al.hosts[0];
        else if (!strcmp(a, "--decoder-hosts") || !strcmp(a, "--decoder-host"))
            alias_dst = al.hosts[1], alias_cap = sizeof al.hosts[1];
        else if (!strcmp(a, "--prefiller-ports") || !strcmp(a, "--prefiller-port"))
            alias_dst = al.ports[0], alias_cap = sizeof al.ports[0];
        else if (!strcmp(a, "--decoder-ports") || !strcmp(a, "--decoder-port"))
            alias_dst = al.ports[1], alias_cap = sizeof al.ports[1];
        if (role >= 0 || alias_dst) {
            int got = 0;
            while (i + 1 < argc && argv[i + 1][0] != '-') {
                i++;
                got++;
                if (role >= 0) {
                    if (!cli_pool[role]) { /* the command line replaces the file's hosts */
                        c->pools[role].n = 0;
                        cli_pool[role] = 1;
                    }
                    if (rt_pool_add_list(&c->pools[role], argv[i], role ? "decode" : "prefill"))
                        return -1;
                } else {
                    append_list(alias_dst, alias_cap, argv[i]);
                }
            }
            if (!got) {
                fprintf(stderr, "xpyd_router: %s needs at least one value\n", a);
                return -1;
            }
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            rt_config_usage(stdout);
            return 1;
        }
        if (!strcmp(a, "--version")) {
            xpyd_print_version("xpyd_router");
            return 1;
        }
        if (!strcmp(a, "--config-reference")) {
            rt_config_reference(stdout); /* docs/CONFIGURATION.md (target config-doc) */
            return 1;
        }
        if (!strcmp(a, "--dry-run")) {
            c->dry_run = 1;
            continue;
        }
        if (!strcmp(a, "--generator_on_p_node")) {
            c->first_token = RT_FIRST_PREFILL;
            continue;
        }
        if (i + 1 >= argc || strncmp(a, "--", 2) != 0) {
            fprintf(stderr, "xpyd_router: unknown or incomplete option '%s' (see --help)\n", a);
            return -1;
        }
        const char *v = argv[++i];
        long lv;
        if (!strcmp(a, "--config"))
            continue;
        if (!strcmp(a, "--prefill-dp") || !strcmp(a, "--decode-dp") || !strcmp(a, "--prefill-tp") ||
            !strcmp(a, "--decode-tp")) {
            if (xpyd_parse_long(v, 1, 1024, &lv) != 0) {
                fprintf(stderr, "xpyd_router: %s needs an integer in [1, 1024]\n", a);
                return -1;
            }
            struct rt_pool_cfg *p = &c->pools[a[2] == 'd' ? RT_DECODE : RT_PREFILL];
            if (strstr(a, "-dp"))
                p->dp = (int)lv;
            else
                p->tp = (int)lv;
            continue;
        }
        if (!strcmp(a, "--prefill-policy") || !strcmp(a, "--decode-policy")) {
            int pol = xb_policy_parse(v);
            if (pol < 0) {
                fprintf(stderr, "xpyd_router: %s: unknown policy '%s' (%s)\n", a, v, rt_policy_choices());
                return -1;
            }
            c->pools[a[2] == 'd' ? RT_DECODE : RT_PREFILL].policy = pol;
            continue;
        }
        if (!strcmp(a, "--prefill-max-inflight") || !strcmp(a, "--decode-max-inflight")) {
            if (xpyd_parse_long(v, 0, 1000000, &lv) != 0) {
                fprintf(stderr, "xpyd_router: %s needs an integer in [0, 1000000]\n", a);
                return -1;
            }
            c->pools[a[2] == 'd' ? RT_DECODE : RT_PREFILL].max_inflight = (int)lv;
            continue;
        }
        if (!strcmp(a, "--prefill-bootstrap-port")) {
            if (xpyd_parse_long(v, 1, 65535, &lv) != 0) {
                fprintf(stderr, "xpyd_router: --prefill-bootstrap-port needs a port\n");
                return -1;
            }
            c->prefill_bootstrap_port = (int)lv;
            continue;
        }
        const char *name = a + 2;
        if (!strcmp(name, "repeat_d_times"))
            name = "repeat-d-times";
        if (!rt_config_has_setting(name)) {
            fprintf(stderr, "xpyd_router: unknown option '%s' (see --help)\n", a);
            return -1;
        }
        if (rt_config_set_named(c, name, v) != 0)
            return -1;
    }
    for (int r = 0; r < 2; r++)
        if (apply_alias(c, &al, r) != 0)
            return -1;
    xpyd_log_level = c->log_level;
    const char *envkey = getenv("XPYD_API_KEY");
    if (!c->api_key[0] && envkey && *envkey)
        snprintf(c->api_key, sizeof c->api_key, "%s", envkey);
    const char *envadmin = getenv("XPYD_ADMIN_KEY");
    if (!c->admin_key[0] && envadmin && *envadmin)
        snprintf(c->admin_key, sizeof c->admin_key, "%s", envadmin);
    const char *envmd = getenv("XPYD_METADATA_WRITE_KEY");
    if (!c->metadata_write_key[0] && envmd && *envmd)
        snprintf(c->metadata_write_key, sizeof c->metadata_write_key, "%s", envmd);
    if (!c->tls_cert[0] != !c->tls_key[0] || (c->tls_client_ca[0] && !c->tls_cert[0]) ||
        (c->upstream_cert[0] && !c->upstream_key[0])) {
        fprintf(stderr, "xpyd_router: --tls-cert and --tls-key go together (and --tls-client-ca needs them); "
                        "--upstream-cert needs --upstream-key\n");
        return -1;
    }
    if (c->session_key[0] && !((!strncmp(c->session_key, "header:", 7) && c->session_key[7]) ||
                               (!strncmp(c->session_key, "body:", 5) && c->session_key[5]))) {
        fprintf(stderr, "xpyd_router: --session-key must be header:NAME or body:FIELD, got '%s'\n", c->session_key);
        return -1;
    }
    if (c->metadata_backend == 1 && !c->discovery[0]) {
        fprintf(stderr, "xpyd_router: --metadata-backend etcd needs --discovery (the etcd cluster to use)\n");
        return -1;
    }
    if (c->discovery[0]) {
        struct etcd_url u;
        char why[600];
        if (etcd_url_parse(c->discovery, &u, why, sizeof why) != 0) {
            fprintf(stderr, "xpyd_router: --discovery %s\n", why);
            return -1;
        }
    }
    if (c->kv_events_bind[0] && rt_kv_endpoint_check(c->kv_events_bind) != 0) {
        fprintf(stderr, "xpyd_router: --kv-events-bind needs tcp://ADDR:PORT (e.g. tcp://10.0.0.9:5557), got '%s'\n",
                c->kv_events_bind);
        return -1;
    }
    if (c->kv_events_bind_replay_port > 0 && c->kv_events_bind_replay_port + c->kv_events_bind_ranks - 1 > 65535) {
        fprintf(stderr, "xpyd_router: --kv-events-bind-replay-port %ld + --kv-events-bind-ranks %ld passes port 65535\n",
                c->kv_events_bind_replay_port, c->kv_events_bind_ranks);
        return -1;
    }
    if (c->pools[RT_DECODE].n == 0 && !c->discovery[0]) { /* each handoff mode's other needs: router/handoffs.c */
        fprintf(stderr, "xpyd_router: at least one prefill (-p) and one decode (-d) instance are required "
                        "(--handoff none needs only -d)\n");
        return -1;
    }
    if (rt_config_expand(c) || rt_config_check_modes(c) || rt_config_check_topology(c))
        return -1;
    return 0;
}

