/* SPDX-License-Identifier: Apache-2.0 */
/* xb_rr.c - round robin over eligible instances. */
#include "xb_internal.h"

static int pick_rr(struct xb_pool *p, uint64_t need_len, const int *exclude, int nexclude)
{
    for (size_t k = 0; k < p->n; k++) {
        size_t i = (size_t)(p->rotor++ % p->n);
        if (xb_eligible(p, i, need_len, exclude, nexclude))
            return (int)i;
    }
    return -1;
}

const struct xb_policy_ops xb_policy_rr = {"rr", pick_rr};
