/* SPDX-License-Identifier: Apache-2.0 */
/* sim_http.c - xpyd_sim's small helpers: replies in OpenAI's shape, request bodies, random numbers. */
#include "sim_internal.h"

#include "xpyd_oai.h"
#include "xpyd_sse.h"
#include "xpyd_util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <netinet/in.h>
#include <evhtp/evhtp.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>


uint64_t sim_rand(struct sim *s)
{
    s->rng = xpyd_mix64(s->rng);
    return s->rng;
}

void sim_json_escape_into(const char *in, char *out, size_t cap)
{
    cJSON *str = XPYD_XALLOC(cJSON_CreateString(in));
    char *q = XPYD_XALLOC(cJSON_PrintUnformatted(str));
    size_t n = strlen(q);
    if (n >= 2) { /* strip the quotes */
        q[n - 1] = '\0';
        snprintf(out, cap, "%s", q + 1);
    }
    free(q);
    cJSON_Delete(str);
}

void sim_add_header(evhtp_request_t *req, const char *k, const char *v)
{
    evhtp_headers_add_header(req->headers_out, evhtp_header_new(k, v, 0, 1));
}

const char *sim_body_of(evhtp_request_t *req, size_t *len)
{
    *len = evbuffer_get_length(req->buffer_in);
    return *len ? (const char *)evbuffer_pullup(req->buffer_in, -1) : "";
}

struct timeval sim_us_to_tv(uint64_t us)
{
    struct timeval tv = {(time_t)(us / 1000000u), (suseconds_t)(us % 1000000u)};
    return tv;
}

struct sim_rank *sim_rank_of(void *arg)
{
    return arg;
}
