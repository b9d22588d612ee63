/* SPDX-License-Identifier: Apache-2.0 */
/* config_file.c - xpyd_router's JSON configuration file (--config; conf/ has examples) and the pools' host
 * lists, which the command line fills too. */
#include "config.h"
#include "kv_endpoint.h"
#include "config_internal.h"

#include "json_view.h"
#include "xb.h"
#include "xpyd_util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct rt_host *rt_pool_add(struct rt_pool_cfg *p)
{
    if (p->n == p->cap) {
        size_t nc = p->cap ? p->cap * 2 : 8;
        struct rt_host *nh = realloc(p->hosts, nc * sizeof *nh);
        if (!nh)
            return NULL;
        p->hosts = nh;
        p->cap = nc;
    }
    struct rt_host *h = &p->hosts[p->n++];
    memset(h, 0, sizeof *h); /* port 0: none given (an engine address needs one: never a default) */
    return h;
}

/* Adds each comma-separated HOST:PORT of s. */
int rt_pool_add_list(struct rt_pool_cfg *p, const char *s, const char *what)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", s);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ')
            tok++;
        if (!*tok)
            continue;
        struct rt_host *h = rt_pool_add(p);
        if (!h)
            return -1;
        if (!strncmp(tok, "https://", 8)) { /* an engine behind TLS (--upstream-ca verifies it) */
            h->tls = 1;
            tok += 8;
        } else if (!strncmp(tok, "http://", 7)) {
            tok += 7;
        }
        size_t tl = strlen(tok);
        if (tl && tok[tl - 1] == '/')
            tok[tl - 1] = '\0';
        if (xpyd_parse_hostport(tok, h->host, sizeof h->host, &h->port) != 0) {
            fprintf(stderr, "xpyd_router: bad %s address '%s' (want HOST:PORT or [V6]:PORT)\n", what, tok);
            return -1;
        }
        if (h->port == 0) { /* a default port would be the router's own (8000): one request would fan out */
            fprintf(stderr, "xpyd_router: %s address '%s' has no port: write HOST:PORT (the engine's port)\n", what,
                    tok);
            return -1;
        }
    }
    return 0;
}

/* A topology file's key equals want when they differ only in '-' for '_' (as on the command line). */
static int key_is(const char *k, const char *want)
{
    for (; *k && *want; k++, want++)
        if (*k != *want && !(*k == '-' && *want == '_'))
            return 0;
    return *k == *want;
}

static const cJSON *json_get(const cJSON *o, const char *want)
{
    const cJSON *it;
    cJSON_ArrayForEach(it, o)
    {
        if (it->string && key_is(it->string, want))
            return it;
    }
    return NULL;
}

/* A key given twice in object o (as written, or once with '-' and once with '_'): an error naming it. A file is
 * written by hand, so two values for one setting are a mistake, not a choice (client bodies, admin bodies and
 * etcd values, written by programs, read the last: docs/PROTOCOLS.md). */
static int json_no_repeats(const cJSON *o, const char *where)
{
    for (const cJSON *a = o ? o->child : NULL; a; a = a->next)
        for (const cJSON *b = a->next; b; b = b->next)
            if (a->string && b->string && (key_is(a->string, b->string) || key_is(b->string, a->string))) {
                fprintf(stderr, "xpyd_router: config: \"%s\" is given twice in %s\n", b->string, where);
                return -1;
            }
    return 0;
}

/* Every key of object o (at path `where`) must be one of allowed[] (or a "_comment"), once; else an error
 * naming the key's whole path. */
static int json_known_keys(const cJSON *o, const char *const *allowed, const char *where)
{
    if (json_no_repeats(o, where))
        return -1;
    const cJSON *it;
    cJSON_ArrayForEach(it, o)
    {
        if (!it->string || it->string[0] == '_')
            continue;
        int ok = 0;
        for (const char *const *a = allowed; *a && !ok; a++)
            ok = key_is(it->string, *a);
        if (!ok) {
            fprintf(stderr, "xpyd_router: config: unknown key \"%s.%s\" (known there:", where, it->string);
            for (const char *const *a = allowed; *a; a++)
                fprintf(stderr, " %s", *a);
            fprintf(stderr, ")\n");
            return -1;
        }
    }
    return 0;
}

/* Reads an integer field in [0, 2^31); an absent field leaves *out; anything else is an error. */
static int json_int(const cJSON *o, const char *k, int *out, const char *where)
{
    const cJSON *v = json_get(o, k);
    if (!v)
        return 0;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble < 2147483648.0) ||
        v->valuedouble != (double)(int)v->valuedouble) {
        fprintf(stderr, "xpyd_router: config: \"%s.%s\" must be a non-negative integer\n", where, k);
        return -1;
    }
    *out = (int)v->valuedouble;
    return 0;
}

static const char *const pool_keys[] = {"hosts", "dp", "tp", "max_inflight", "policy", NULL};
static const char *const host_keys[] = {"host", "port", "tls", "dp", "tp", "weight", "bootstrap_port", "max_inflight",
                                        "max_model_len", "kv_events", NULL};

static int load_json_pool(struct rt_pool_cfg *p, const cJSON *o, const char *what)
{
    if (!o)
        return 0;
    if (!cJSON_IsObject(o)) {
        fprintf(stderr, "xpyd_router: config: \"%s\" must be an object {\"hosts\": [...], ...}\n", what);
        return -1;
    }
    if (json_known_keys(o, pool_keys, what) || json_int(o, "dp", &p->dp, what) || json_int(o, "tp", &p->tp, what) ||
        json_int(o, "max_inflight", &p->max_inflight, what))
        return -1;
    const cJSON *pol = json_get(o, "policy");
    if (pol && (!cJSON_IsString(pol) || (p->policy = xb_policy_parse(pol->valuestring)) < 0)) {
        fprintf(stderr, "xpyd_router: config: \"%s.policy\" must be one of %s\n", what, rt_policy_choices());
        return -1;
    }
    const cJSON *hosts = json_get(o, "hosts"), *h;
    if (hosts && !cJSON_IsArray(hosts)) {
        fprintf(stderr, "xpyd_router: config: \"%s.hosts\" must be an array\n", what);
        return -1;
    }
    int i = 0;
    cJSON_ArrayForEach(h, hosts)
    {
        char where[64];
        snprintf(where, sizeof where, "%s.hosts[%d]", what, i++);
        if (cJSON_IsString(h)) {
            if (rt_pool_add_list(p, h->valuestring, what))
                return -1;
            continue;
        }
        const cJSON *host = json_get(h, "host");
        if (!cJSON_IsObject(h) || !cJSON_IsString(host)) {
            fprintf(stderr, "xpyd_router: config: \"%s\" must be \"HOST:PORT\" or an object with \"host\"\n", where);
            return -1;
        }
        if (json_known_keys(h, host_keys, where))
            return -1;
        struct rt_host *rh = rt_pool_add(p);
        if (!rh)
            return -1;
        snprintf(rh->host, sizeof rh->host, "%s", host->valuestring);
        if (!xpyd_host_valid(host->valuestring) || strlen(host->valuestring) >= sizeof rh->host) {
            fprintf(stderr, "xpyd_router: config: \"%s.host\" must be a host name or an IP address (letters, digits, "
                            "'.', '-', '_'; an IPv6 address without brackets)\n", where);
            return -1;
        }
        int mml = 0;
        if (json_int(h, "port", &rh->port, where) || json_int(h, "dp", &rh->dp, where) ||
            json_int(h, "tp", &rh->tp, where) || json_int(h, "weight", &rh->weight, where) ||
            json_int(h, "bootstrap_port", &rh->bootstrap_port, where) ||
            json_int(h, "max_inflight", &rh->max_inflight, where) || json_int(h, "max_model_len", &mml, where))
            return -1;
        rh->max_model_len = mml;
        const cJSON *tls = json_get(h, "tls");
        if (tls && !cJSON_IsBool(tls)) {
            fprintf(stderr, "xpyd_router: config: \"%s.tls\" must be true or false\n", where);
            return -1;
        }
        rh->tls = cJSON_IsTrue(tls);
        const cJSON *kv = json_get(h, "kv_events");
        if (kv && (!cJSON_IsString(kv) || rt_kv_endpoint_check(kv->valuestring) != 0 ||
                   strlen(kv->valuestring) >= sizeof rh->kv_events)) {
            fprintf(stderr, "xpyd_router: config: \"%s.kv_events\" must be \"tcp://HOST:PORT\" (the engine's KV-event "
                            "publisher, its rank 0)\n", where);
            return -1;
        }
        if (kv)
            snprintf(rh->kv_events, sizeof rh->kv_events, "%s", kv->valuestring);
        if (!json_get(h, "port")) {
            fprintf(stderr, "xpyd_router: config: \"%s\" needs a \"port\" (the engine's)\n", where);
            return -1;
        }
        if (rh->port < 1 || rh->port > 65535) {
            fprintf(stderr, "xpyd_router: config: \"%s.port\" must be a port (1-65535), got %d\n", where, rh->port);
            return -1;
        }
    }
    return 0;
}

int rt_config_load_file(struct rt_config *c, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "xpyd_router: cannot open config '%s': %s\n", path, strerror(errno));
        return -1;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0, n;
    char tmp[4096];
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0) {
        if (len + n > cap) {
            cap = (len + n) * 2;
            buf = XPYD_XALLOC(realloc(buf, cap));
        }
        memcpy(buf + len, tmp, n);
        len += n;
    }
    fclose(f);
    /* strict JSON first (the scanner client bodies get): a mistake is named by its line and column */
    const char *why = NULL;
    size_t at = 0;
    if (jv_check(buf ? buf : "", len, &why, &at) != 0) {
        size_t line = 1, col = 1;
        for (size_t i = 0; i < at && i < len; i++)
            if (buf[i] == '\n')
                line++, col = 1;
            else
                col++;
        fprintf(stderr, "xpyd_router: config '%s', line %zu, column %zu: %s\n", path, line, col,
                why ? why : "not valid JSON");
        free(buf);
        return -1;
    }
    cJSON *root = cJSON_ParseWithLength(buf ? buf : "", len);
    free(buf);
    if (!cJSON_IsObject(root)) {
        fprintf(stderr, "xpyd_router: config '%s' is not a JSON object\n", path);
        cJSON_Delete(root);
        return -1;
    }
    int rc = json_no_repeats(root, path);
    const cJSON *it;
    cJSON_ArrayForEach(it, root)
    {
        if (rc)
            break;
        if (!strcmp(it->string, "prefill") || !strcmp(it->string, "decode") || it->string[0] == '_')
            continue; /* pools below; keys starting with '_' are comments */
        if (!rt_config_has_setting(it->string)) {
            fprintf(stderr, "xpyd_router: config '%s': unknown setting \"%s\"\n", path, it->string);
            rc = -1;
            break;
        }
        char val[512];
        if (cJSON_IsString(it))
            snprintf(val, sizeof val, "%s", it->valuestring);
        else if (cJSON_IsNumber(it))
            snprintf(val, sizeof val, "%.17g", it->valuedouble);
        else {
            fprintf(stderr, "xpyd_router: config: \"%s\" must be a string or number\n", it->string);
            rc = -1;
            break;
        }
        if ((rc = rt_config_set_named(c, it->string, val)) != 0)
            break;
    }
    if (rc == 0)
        rc = load_json_pool(&c->pools[RT_PREFILL], cJSON_GetObjectItemCaseSensitive(root, "prefill"), "prefill");
    if (rc == 0)
        rc = load_json_pool(&c->pools[RT_DECODE], cJSON_GetObjectItemCaseSensitive(root, "decode"), "decode");
    cJSON_Delete(root);
    return rc;
}

