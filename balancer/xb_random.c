/* xb_random.c - uniform random choice among eligible instances (seeded, so deterministic). */
#include "xb_internal.h"

int xb_pick_random(struct xb_pool *p, uint64_t need_len, const int *exclude, int nexclude)
{
    size_t count = 0;
    for (size_t i = 0; i < p->n; i++)
        count += (size_t)xb_eligible(p, i, need_len, exclude, nexclude);
    if (count == 0)
        return -1;
    size_t want = (size_t)(xb_rand(p) % count);
    for (size_t i = 0; i < p->n; i++)
        if (xb_eligible(p, i, need_len, exclude, nexclude) && want-- == 0)
            return (int)i;
    return -1;
}
