/* SPDX-License-Identifier: Apache-2.0 */
/* body_src.h - a client's request body as the router keeps it: the bytes exactly as received, checked strictly
 * once, with the span of each top-level member, read in place (json_view.h: no tree); and the bodies sent to
 * engines, built from those bytes (numbers and strings keep their exact text), changing only the members the
 * router sets or removes. Pure: no router state (unit-tested and fuzzed on its own). */
#ifndef XPYD_BODY_SRC_H
#define XPYD_BODY_SRC_H

#include "json_view.h"

#include <stddef.h>
#include <stdint.h>

struct rw_member {
    char *key;                 /* decoded (owned) */
    size_t start, vstart, end; /* the member's bytes: "key" ... value; the value's first byte */
    int dup;                   /* a later member has the same key: dropped (the last wins, as in Python's json) */
};
struct rw_src {
    char *text;                /* NUL-terminated (owned) */
    size_t len;
    struct rw_member *m;
    size_t n;
    int has_dup;
};
/* Strict JSON (RFC 8259: no trailing data, no NaN/Infinity, valid UTF-8, nesting up to JV_MAX_DEPTH) whose top
 * level is an object of at most max_members members. rw_src_take owns text (malloc'd, len + 1 bytes: a NUL
 * is written at text[len]) from the call on, and frees it on failure; rw_src_parse copies data. NULL with *err
 * (and *err_at, the byte offset) on failure. */
struct rw_src *rw_src_take(char *text, size_t len, size_t max_members, const char **err, size_t *err_at);
struct rw_src *rw_src_parse(const char *data, size_t len, size_t max_members, const char **err, size_t *err_at);
void rw_src_free(struct rw_src *s);
/* The value of top-level member key (the last of a repeated key), or an absent view. */
struct jv rw_src_get(const struct rw_src *s, const char *key);
/* The body as one view (an object). */
struct jv rw_src_view(const struct rw_src *s);

/* The prefill leg's body: max_tokens 1, not streamed, no stream_options/min_tokens; with kv_params, the
 * kv_transfer_params asking the engine to keep the KV for a remote decode. */
char *rw_prefill_body(const struct rw_src *client, int kv_params, size_t *len);
/* The same prefill body with kv_transfer_params set to kv_json (JSON text); NULL: left as the client sent it. */
char *rw_prefill_body_kv(const struct rw_src *client, const char *kv_json, size_t *len);
/* The decode leg's body: the client's; with kv_mode, its kv_transfer_params replaced by the prefill's
 * (removed when the prefill returned none). */
char *rw_decode_body(const struct rw_src *client, const char *kv_params, int kv_mode, size_t *len);
/* SGLang bootstrap body (both legs): the client's with bootstrap_host/port/room (exact integer) and rid. */
char *rw_bootstrap_body(const struct rw_src *client, const char *host, int port, uint64_t room, const char *rid,
                        size_t *len);
/* The dispatch-and-cancel body that frees a prefill's KV: kv_transfer_params, max_tokens 1, not streamed. */
char *rw_kv_release_body(const struct rw_src *client, const char *kv_params, size_t *len);
/* A migrated stream's continuation (decode migration): the client's body whose prompt (completions: the
 * string prompt + text; chat: messages + an assistant message with text, continue_final_message) already
 * holds what the client received, spliced into the client's own bytes; max/min tokens reduced by delivered,
 * no kv_transfer_params. NULL when the prompt cannot be continued (token ids). */
char *rw_continuation_body(const struct rw_src *client, int chat, const char *text, int64_t delivered, size_t *len);

#endif
