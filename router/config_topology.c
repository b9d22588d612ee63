/* SPDX-License-Identifier: Apache-2.0 */
/* config_topology.c - the pools' host lists expanded into DP ranks and endpoints, as each handoff mode places
 * them, and the checks of a topology that would route wrongly (a rank twice, an engine in both pools). */
#include "config.h"
#include "kv_endpoint.h"
#include "config_internal.h"

#include "handoff_traits.h"
#include "xpyd_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int rt_config_endpoint_index(struct rt_config *c, const char *host, int port)
{
    for (size_t i = 0; i < c->n_endpoints; i++)
        if (c->endpoints[i].port == port && strcmp(c->endpoints[i].host, host) == 0)
            return (int)i;
    c->endpoints = XPYD_XALLOC(realloc(c->endpoints, (c->n_endpoints + 1) * sizeof *c->endpoints));
    snprintf(c->endpoints[c->n_endpoints].host, sizeof c->endpoints[0].host, "%s", host);
    c->endpoints[c->n_endpoints].port = port;
    c->endpoints[c->n_endpoints].tls = 0;
    return (int)c->n_endpoints++;
}

int rt_learn_max_model_len(const struct rt_config *c)
{
    return c->learn_max_model_len == 1 || (c->learn_max_model_len == 0 && c->tokenizer[0]);
}

int rt_config_prefill_by_query(const struct rt_config *c)
{
    return rt_handoff_traits[c->handoff].query_prefill;
}

/* The modes that talk to a prefill's bootstrap server (SGLang's; vLLM MooncakeConnector's /query). */
int rt_config_uses_bootstrap(const struct rt_config *c)
{
    return rt_handoff_traits[c->handoff].bootstrap_server;
}

int rt_config_bootstrap_port(const struct rt_config *c, int bootstrap_port, int http_port)
{
    if (bootstrap_port > 0)
        return bootstrap_port;
    if (c->prefill_bootstrap_port > 0)
        return c->prefill_bootstrap_port;
    return rt_config_uses_bootstrap(c) ? RT_BOOTSTRAP_PORT : http_port;
}

int rt_config_ranks_by_header(const struct rt_config *c, int role)
{
    return c->dp_internal || (role == RT_PREFILL && rt_config_prefill_by_query(c));
}

static int expand_pool(struct rt_config *c, int role)
{
    struct rt_pool_cfg *p = &c->pools[role];
    int internal = rt_config_ranks_by_header(c, role);
    int maxdp = 0;
    for (size_t h = 0; h < p->n; h++) {
        int dp = p->hosts[h].dp > 0 ? p->hosts[h].dp : p->dp;
        if (dp < 1 || dp > 1024 || (!internal && p->hosts[h].port + dp - 1 > 65535)) {
            fprintf(stderr, "xpyd_router: %s host %s:%d: bad dp %d\n", role ? "decode" : "prefill",
                    p->hosts[h].host, p->hosts[h].port, dp);
            return -1;
        }
        maxdp = dp > maxdp ? dp : maxdp;
    }
    /* Rank i of every host before rank i+1 of any (port-major interleaving, as the Gaudi scripts do). */
    for (int i = 0; i < maxdp; i++) {
        for (size_t h = 0; h < p->n; h++) {
            const struct rt_host *rh = &p->hosts[h];
            int dp = rh->dp > 0 ? rh->dp : p->dp;
            if (i >= dp)
                continue;
            c->ranks[role] = XPYD_XALLOC(realloc(c->ranks[role], (c->n_ranks[role] + 1) * sizeof(struct rt_rank)));
            struct rt_rank *r = &c->ranks[role][c->n_ranks[role]++];
            memset(r, 0, sizeof *r);
            r->endpoint = rt_config_endpoint_index(c, rh->host, internal ? rh->port : rh->port + i);
            r->dp_rank = internal ? i : -1;
            r->tp = rh->tp > 0 ? rh->tp : p->tp;
            r->weight = rh->weight > 0 ? rh->weight : 1;
            r->max_model_len = rh->max_model_len;
            r->max_inflight = rh->max_inflight > 0 ? rh->max_inflight : p->max_inflight;
            /* external DP: rank i is a server of its own, its bootstrap server too, on the host's port + i (as
             * scripts/launch_engine.sh starts them, and SGLang expects) */
            r->bootstrap_port = role == RT_PREFILL
                                    ? rt_config_bootstrap_port(c, rh->bootstrap_port, rh->port) + (internal ? 0 : i)
                                    : 0;
            r->tls = rh->tls;
            c->endpoints[r->endpoint].tls |= rh->tls;
            /* KV events: rank i of a host publishes on its base port + i, as vLLM offsets a DP rank's endpoint */
            rt_kv_endpoint_for(rh->kv_events, rh->host, c->kv_events_port[role], i, r->kv_events, sizeof r->kv_events);
        }
    }
    return 0;
}

int rt_config_expand(struct rt_config *c)
{
    return expand_pool(c, RT_PREFILL) || expand_pool(c, RT_DECODE) ? -1 : 0;
}

/* The ranks host h of pool p stands for: ports [*lo, *hi] of its host (external DP: one port per rank; ranks by
 * header: its one port). */
static void host_ports(const struct rt_config *c, int role, const struct rt_host *h, int *lo, int *hi)
{
    const struct rt_pool_cfg *p = &c->pools[role];
    int dp = h->dp > 0 ? h->dp : p->dp;
    *lo = h->port;
    *hi = rt_config_ranks_by_header(c, role) ? h->port : h->port + dp - 1;
}

int rt_config_check_topology(const struct rt_config *c)
{
    for (int role = 0; role < 2; role++) {
        const struct rt_pool_cfg *p = &c->pools[role];
        const char *pool = role ? "decode" : "prefill";
        for (size_t a = 0; a < p->n; a++)
            for (size_t b = a + 1; b < p->n; b++) {
                const struct rt_host *x = &p->hosts[a], *y = &p->hosts[b];
                int xl, xh, yl, yh;
                host_ports(c, role, x, &xl, &xh);
                host_ports(c, role, y, &yl, &yh);
                if (strcmp(x->host, y->host) != 0 || xh < yl || yh < xl)
                    continue;
                char hx[300], hy[300];
                xpyd_hostport(x->host, x->port, hx, sizeof hx);
                xpyd_hostport(y->host, y->port, hy, sizeof hy);
                if (x->port == y->port)
                    fprintf(stderr, "xpyd_router: the %s pool lists %s twice (entries %zu and %zu): list each engine "
                                    "once\n", pool, hx, a + 1, b + 1);
                else
                    fprintf(stderr, "xpyd_router: %s hosts %s (ports %d-%d) and %s (ports %d-%d) overlap: with "
                                    "external DP a host's rank i is its port + i, so one engine would count twice\n",
                            pool, hx, xl, xh, hy, yl, yh);
                return -1;
            }
    }
    for (size_t i = 0; i < c->n_ranks[RT_PREFILL]; i++)
        for (size_t j = 0; j < c->n_ranks[RT_DECODE]; j++) {
            if (c->ranks[RT_PREFILL][i].endpoint != c->ranks[RT_DECODE][j].endpoint)
                continue;
            const struct rt_endpoint_cfg *e = &c->endpoints[c->ranks[RT_PREFILL][i].endpoint];
            char hp[300];
            xpyd_hostport(e->host, e->port, hp, sizeof hp);
            if (!c->allow_both_pools) {
                fprintf(stderr, "xpyd_router: %s is in both the prefill and the decode pool: both legs of a request "
                                "would go to one engine; if it serves both roles, --allow-engine-in-both-pools on\n",
                        hp);
                return -1;
            }
            fprintf(stderr, "xpyd_router: warning: %s is in both pools (--allow-engine-in-both-pools on)\n", hp);
            return 0;
        }
    return 0;
}
