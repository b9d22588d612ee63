/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_etcd.c - libFuzzer harness: what --discovery reads from etcd. The first byte picks the surface:
 *   0: an instance key "<role>/<host>:<port>" and its value (after the first newline), through to the admin
 *      API's parser, as etcd_sync.c does; an accepted one has a role, a host without '/' and a port;
 *   1: a router's published load; every reported rank has a name and counts in range;
 *   2: a watch stream (chunked at arbitrary points): messages split, their kvs decoded (base64 bounded by the
 *      buffers, NUL-terminated), revisions read;
 *   3: base64 round trip: encoding any bytes and decoding gives them back. */
#include "admin_parse.h"
#include "etcd_parse.h"
#include "json_view.h"
#include "xpyd_etcd.h"

#include <cjson/cJSON.h>
#include <event2/buffer.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void on_rank(int role, const char *name, int64_t tokens, int64_t requests, void *arg)
{
    if ((role != 0 && role != 1) || !name || tokens < 0 || tokens > (int64_t)1e15 || requests < 0 ||
        requests > (int64_t)1e9)
        abort();
    ++*(int *)arg;
}

static void instance(const char *s, size_t n)
{
    const char *nl = memchr(s, '\n', n);
    char key[512], *val = NULL;
    size_t kl = nl ? (size_t)(nl - s) : n;
    if (kl >= sizeof key)
        return;
    memcpy(key, s, kl);
    key[kl] = 0;
    size_t vl = nl ? n - kl - 1 : 0;
    val = malloc(vl + 1);
    memcpy(val, nl ? nl + 1 : "", vl);
    val[vl] = 0;
    int role;
    long port;
    char host[256], err[300] = "";
    if (esync_instance_key(key, &role, host, sizeof host, &port) == 0) {
        if ((role != 0 && role != 1) || !host[0] || strchr(host, '/') || port < 1 || port > 65535)
            abort();
        char *body = esync_instance_body(role, host, port, val, err, sizeof err);
        if (!body && !err[0])
            abort();
        if (body) {
            if (jv_check(body, strlen(body), NULL, NULL) != 0)
                abort(); /* the value's members spliced after the key's: still one strict JSON object */
            static const struct rt_admin_defaults defs[2] = {{1, 1, 0}, {1, 1, 0}};
            struct rt_admin_instance in;
            if (rt_admin_parse_instance(body, strlen(body), defs, 0, &in, err, sizeof err) == 0 &&
                (in.role != role || in.port != port || strcmp(in.host, host) != 0))
                abort(); /* the key, not the value, says who it is */
            free(body);
        }
    }
    free(val);
}

static void stream(const uint8_t *d, size_t n)
{
    struct evbuffer *b = evbuffer_new();
    size_t off = 0;
    while (off < n) {
        size_t step = 1 + d[off] % 97; /* arbitrary chunking */
        if (step > n - off)
            step = n - off;
        evbuffer_add(b, d + off, step);
        off += step;
        cJSON *msg;
        int rc;
        while ((rc = etcd_next_result(b, 4096, &msg)) == 1) {
            const cJSON *res = cJSON_GetObjectItemCaseSensitive(msg, "result");
            if (!cJSON_IsObject(res))
                abort();
            (void)etcd_i64(res, "compact_revision");
            (void)etcd_i64(cJSON_GetObjectItemCaseSensitive(res, "header"), "revision");
            const cJSON *evs = cJSON_GetObjectItemCaseSensitive(res, "events");
            for (const cJSON *ev = cJSON_IsArray(evs) ? evs->child : NULL; ev; ev = ev->next) {
                char key[64], val[128];
                const cJSON *kv = cJSON_GetObjectItemCaseSensitive(ev, "kv");
                if (etcd_kv(kv, key, sizeof key, val, sizeof val) == 0 &&
                    (strlen(key) >= sizeof key || strlen(val) >= sizeof val || !key[0]))
                    abort();
                (void)etcd_i64(kv, "mod_revision");
            }
            cJSON_Delete(msg);
        }
        if (rc < 0) /* the stream ends here, as the watch does */
            break;
    }
    evbuffer_free(b);
}

static void roundtrip(const uint8_t *d, size_t n)
{
    char enc[4 * 8192 / 3 + 8], dec[8192 + 8];
    if (n > 8192)
        return;
    int el = etcd_b64(d, n, enc, sizeof enc);
    if (el < 0 || (size_t)el != strlen(enc))
        abort();
    int dl = etcd_unb64(enc, dec, sizeof dec);
    if (dl != (int)n || memcmp(dec, d, n) != 0)
        abort();
    char small[4];
    if (n > 0 && etcd_b64(d, n, small, n <= 1 ? 4 : sizeof small) >= 0 && n > 2)
        abort(); /* the bound is checked */
    /* decoding arbitrary text never writes past the buffer */
    char text[64], out[48];
    size_t tl = n < sizeof text - 1 ? n : sizeof text - 1;
    memcpy(text, d, tl);
    text[tl] = 0;
    int ol = etcd_unb64(text, out, sizeof out);
    if (ol >= (int)sizeof out)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const uint8_t *d = data + 1;
    size_t n = size - 1;
    char *s = malloc(n + 1);
    memcpy(s, d, n);
    s[n] = 0;
    int count = 0;
    char err[300];
    switch (data[0] % 4) {
    case 0:
        instance(s, n);
        break;
    case 1:
        if (esync_parse_load(s, on_rank, &count, err, sizeof err) != 0 && !err[0])
            abort(); /* a refusal says why */
        break;
    case 2:
        stream(d, n);
        break;
    default:
        roundtrip(d, n);
    }
    free(s);
    return 0;
}
