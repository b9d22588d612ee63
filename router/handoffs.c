/* SPDX-License-Identifier: Apache-2.0 */
/* handoffs.c - the handoff modes' request flows, one per row of handoff_traits.c, and the check of a
 * configuration against the chosen mode's traits. Adding a mode is its file (handoff_<name>.c), its row of
 * traits (handoff_traits.c) and its entry here. */
#include "handoff.h"
#include "router.h"

#include <stdio.h>
#include <string.h>

static const struct handoff_ops *const modes[RT_HO_COUNT] = {
    [RT_HO_KV_PARAMS] = &handoff_kv_params, [RT_HO_STORE] = &handoff_store, [RT_HO_BOOTSTRAP] = &handoff_bootstrap,
    [RT_HO_NONE] = &handoff_none,           [RT_HO_XPYD] = &handoff_xpyd,   [RT_HO_MOONCAKE] = &handoff_mooncake};

const struct handoff_ops *rt_handoff_resolve(const struct rt_config *c)
{
    const struct handoff_ops *ho = c->handoff >= 0 && c->handoff < RT_HO_COUNT ? modes[c->handoff] : NULL;
    if (!ho || ho->t != &rt_handoff_traits[c->handoff]) { /* a row of one table without its twin in the other */
        fprintf(stderr, "xpyd_router: internal error: handoff mode %d has no request flow\n", c->handoff);
        return NULL;
    }
    const struct handoff_traits *t = ho->t;
    if (t->needs_prefill && c->pools[RT_PREFILL].n == 0 && !c->discovery[0]) {
        fprintf(stderr, "xpyd_router: at least one prefill (-p) and one decode (-d) instance are required "
                        "(--handoff none needs only -d)\n");
        return NULL;
    }
    if (!t->needs_prefill && c->first_token == RT_FIRST_PREFILL) {
        fprintf(stderr, "xpyd_router: --first-token prefill needs a prefill leg (not --handoff %s)\n", t->name);
        return NULL;
    }
    if (c->repeat_d_times > 0 && !t->repeat_mode) {
        fprintf(stderr, "xpyd_router: --repeat-d-times needs --handoff store (kv-params leases, bootstrap rooms and "
                        "mooncake transfer ids are consumed by one decode; clones could not find the KV)\n");
        return NULL;
    }
    return ho;
}
