/* SPDX-License-Identifier: Apache-2.0 */
/* probe.h - background checks of every engine endpoint, run on the router's main event loop: active health
 * checks with hysteresis (GET /health) and, optionally, engine load feedback (GET /metrics). */
#ifndef XPYD_PROBE_H
#define XPYD_PROBE_H

struct event_base;
struct probe;

/* Starts the periodic checks configured in g_rt->cfg (either may be off). NULL when both are off. */
struct probe *probe_start(struct event_base *base);
void probe_stop(struct probe *p);

#endif
