/* SPDX-License-Identifier: Apache-2.0 */
/* xb_p2c.c - power of two choices: two random eligible instances, the less loaded one wins. */
#include "xb_internal.h"

static int pick_p2c(struct xb_pool *p, uint64_t need_len, const int *exclude, int nexclude)
{
    int a = xb_pick_random_eligible(p, need_len, exclude, nexclude);
    int b = xb_pick_random_eligible(p, need_len, exclude, nexclude);
    if (a < 0 || b < 0)
        return a < 0 ? b : a;
    return xb_less_loaded(&p->inst[b], &p->inst[a]) ? b : a;
}

const struct xb_policy_ops xb_policy_p2c = {"p2c", pick_p2c};
