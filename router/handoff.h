/* SPDX-License-Identifier: Apache-2.0 */
/* handoff.h - what differs between the handoff modes (how a prefill hands its KV to a decode), one
 * `const struct handoff_ops` per mode in a file of its own (handoff_<mode>.c). The request core (request.c)
 * calls only these hooks and never tests the mode.
 *
 * Adding a mode: a new handoff_<name>.c defining `const struct handoff_ops handoff_<name>`, and its row in
 * the table of router/handoffs.c (`--handoff <name>` finds it there; what the mode needs of the configuration
 * is in its traits below). */
#ifndef XPYD_HANDOFF_H
#define XPYD_HANDOFF_H

#include "handoff_traits.h"

#include <stddef.h>

struct request;
struct rt_config;

struct handoff_ops {
    const struct handoff_traits *t; /* its row of handoff_traits.c: name and traits */
    /* The first attempt; also what a failed prefill attempt restarts. */
    void (*start)(struct request *r);
    /* The sequential flow's bodies (req_start_prefill / req_start_decode); NULL where the mode has its own. */
    char *(*prefill_body)(struct request *r, size_t *len);
    char *(*decode_body)(struct request *r, size_t *len);
    /* What a failed decode attempt restarts (after its backoff). */
    void (*decode_retry)(struct request *r);
    /* The request ends with an error while the prefill holds KV that no decode took; decode_in_flight: a
     * decode leg was still in flight (finish_decode_write already lets it see the request). NULL: nothing. */
    void (*abandon)(struct request *r, int decode_in_flight);
    /* The decode produced its first token (benchmark repeat mode starts its clones). NULL: nothing. */
    void (*first_token)(struct request *r);
    /* On an ending after the prefill answered, the decode leg is finished being written, then closed
     * (dispatch-and-cancel), so the engine sees the request and frees the prefill's KV. */
    int finish_decode_write;
};

extern const struct handoff_ops handoff_kv_params, handoff_store, handoff_bootstrap, handoff_none, handoff_xpyd,
    handoff_mooncake;

/* handoff_kv_params.c: the kv-params flow's bodies, which --handoff xpyd shares */
char *kv_prefill_body(struct request *r, size_t *len);
char *kv_decode_body(struct request *r, size_t *len);

/* handoffs.c: the mode named c->handoff, checked against the rest of the configuration; NULL after printing
 * why (an unknown name, a missing prefill pool, a setting the mode cannot take). */
const struct handoff_ops *rt_handoff_resolve(const struct rt_config *c);

#endif
