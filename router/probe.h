/* probe.h - background checks of every engine endpoint, run on the router's main event loop: active health
 * checks with hysteresis (GET /health) and, optionally, engine load feedback (GET /metrics). */
#ifndef XPYD_PROBE_H
#define XPYD_PROBE_H

#include <stddef.h>

struct event_base;
struct probe;

/* Starts the periodic checks configured in g_rt->cfg (either may be off). NULL when both are off. */
struct probe *probe_start(struct event_base *base);
void probe_stop(struct probe *p);

/* Parses a Prometheus page for vLLM's load series. For engine label `engine` (or every engine when
 * engine < 0: sums waiting, takes the highest KV usage) sets *waiting and *kv_usage; returns how many
 * series matched. Exposed for unit tests. */
int probe_parse_engine_metrics(const char *page, size_t len, int engine, double *waiting, double *kv_usage);

#endif
