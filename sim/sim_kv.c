/* SPDX-License-Identifier: Apache-2.0 */
/* sim_kv.c - the simulated KV bytes a prefill hands over (derived from the prompt, so a decode can verify
 * them) and the KV store of store mode (files under --store-dir, named by the prompt's hash). */
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

unsigned char *sim_kv_make(const struct sreq *r, size_t *len)
{
    size_t bpt = (size_t)r->sim->cfg.kv_bytes_per_token;
    *len = r->p.prompt.n * bpt;
    unsigned char *kv = XPYD_XALLOC(malloc(*len ? *len : 1));
    sim_kv_fill(&r->p.prompt, bpt, kv);
    return kv;
}

int sim_kv_verify(const struct sreq *r, const unsigned char *data, size_t len)
{
    size_t elen;
    unsigned char *exp = sim_kv_make(r, &elen);
    int ok = elen == len && memcmp(exp, data, len) == 0;
    free(exp);
    return ok;
}

/* Prefill side of kv-params: hold the KV under a lease and describe it in kv_out. */
void sim_store_path(const struct sim *s, uint64_t hash, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%016" PRIx64 ".kv", s->cfg.store_dir, hash);
}

int sim_store_write(struct sreq *r)
{
    char path[600], tmp[640];
    sim_store_path(r->sim, r->p.prompt.hash, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.%d.%" PRIu64 ".tmp", path, (int)getpid(), ++r->sim->seq);
    size_t len;
    unsigned char *kv = sim_kv_make(r, &len);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int ok = fd >= 0 && write(fd, kv, len) == (ssize_t)len;
    if (fd >= 0)
        close(fd);
    free(kv);
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        XLOG_WARN("msg=\"store write failed\" path=%s errno=%d", path, errno);
        return -1;
    }
    r->sim->kv_bytes_sent += len;
    return 0;
}

/* 1: found and valid, 0: not there (yet), -1: there but corrupt. */
int sim_store_read(struct sreq *r)
{
    char path[600];
    sim_store_path(r->sim, r->p.prompt.hash, path, sizeof path);
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    size_t cap = r->p.prompt.n * (size_t)r->sim->cfg.kv_bytes_per_token + 1;
    unsigned char *buf = XPYD_XALLOC(malloc(cap));
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    int ok = sim_kv_verify(r, buf, n);
    free(buf);
    if (ok)
        r->sim->kv_bytes_received += n;
    return ok ? 1 : -1;
}

/* Decode got its KV (or gave up and recomputes): move on to generating. */
