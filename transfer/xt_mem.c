/* SPDX-License-Identifier: Apache-2.0 */
/* xt_mem.c - registered memory (the ranges peers may read and write), the engine's own descriptor, and the
 * engine's small shared services (wake-up fd, first-error logging). A leaf below the serving side, the
 * transports and the engine. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "xt_internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void xt_wake(xt_engine *e)
{
    uint64_t one = 1;
    if (write(e->evfd, &one, sizeof one) < 0) {
        /* the counter saturated: the reader is already due to wake */
    }
}

int xt_engine_event_fd(const xt_engine *e)
{
    return e ? e->evfd : -EINVAL;
}

void xt_log_error(xt_engine *e, const char *what, int err)
{
    /* first error in full; later ones are counted by their callers' status, not printed again */
    if (atomic_exchange(&e->logged_error, 1) && !e->cfg.verbose)
        return;
    fprintf(stderr, "xpyd_transfer[%s]: %s: %s\n", e->name, what, strerror(-err));
}

int xt_range_ok(const xt_engine *e, uint64_t addr, uint64_t len)
{
    for (size_t i = 0; i < e->nregions; i++) {
        const struct xt_region *r = &e->regions[i];
        if (addr >= r->addr && len <= r->len && addr - r->addr <= r->len - len)
            return 1;
    }
    return 0;
}

/* The CUDA driver API, only if this machine has it: cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_MEMORY_TYPE)
 * says whether a pointer is device memory. */
typedef int (*cu_init_fn)(unsigned);
typedef int (*cu_ptr_attr_fn)(void *data, int attribute, unsigned long long ptr);
static cu_ptr_attr_fn cu_ptr_attr;
static pthread_once_t cu_once = PTHREAD_ONCE_INIT;

static void cu_load(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return;
    cu_init_fn init = (cu_init_fn)dlsym(h, "cuInit");
    cu_ptr_attr_fn attr = (cu_ptr_attr_fn)dlsym(h, "cuPointerGetAttribute");
    if (init && attr && init(0) == 0)
        cu_ptr_attr = attr;
}

int xt_is_device_memory(const void *addr)
{
    pthread_once(&cu_once, cu_load);
    unsigned type = 0;
    enum { CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2, CU_MEMORYTYPE_DEVICE = 2 };
    return cu_ptr_attr && cu_ptr_attr(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (unsigned long long)(uintptr_t)addr) == 0 &&
           type == CU_MEMORYTYPE_DEVICE;
}

int xt_register_memory(xt_engine *e, void *addr, size_t len, const char *location)
{
    if (!e || !addr || !len)
        return -EINVAL;
    uintptr_t a = (uintptr_t)addr;
    if (a + len < a)
        return -EINVAL;
    pthread_rwlock_wrlock(&e->reg_lock);
    int rc = 0;
    for (size_t i = 0; i < e->nregions && !rc; i++)
        if (a < e->regions[i].addr + e->regions[i].len && e->regions[i].addr < a + len)
            rc = -EEXIST;
    if (!rc && e->nregions == e->capregions) {
        size_t nc = e->capregions ? e->capregions * 2 : 8;
        struct xt_region *nr = realloc(e->regions, nc * sizeof *nr);
        if (!nr)
            rc = -ENOMEM;
        else {
            e->regions = nr;
            e->capregions = nc;
        }
    }
    if (!rc) {
        struct xt_region *r = &e->regions[e->nregions];
        memset(r, 0, sizeof *r);
        r->addr = a;
        r->len = len;
        snprintf(r->location, sizeof r->location, "%s", location ? location : "cpu");
        if (e->tp->reg)
            rc = e->tp->reg(e, r); /* rdma: pinned and registered on every device (rkeys published) */
        if (!rc)
            e->nregions++;
    }
    pthread_rwlock_unlock(&e->reg_lock);
    return rc;
}

int xt_unregister_memory(xt_engine *e, void *addr)
{
    if (!e)
        return -EINVAL;
    pthread_rwlock_wrlock(&e->reg_lock); /* waits for peers' transfers into it to finish */
    int rc = -ENOENT;
    for (size_t i = 0; i < e->nregions; i++)
        if (e->regions[i].addr == (uintptr_t)addr) {
            if (e->tp->dereg)
                e->tp->dereg(e, &e->regions[i]);
            e->regions[i] = e->regions[--e->nregions];
            rc = 0;
            break;
        }
    pthread_rwlock_unlock(&e->reg_lock);
    return rc;
}

int xt_describe(xt_engine *e, char *buf, size_t cap)
{
    pthread_rwlock_rdlock(&e->reg_lock);
    size_t n = (size_t)snprintf(buf, cap, "{\"name\":\"%s\",\"host\":\"%s\",\"port\":%d,\"transport\":\"%s\",\"max_frame\":%zu",
                                e->name, e->host, e->port, e->tp->name, e->cfg.max_frame_bytes);
    if (e->tp->describe && n < cap)
        n += e->tp->describe(e, NULL, buf + n, cap - n);
    if (n < cap)
        n += (size_t)snprintf(buf + n, cap - n, ",\"buffers\":[");
    for (size_t i = 0; i < e->nregions && n < cap; i++) {
        n += (size_t)snprintf(buf + n, cap - n, "%s{\"addr\":%" PRIu64 ",\"len\":%zu,\"location\":\"%s\"", i ? "," : "",
                              (uint64_t)e->regions[i].addr, e->regions[i].len, e->regions[i].location);
        if (e->tp->describe && n < cap)
            n += e->tp->describe(e, &e->regions[i], buf + n, cap - n);
        if (n < cap)
            n += (size_t)snprintf(buf + n, cap - n, "}");
    }
    if (n < cap)
        n += (size_t)snprintf(buf + n, cap - n, "]}");
    pthread_rwlock_unlock(&e->reg_lock);
    return n < cap ? (int)n : -ENOSPC;
}

int xt_segment_descriptor(xt_engine *e, char *buf, size_t cap)
{
    return e && buf ? xt_describe(e, buf, cap) : -EINVAL;
}

int xt_local_ok(xt_engine *e, const void *p, size_t len)
{
    pthread_rwlock_rdlock(&e->reg_lock);
    int ok = xt_range_ok(e, (uintptr_t)p, len);
    pthread_rwlock_unlock(&e->reg_lock);
    return ok;
}

