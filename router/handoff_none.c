/* SPDX-License-Identifier: Apache-2.0 */
/* handoff_none.c - `--handoff none`: no prefill leg; the decode pool serves whole requests (an aggregated
 * deployment behind the same router). The decode gets the client's body byte for byte. */
#include "handoff.h"
#include "request.h"
#include "body_src.h"

static char *client_body(struct request *r, size_t *len)
{
    return rw_decode_body(r->src, NULL, 0, len);
}

const struct handoff_ops handoff_none = {
    .t = &rt_handoff_traits[RT_HO_NONE],
    .start = req_start_decode,
    .decode_body = client_body,
    .decode_retry = req_start_decode,
};
