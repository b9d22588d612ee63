/* admin_parse.c - POST /admin/instances body (see admin_parse.h). */
#include "admin_parse.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

static int json_long(const cJSON *o, const char *k, long lo, long hi, long def, long *out, char *err, size_t cap)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v) {
        *out = def;
        return 0;
    }
    /* range first: converting an out-of-range double to an integer is undefined behaviour */
    if (!cJSON_IsNumber(v) || v->valuedouble < (double)lo || v->valuedouble > (double)hi ||
        v->valuedouble != (double)(long)v->valuedouble) {
        snprintf(err, cap, "'%s' must be an integer in [%ld, %ld]", k, lo, hi);
        return -1;
    }
    *out = (long)v->valuedouble;
    return 0;
}

int rt_admin_parse_instance(const char *json, size_t len, const struct rt_admin_defaults defaults[2], int dp_internal,
                            struct rt_admin_instance *out, char *err, size_t cap)
{
    memset(out, 0, sizeof *out);
    err[0] = 0;
    cJSON *o = cJSON_ParseWithLength(json, len);
    const cJSON *jr = cJSON_GetObjectItemCaseSensitive(o, "role");
    const cJSON *jh = cJSON_GetObjectItemCaseSensitive(o, "host");
    int role = !cJSON_IsString(jr) ? -1 : !strcmp(jr->valuestring, "prefill") ? 0
                                        : !strcmp(jr->valuestring, "decode") ? 1 : -1;
    if (!cJSON_IsObject(o))
        snprintf(err, cap, "the body must be a JSON object");
    else if (role < 0)
        snprintf(err, cap, "'role' must be \"prefill\" or \"decode\"");
    else if (!cJSON_IsString(jh) || !jh->valuestring[0] || strlen(jh->valuestring) > 255)
        snprintf(err, cap, "'host' must be a non-empty string");
    else if (!json_long(o, "port", 1, 65535, 0, &out->port, err, cap) && out->port == 0)
        snprintf(err, cap, "'port' is required");
    if (!err[0]) {
        const struct rt_admin_defaults *d = &defaults[role];
        if (json_long(o, "dp", 1, 1024, d->dp, &out->dp, err, cap) ||
            json_long(o, "tp", 1, 1024, d->tp, &out->tp, err, cap) ||
            json_long(o, "weight", 1, 1000000, 1, &out->weight, err, cap) ||
            json_long(o, "max_inflight", 0, 1000000, d->max_inflight, &out->max_inflight, err, cap) ||
            json_long(o, "max_model_len", 0, 1L << 40, 0, &out->max_model_len, err, cap) ||
            json_long(o, "bootstrap_port", 0, 65535, 0, &out->bootstrap_port, err, cap))
            ;
        else if (!dp_internal && out->port + out->dp - 1 > 65535)
            snprintf(err, cap, "port + dp - 1 is above 65535");
        const cJSON *jt = cJSON_GetObjectItemCaseSensitive(o, "tls");
        if (!err[0] && jt && !cJSON_IsBool(jt))
            snprintf(err, cap, "'tls' must be true or false");
        out->tls = cJSON_IsTrue(jt);
    }
    if (!err[0]) {
        out->role = role;
        snprintf(out->host, sizeof out->host, "%s", jh->valuestring);
    }
    cJSON_Delete(o);
    return err[0] ? -1 : 0;
}
