/* SPDX-License-Identifier: Apache-2.0 */
/* tok_mem.c - where the tokenization cache's entries live (tok_internal.h). A router's cache holds tens of MB of
 * conversations, and a hit reads a piece's text and ids wherever they were put: with 4 KiB pages a cold hit on a
 * 183 KB history also misses the TLB on most of its pages. When the process runs on jemalloc (found at run time,
 * as router/main.c finds it: the library links no allocator), the entries get an arena of their own whose memory
 * is advised for transparent huge pages (madvise MADV_HUGEPAGE: the kernel's `madvise` mode, Debian's default,
 * backs it with 2 MiB pages; `never` leaves it as it was). Elsewhere (sanitizer builds, glibc), malloc and free. */
#include "tok_internal.h"

#include <stdlib.h>

#if __has_include(<jemalloc/jemalloc.h>) /* its types only: its functions are looked up when the process has them */
#include <dlfcn.h>
#include <jemalloc/jemalloc.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>

static struct {
    int (*mallctl)(const char *, void *, size_t *, void *, size_t);
    void *(*mallocx)(size_t, int);
    void (*dallocx)(void *, int);
    extent_hooks_t *base; /* jemalloc's own hooks, which do the work */
    extent_hooks_t hooks; /* theirs, with alloc advising what it maps */
    int flags;            /* MALLOCX_ARENA(the arena) | MALLOCX_TCACHE_NONE; 0: malloc */
} M;

static void *huge_alloc(extent_hooks_t *h, void *addr, size_t size, size_t align, bool *zero, bool *commit,
                        unsigned arena)
{
    (void)h;
    const size_t huge = 2u << 20; /* x86-64's and arm64's (4 KiB granule) transparent huge page */
    if (!addr && size >= huge && align < huge)
        align = huge; /* an unaligned 2 MiB holds no huge page */
    void *p = M.base->alloc(M.base, addr, size, align, zero, commit, arena);
    if (p)
        madvise(p, size, MADV_HUGEPAGE); /* advice: refused (THP off), the pages stay small */
    return p;
}

static void setup(void)
{
    *(void **)&M.mallctl = dlsym(RTLD_DEFAULT, "mallctl");
    *(void **)&M.mallocx = dlsym(RTLD_DEFAULT, "mallocx");
    *(void **)&M.dallocx = dlsym(RTLD_DEFAULT, "dallocx");
    const char *small = getenv("XPYD_TOKENIZER_CACHE_SMALL_PAGES"); /* 1: the A/B of bench/RESULTS.md */
    if (!M.mallctl || !M.mallocx || !M.dallocx || (small && *small && strcmp(small, "0") != 0))
        return;
    size_t sz = sizeof M.base;
    if (M.mallctl("arena.0.extent_hooks", &M.base, &sz, NULL, 0) != 0 || !M.base)
        return;
    M.hooks = *M.base;
    M.hooks.alloc = huge_alloc;
    extent_hooks_t *hp = &M.hooks;
    unsigned arena;
    sz = sizeof arena;
    if (M.mallctl("arenas.create", &arena, &sz, &hp, sizeof hp) != 0)
        return;
    M.flags = MALLOCX_ARENA(arena) | MALLOCX_TCACHE_NONE;
}

static pthread_once_t once = PTHREAD_ONCE_INIT;

void *tok_mem_alloc(size_t n)
{
    pthread_once(&once, setup);
    return M.flags ? M.mallocx(n ? n : 1, M.flags) : malloc(n);
}

void tok_mem_free(void *p)
{
    pthread_once(&once, setup);
    if (p)
        M.flags ? M.dallocx(p, MALLOCX_TCACHE_NONE) : free(p);
}
#else
void *tok_mem_alloc(size_t n)
{
    return malloc(n);
}

void tok_mem_free(void *p)
{
    free(p);
}
#endif
