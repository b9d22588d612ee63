/* SPDX-License-Identifier: Apache-2.0 */
/* tpl_arena.c - where a chat template's render (and a compiled template) allocates: an arena of chunks, bounded,
 * freed at once, its chunks kept by the thread for its next render; the rendered text's buffer; failing a
 * render (longjmp to xtpl_render with the reason and line). tpl_internal.h. */
#include "tpl_internal.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------- arena ---------------- */

struct tchunk {
    struct tchunk *next;
    size_t used, cap;
    max_align_t data[];
};

/* Chunks a thread's finished renders gave back, reused by its next ones (a render of a long conversation
 * otherwise maps fresh pages for its chunks every time: page faults were most of its cost), at most SPARE_MAX;
 * freed when the thread ends (a key's destructor: a thread-local pointer would leak them). */
#define SPARE_MAX (16u << 20)
struct spare {
    struct tchunk *head;
    size_t bytes;
};
static pthread_key_t spare_key;
static pthread_once_t spare_once = PTHREAD_ONCE_INIT;

static void spare_free(void *arg)
{
    struct spare *sp = arg;
    for (struct tchunk *c = sp->head, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    free(sp);
}

static void spare_init(void)
{
    pthread_key_create(&spare_key, spare_free);
}

static struct spare *spare_of_thread(void)
{
    pthread_once(&spare_once, spare_init);
    struct spare *sp = pthread_getspecific(spare_key);
    if (!sp && (sp = calloc(1, sizeof *sp)) && pthread_setspecific(spare_key, sp) != 0) {
        free(sp);
        sp = NULL;
    }
    return sp;
}

static void *arena_take(struct tarena *a, size_t n, int zero)
{
    n = (n + 15) & ~(size_t)15;
    struct tchunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > (64u << 10) ? n : (64u << 10);
        if (a->used + cap > a->limit)
            return NULL;
        c = NULL;
        struct spare *sp = spare_of_thread();
        for (struct tchunk **pp = sp ? &sp->head : NULL; pp && *pp; pp = &(*pp)->next)
            if ((*pp)->cap >= cap) {
                c = *pp;
                *pp = c->next;
                sp->bytes -= c->cap;
                cap = c->cap;
                break;
            }
        if (!c && !(c = malloc(sizeof *c + cap)))
            return NULL;
        c->used = 0;
        c->cap = cap;
        c->next = a->head;
        a->head = c;
        a->used += cap;
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    if (zero)
        memset(p, 0, n);
    return p;
}

void *tarena_alloc(struct tarena *a, size_t n)
{
    return arena_take(a, n, 1);
}

void tarena_free(struct tarena *a)
{
    struct spare *sp = a->head ? spare_of_thread() : NULL;
    for (struct tchunk *c = a->head, *n; c; c = n) {
        n = c->next;
        if (sp && sp->bytes + c->cap <= SPARE_MAX) {
            c->next = sp->head;
            sp->head = c;
            sp->bytes += c->cap;
        } else {
            free(c);
        }
    }
    a->head = NULL;
    a->used = 0;
}

void *tpl_alloc_raw(struct tctx *c, size_t n)
{
    void *p = arena_take(&c->arena, n, 0);
    if (!p)
        tpl_fail(c, "the render needs more than its memory limit (%zu bytes)", c->arena.limit);
    return p;
}

void *tpl_alloc(struct tctx *c, size_t n)
{
    void *p = tarena_alloc(&c->arena, n);
    if (!p)
        tpl_fail(c, "the render needs more than its memory limit (%zu bytes)", c->arena.limit);
    return p;
}

_Noreturn void tpl_fail(struct tctx *c, const char *fmt, ...)
{
    va_list ap;
    int k = snprintf(c->err, c->errlen, "chat template line %d: ", c->line);
    va_start(ap, fmt);
    if (k >= 0 && (size_t)k < c->errlen)
        vsnprintf(c->err + k, c->errlen - (size_t)k, fmt, ap);
    va_end(ap);
    longjmp(c->jb, 1);
}

void tpl_emit(struct tctx *c, const char *p, size_t n)
{
    if (!n)
        return;
    if (c->outn + n > c->outmax)
        tpl_fail(c, "the rendered prompt exceeds its limit (%zu bytes)", c->outmax);
    if (c->outn + n > c->outcap) {
        /* first sized for what the request holds (and a header's worth): a long conversation is not copied
         * again each time the output doubles */
        size_t cap = c->outcap ? c->outcap : c->json_bytes + 4096 < c->outmax ? c->json_bytes + 4096 : c->outmax;
        while (cap < c->outn + n)
            cap *= 2;
        char *o = realloc(c->out, cap + 1);
        if (!o)
            tpl_fail(c, "out of memory");
        c->out = o;
        c->outcap = cap;
    }
    memcpy(c->out + c->outn, p, n);
    c->outn += n;
}

_Noreturn void tpl_undefined_use(struct tctx *c, const struct tv *v)
{
    tpl_fail(c, "'%s' is undefined", v->undef_name ? v->undef_name : "value");
}

/* After an error: the outputs of the captures under way freed, back to that of upto (NULL: the render's own) */
void tpl_uncapture(struct tctx *c, struct tcapture *upto)
{
    while (c->captures != upto) {
        struct tcapture *k = c->captures;
        free(c->out);
        c->out = k->out;
        c->outn = k->outn;
        c->outcap = k->outcap;
        c->captures = k->outer;
    }
}
