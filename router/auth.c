/* SPDX-License-Identifier: Apache-2.0 */
/* auth.c - the router's keys: the client --api-key on every endpoint but /health and /metrics. A leaf every
 * router module may call. */
#include "router.h"

#include "xpyd_reply.h"

#include <evhtp/evhtp.h>

int rt_bearer_ok(evhtp_request_t *req, const char *key)
{
    return xpyd_bearer_value_ok(evhtp_header_find(req->headers_in, "Authorization"), key);
}

int rt_authorized(evhtp_request_t *req)
{
    const char *key = g_rt->cfg.api_key;
    if (!key[0] || rt_bearer_ok(req, key))
        return 1;
    evhtp_headers_add_header(req->headers_out, evhtp_header_new("WWW-Authenticate", "Bearer", 0, 0));
    xpyd_reply_error(req, 401, "invalid or missing API key: send Authorization: Bearer <key>");
    return 0;
}
