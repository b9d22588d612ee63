/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_admin.c - libFuzzer harness: the body of POST /admin/instances as the router reads it
 * (router/admin_parse.c). Checks: a refusal says why; an accepted body yields values inside the documented
 * ranges (role, a host xpyd_host_valid takes, port 1-65535, dp/tp 1-1024, weight >= 1, bootstrap port a port),
 * and is one JSON object for cJSON too (unless it holds a surrogate escape, which cJSON alone refuses). */
#include "admin_parse.h"
#include "xpyd_util.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* a \uD800-\uDFFF escape: the grammar allows it and the router reads it as Python's json.loads does (surrogatepass),
 * cJSON refuses the whole document; such inputs skip the cross-check with cJSON */
static int surrogate_escape(const uint8_t *d, size_t n)
{
    for (size_t i = 0; i + 3 < n; i++)
        if (d[i] == '\\' && d[i + 1] == 'u' && (d[i + 2] | 0x20) == 'd' && d[i + 3] &&
            strchr("89abcdefABCDEF", d[i + 3]))
            return 1;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const struct rt_admin_defaults defs[2] = {{1, 1, 0}, {2, 4, 8}};
    struct rt_admin_instance in;
    char err[300];
    for (int internal = 0; internal < 2; internal++) {
        int rc = rt_admin_parse_instance((const char *)data, size, defs, internal, &in, err, sizeof err);
        if (rc != 0) {
            if (!err[0])
                abort();
            continue;
        }
        if (err[0] || (in.role != 0 && in.role != 1) || !xpyd_host_valid(in.host) || in.port < 1 ||
            in.port > 65535 || in.dp < 1 || in.dp > 1024 || in.tp < 1 || in.tp > 1024 || in.weight < 1 ||
            in.max_inflight < 0 || in.max_model_len < 0 || in.bootstrap_port < 0 || in.bootstrap_port > 65535)
            abort();
        if (!internal && in.port + in.dp - 1 > 65535)
            abort();
        /* an accepted body is one JSON object for an independent reader too (cJSON, nothing after it) */
        char *z = malloc(size + 1);
        memcpy(z, data, size);
        z[size] = 0;
        const char *end = NULL;
        cJSON *ref = cJSON_ParseWithOpts(z, &end, 1);
        int whole = cJSON_IsObject(ref) && end == z + size;
        cJSON_Delete(ref);
        free(z);
        if (!whole && !memchr(data, 0, size) && !surrogate_escape(data, size))
            abort();
    }
    return 0;
}
