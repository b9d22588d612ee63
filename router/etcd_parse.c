/* etcd_parse.c - keys and values of the --discovery layout (docs/PROTOCOLS.md#etcd); see etcd_parse.h. */
#include "etcd_parse.h"

#include "xpyd_util.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int esync_instance_key(const char *rest, int *role, char *host, size_t hcap, long *port)
{
    const char *slash = strchr(rest, '/');
    if (!slash)
        return -1;
    size_t rl = (size_t)(slash - rest);
    if (rl == 7 && !strncmp(rest, "prefill", 7))
        *role = 0;
    else if (rl == 6 && !strncmp(rest, "decode", 6))
        *role = 1;
    else
        return -1;
    int p = 0; /* a port is required */
    if (xpyd_parse_hostport(slash + 1, host, hcap, &p) != 0 || p == 0 || strpbrk(host, "/[]"))
        return -1;
    *port = p;
    return 0;
}

char *esync_instance_body(int role, const char *host, long port, const char *val, char *err, size_t cap)
{
    cJSON *o = val[0] ? cJSON_Parse(val) : cJSON_CreateObject();
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        snprintf(err, cap, "the value is not a JSON object");
        return NULL;
    }
    /* the key says who it is; the value how it is used */
    cJSON_DeleteItemFromObjectCaseSensitive(o, "role");
    cJSON_DeleteItemFromObjectCaseSensitive(o, "host");
    cJSON_DeleteItemFromObjectCaseSensitive(o, "port");
    cJSON_AddStringToObject(o, "role", role ? "decode" : "prefill");
    cJSON_AddStringToObject(o, "host", host);
    cJSON_AddNumberToObject(o, "port", (double)port);
    char *body = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!body)
        snprintf(err, cap, "out of memory");
    return body;
}

int esync_parse_load(const char *val, void (*on_rank)(int role, const char *name, int64_t tokens, int64_t requests,
                                                      void *arg),
                     void *arg)
{
    cJSON *o = cJSON_Parse(val);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return -1;
    }
    int bad = 0;
    for (int role = 0; role < 2; role++) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, role ? "decode" : "prefill");
        for (const cJSON *e = cJSON_IsObject(m) ? m->child : NULL; e; e = e->next) {
            const cJSON *t = cJSON_GetArrayItem(e, 0), *r = cJSON_GetArrayItem(e, 1);
            if (!cJSON_IsArray(e) || !e->string || !cJSON_IsNumber(t) || !cJSON_IsNumber(r) || !(t->valuedouble >= 0) ||
                !(r->valuedouble >= 0) || t->valuedouble > 1e15 || r->valuedouble > 1e9) {
                bad++;
                continue;
            }
            on_rank(role, e->string, (int64_t)t->valuedouble, (int64_t)r->valuedouble, arg);
        }
    }
    cJSON_Delete(o);
    return bad;
}
