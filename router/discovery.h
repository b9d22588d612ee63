/* SPDX-License-Identifier: Apache-2.0 */
/* discovery.h - prefills that describe their own ranks (--handoff mooncake: GET /query on each prefill's
 * bootstrap server), polled on the router's main event loop; see discovery.c. */
#ifndef XPYD_DISCOVERY_H
#define XPYD_DISCOVERY_H

struct event_base;
struct discovery;

/* Starts the periodic queries when the handoff mode learns its prefill ranks; NULL otherwise. */
struct discovery *discovery_start(struct event_base *base);
void discovery_stop(struct discovery *d);

#endif
