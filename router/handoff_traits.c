/* SPDX-License-Identifier: Apache-2.0 */
/* handoff_traits.c - one row per handoff mode (see handoff_traits.h). A new mode: its row here, its name in
 * rt_handoff_names, its handoff_<name>.c (handoff.h) and its entry in handoffs.c. */
#include "handoff_traits.h"

const struct handoff_traits rt_handoff_traits[RT_HO_COUNT] = {
    [RT_HO_KV_PARAMS] = {.name = "kv-params", .needs_prefill = 1, .local_prefill = 1, .kv_on_prefill = 1},
    [RT_HO_STORE] = {.name = "store", .needs_prefill = 1, .local_prefill = 1, .repeat_mode = 1},
    [RT_HO_BOOTSTRAP] = {.name = "bootstrap", .needs_prefill = 1, .bootstrap_server = 1, .kv_on_prefill = 1},
    [RT_HO_NONE] = {.name = "none"},
    [RT_HO_XPYD] = {.name = "xpyd", .needs_prefill = 1, .local_prefill = 1, .kvxfer = 1, .kv_on_prefill = 1},
    [RT_HO_MOONCAKE] = {.name = "mooncake", .needs_prefill = 1, .query_prefill = 1, .bootstrap_server = 1,
                        .kv_on_prefill = 1},
};

const char *const rt_handoff_names[RT_HO_COUNT + 1] = {"kv-params", "store", "bootstrap", "none", "xpyd", "mooncake",
                                                       0};
