/* handoffs.c - the handoff modes the router speaks, one row each, and the check of a configuration against the
 * chosen mode's traits. Adding a mode is its file (handoff_<name>.c) and its row here. */
#include "handoff.h"
#include "router.h"

#include <stdio.h>
#include <string.h>

static const struct handoff_ops *const modes[] = {&handoff_kv_params, &handoff_store, &handoff_bootstrap,
                                                  &handoff_none, &handoff_xpyd, &handoff_mooncake};
#define NMODES (sizeof modes / sizeof modes[0])

const struct handoff_ops *rt_handoff_resolve(const struct rt_config *c)
{
    const struct handoff_ops *ho = NULL;
    for (size_t i = 0; i < NMODES && !ho; i++)
        if (strcmp(modes[i]->name, c->handoff) == 0)
            ho = modes[i];
    if (!ho) {
        fprintf(stderr, "xpyd_router: --handoff: unknown value '%s' (", c->handoff);
        for (size_t i = 0; i < NMODES; i++)
            fprintf(stderr, "%s%s", i ? ", " : "", modes[i]->name);
        fprintf(stderr, ")\n");
        return NULL;
    }
    if (ho->query_prefill != rt_config_prefill_by_query(c)) { /* config.c expanded the pool for another mode */
        fprintf(stderr, "xpyd_router: internal error: --handoff %s and the configuration's pool expansion disagree\n",
                ho->name);
        return NULL;
    }
    if (ho->needs_prefill && c->pools[RT_PREFILL].n == 0 && !c->discovery[0]) {
        fprintf(stderr, "xpyd_router: at least one prefill (-p) and one decode (-d) instance are required "
                        "(--handoff none needs only -d)\n");
        return NULL;
    }
    if (!ho->needs_prefill && c->first_token == RT_FIRST_PREFILL) {
        fprintf(stderr, "xpyd_router: --first-token prefill needs a prefill leg (not --handoff %s)\n", ho->name);
        return NULL;
    }
    if (c->repeat_d_times > 0 && !ho->repeat_mode) {
        fprintf(stderr, "xpyd_router: --repeat-d-times needs --handoff store (kv-params leases, bootstrap rooms and "
                        "mooncake transfer ids are consumed by one decode; clones could not find the KV)\n");
        return NULL;
    }
    return ho;
}
