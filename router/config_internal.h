/* SPDX-License-Identifier: Apache-2.0 */
/* config_internal.h - what the configuration's files share (config.c: settings and command line; config_file.c:
 * the JSON file and host lists; config_topology.c: ranks, endpoints and their checks). Not the router's API:
 * that is config.h. */
#ifndef XPYD_CONFIG_INTERNAL_H
#define XPYD_CONFIG_INTERNAL_H

#include "config.h"

#include <stdio.h>

/* config.c, the settings table: every setting at its default (and the pools' dp/tp 1); is name ('-' or '_') a
 * setting; set it from its text (0, or -1 with the reason printed); --help; the Markdown reference; the
 * settings only some handoff modes read, refused with another (0, or -1 printed). */
int rt_config_defaults(struct rt_config *c);
int rt_config_has_setting(const char *name);
int rt_config_set_named(struct rt_config *c, const char *name, const char *val);
void rt_config_usage(FILE *f);
void rt_config_reference(FILE *f);
int rt_config_check_modes(const struct rt_config *c);
/* The balancer's policies as "lot|p2c|...", from its table. */
const char *rt_policy_choices(void);

/* config_file.c */
int rt_config_load_file(struct rt_config *c, const char *path);
/* A new host of pool p (zeroed: port 0, none given), or NULL when out of memory. */
struct rt_host *rt_pool_add(struct rt_pool_cfg *p);
/* Adds each comma-separated [http(s)://]HOST:PORT of s; what names the pool in errors. 0 or -1 (printed). */
int rt_pool_add_list(struct rt_pool_cfg *p, const char *s, const char *what);

/* config_topology.c: both pools' hosts into ranks and endpoints (0, or -1 printed). */
int rt_config_expand(struct rt_config *c);
/* The mode talks to a prefill's bootstrap server (handoff_traits.h). */
int rt_config_uses_bootstrap(const struct rt_config *c);
/* After expansion: refuses a rank listed twice in a pool (the same host:port, or external DP port ranges that
 * overlap) and an engine in both pools (unless --allow-engine-in-both-pools: then a warning). 0 or -1 (printed). */
int rt_config_check_topology(const struct rt_config *c);

#endif
