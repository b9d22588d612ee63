/* SPDX-License-Identifier: Apache-2.0 */
/* xb_random.c - uniform random choice among eligible instances (seeded, so deterministic). */
#include "xb_internal.h"

const struct xb_policy_ops xb_policy_random = {"random", xb_pick_random_eligible};
