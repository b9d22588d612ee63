/* SPDX-License-Identifier: Apache-2.0 */
/* tok_lru.h - a use-ordered list, most recently used first, with a node inside each element (the tokenization
 * cache's pieces, tok_cache.c; the request templates kept compiled, tok_chat.c). TOK_LRU_OF(node, type, member): the
 * element a node is in. The caller holds whatever lock guards the list. */
#ifndef XPYD_TOK_LRU_H
#define XPYD_TOK_LRU_H

#include <stddef.h>

struct tok_lnode {
    struct tok_lnode *prev, *next;
};

struct tok_lru {
    struct tok_lnode *head, *tail; /* head: most recently used; tail: the next one out */
};

#define TOK_LRU_OF(node, type, member) ((type *)((char *)(node)-offsetof(type, member)))

static inline void tok_lru_unlink(struct tok_lru *l, struct tok_lnode *n)
{
    *(n->prev ? &n->prev->next : &l->head) = n->next;
    *(n->next ? &n->next->prev : &l->tail) = n->prev;
    n->prev = n->next = NULL;
}

static inline void tok_lru_front(struct tok_lru *l, struct tok_lnode *n)
{
    n->prev = NULL;
    n->next = l->head;
    *(l->head ? &l->head->prev : &l->tail) = n;
    l->head = n;
}

/* n used now: first */
static inline void tok_lru_touch(struct tok_lru *l, struct tok_lnode *n)
{
    tok_lru_unlink(l, n);
    tok_lru_front(l, n);
}

#endif
