/* SPDX-License-Identifier: Apache-2.0 */
/* xt_desc.c - the one reader of a peer's descriptor (the JSON an engine publishes about itself: transport,
 * frame limit, RDMA devices, registered buffers and their rkeys). */
#include "xt_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

int xt_desc_parse(const char *json, struct xt_desc *d)
{
    memset(d, 0, sizeof *d);
    cJSON *o = json ? cJSON_Parse(json) : NULL;
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return -EPROTO;
    }
    const cJSON *tr = cJSON_GetObjectItemCaseSensitive(o, "transport");
    const cJSON *mf = cJSON_GetObjectItemCaseSensitive(o, "max_frame");
    const cJSON *nics = cJSON_GetObjectItemCaseSensitive(o, "nics");
    const cJSON *bufs = cJSON_GetObjectItemCaseSensitive(o, "buffers");
    d->rdma = cJSON_IsString(tr) && strcmp(tr->valuestring, "rdma") == 0;
    if (cJSON_IsNumber(mf) && mf->valuedouble >= 0 && mf->valuedouble < 1e18)
        d->max_frame = (uint64_t)mf->valuedouble;
    d->nnics = cJSON_IsArray(nics) ? cJSON_GetArraySize(nics) : 0;
    int nb = cJSON_IsArray(bufs) ? cJSON_GetArraySize(bufs) : 0;
    d->bufs = calloc((size_t)nb + 1, sizeof *d->bufs);
    if (!d->bufs) {
        cJSON_Delete(o);
        return -ENOMEM;
    }
    const cJSON *b;
    cJSON_ArrayForEach(b, bufs)
    {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(b, "addr"), *l = cJSON_GetObjectItemCaseSensitive(b, "len");
        const cJSON *rk = cJSON_GetObjectItemCaseSensitive(b, "rkeys");
        /* a peer's numbers are checked before they are converted: a double out of range is undefined behaviour */
        if (!cJSON_IsNumber(a) || !cJSON_IsNumber(l) || !(a->valuedouble >= 0 && a->valuedouble < 0x1p64) ||
            !(l->valuedouble >= 0 && l->valuedouble < 0x1p64))
            continue;
        struct xt_desc_buf *out = &d->bufs[d->nbufs++];
        out->addr = (uint64_t)a->valuedouble;
        out->len = (uint64_t)l->valuedouble;
        int nk = cJSON_IsArray(rk) ? cJSON_GetArraySize(rk) : 0;
        for (int i = 0; i < nk && i < XT_MAX_NICS; i++) {
            const cJSON *k = cJSON_GetArrayItem(rk, i);
            out->rkey[i] = cJSON_IsNumber(k) && k->valuedouble >= 0 && k->valuedouble < 0x1p32 ? (uint32_t)k->valuedouble : 0;
        }
        out->nrkeys = nk;
    }
    cJSON_Delete(o);
    return 0;
}

void xt_desc_free(struct xt_desc *d)
{
    free(d->bufs);
    d->bufs = NULL;
    d->nbufs = 0;
}
