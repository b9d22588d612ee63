/* SPDX-License-Identifier: Apache-2.0 */
/* handoff_xpyd.c - `--handoff xpyd`: the kv-params flow with the KV moved by libxpyd_transfer. The prefill's
 * `kv_transfer_params` name a transfer segment; when no decode took the KV, the router tells the prefill's
 * engine to release it directly (kvxfer.c), whatever the decode leg was doing. */
#include "handoff.h"
#include "request.h"

static void xpyd_abandon(struct request *r, int decode_in_flight)
{
    (void)decode_in_flight;
    rt_kvxfer_release(r->kv_params);
}

const struct handoff_ops handoff_xpyd = {
    .t = &rt_handoff_traits[RT_HO_XPYD],
    .start = req_start_prefill,
    .prefill_body = kv_prefill_body,
    .decode_body = kv_decode_body,
    .decode_retry = req_start_decode,
    .abandon = xpyd_abandon,
};
