/* SPDX-License-Identifier: Apache-2.0 */
/* xb_lot.c - least outstanding tokens: the eligible instance with the lowest load per unit of capacity.
 * The scan starts at a rotating offset, so equally loaded (e.g. idle) instances are filled in turn
 * instead of piling onto the first one. */
#include "xb_internal.h"

static int pick_lot(struct xb_pool *p, uint64_t need_len, const int *exclude, int nexclude)
{
    int best = -1;
    size_t start = p->n ? (size_t)(p->rotor++ % p->n) : 0;
    for (size_t k = 0; k < p->n; k++) {
        size_t i = (start + k) % p->n;
        if (!xb_eligible(p, i, need_len, exclude, nexclude))
            continue;
        if (best < 0 || xb_less_loaded(&p->inst[i], &p->inst[best]))
            best = (int)i;
    }
    return best;
}

const struct xb_policy_ops xb_policy_lot = {"lot", pick_lot};
