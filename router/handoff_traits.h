/* SPDX-License-Identifier: Apache-2.0 */
/* handoff_traits.h - what each handoff mode is, as data (pure: no router state): its name, what it needs of the
 * configuration and which settings apply to it. The configuration (config.c, config_check.c) reads only this
 * table; the request flow of each mode is its handoff_<name>.c (handoff.h), whose ops point at their row. */
#ifndef XPYD_HANDOFF_TRAITS_H
#define XPYD_HANDOFF_TRAITS_H

#include <stddef.h>

enum rt_handoff_mode { RT_HO_KV_PARAMS = 0, RT_HO_STORE, RT_HO_BOOTSTRAP, RT_HO_NONE, RT_HO_XPYD, RT_HO_MOONCAKE,
                       RT_HO_COUNT };

struct handoff_traits {
    const char *name;     /* --handoff <name> */
    int needs_prefill;    /* a prefill pool is required (and /health needs a usable prefill) */
    int repeat_mode;      /* --repeat-d-times may be used (the decode's KV can be read by many decodes) */
    int kvxfer;           /* the router runs its own transfer engine to release abandoned KV (kvxfer.c) */
    int local_prefill;    /* the decode can compute the prompt alone (its body without the prefill's handoff):
                           * --prefill-fallback, --local-prefill-*, --migration-prefill-min-tokens apply */
    int query_prefill;    /* prefill ranks and engine ids come from each prefill's GET /query (discovery.c): a
                           * prefill's DP ranks share its port, pinned by the rank header */
    int bootstrap_server; /* the engines meet through the prefill's bootstrap server (its port per host, or
                           * --prefill-bootstrap-port) */
    int kv_on_prefill;    /* the KV stays on the prefill that computed it until the decode pulls it: lost with
                           * that prefill (not so in store mode: the store holds it) */
};

extern const struct handoff_traits rt_handoff_traits[RT_HO_COUNT];
/* The names in table order, NULL-terminated: the choices of the --handoff setting. */
extern const char *const rt_handoff_names[RT_HO_COUNT + 1];

#endif
