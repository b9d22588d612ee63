/* rewrite.h - what the router reads from and writes into request and response JSON, as pure functions
 * (no router state), so they are unit-tested and fuzzed on their own (tests/fuzz/fuzz_rewrite.c). */
#ifndef XPYD_REWRITE_H
#define XPYD_REWRITE_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

/* The client's body exactly as received, with the byte span of each top-level member: the bodies sent to
 * engines are built from these bytes (numbers and strings keep their exact text), changing only the members
 * the router sets or removes. */
struct rw_member {
    char *key;          /* decoded (owned) */
    size_t start, end;  /* the member's bytes: "key" ... value */
    int dup;            /* a later member has the same key: dropped (the last wins, as in Python's json) */
};
struct rw_src {
    char *text;
    size_t len;
    struct rw_member *m;
    size_t n;
    int has_dup;
};
/* Strict JSON (RFC 8259: no trailing data, no NaN/Infinity, valid UTF-8, nesting up to 512) whose top level
 * is an object. Returns the source and *tree (the parsed body, duplicates removed as rw_dedupe_keys does),
 * or NULL with *err (and *err_at, the byte offset) set. */
struct rw_src *rw_src_parse(const char *data, size_t len, cJSON **tree, const char **err, size_t *err_at);
void rw_src_free(struct rw_src *s);
/* 0 when data[0..len) is one strict JSON value (any type) with nothing after it, else -1 with *err_at. */
int rw_json_check(const char *data, size_t len, size_t *err_at);

/* Removes all but the last of each duplicated top-level key, so the router reads what a Python engine
 * (json.loads: the last wins) will read. Call once on the client's body before anything else. */
void rw_dedupe_keys(cJSON *o);
/* What the router itself depends on in a client body. NULL when fine (and *stream, *max_tokens set; 16 when
 * the client gave no limit), else the message for a 400. */
const char *rw_validate(const cJSON *body, int chat, int *stream, int64_t *max_tokens);
/* Prompt size in tokens: token-id arrays exactly, text by bytes_per_token, chat messages + 4 each. */
int64_t rw_estimate_prompt(const cJSON *body, int chat, double bytes_per_token);
/* Chained prefix-block hashes of the request's prompt (xb_prefix.h) into *out (malloc'd; NULL when none):
 * token-id prompts by ids, block_tokens per block; text prompts by bytes, block_tokens × bytes_per_token per
 * block; chat requests over a canonical serialization of the messages in order (role, name, content text,
 * other content parts as JSON, tool calls, tool_call_id), so an earlier turn is a prefix of the next.
 * Returns the number of blocks. */
size_t rw_prefix_blocks(const cJSON *body, int chat, size_t block_tokens, double bytes_per_token, uint64_t **out);
/* Serialises o (never NULL: aborts on OOM); *len its length. */
char *rw_print(const cJSON *o, size_t *len);
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
/* A migrated stream's continuation (decode migration): the client's body whose prompt (completions: the
 * string prompt + text; chat: messages + an assistant message with text, continue_final_message) already
 * holds what the client received, max/min tokens reduced by delivered, no kv_transfer_params. NULL when the
 * prompt cannot be continued (token ids). */
char *rw_continuation_body(const struct rw_src *client, const cJSON *body, int chat, const char *text,
                           int64_t delivered, size_t *len);
/* A continuation's usage as one engine would have reported it: the delivered tokens the continuation read as
 * prompt move back to completion_tokens (total unchanged). 1 when a usage object was patched. */
int rw_patch_usage_continuation(cJSON *o, long delivered);
/* The dispatch-and-cancel body that frees a prefill's KV: kv_transfer_params, max_tokens 1, not streamed. */
char *rw_kv_release_body(const struct rw_src *client, const char *kv_params, size_t *len);

/* What the router keeps from a prefill's (non-streamed) answer. */
struct rw_prefill_answer {
    char *kv_params;       /* kv_transfer_params as compact JSON text, what the decode receives (owned), or NULL:
                            * text, not a tree: ~150 bytes instead of ~800 held for every waiting stream */
    int64_t prompt_tokens; /* usage.prompt_tokens, or -1 */
    long cached_tokens;    /* usage.prompt_tokens_details.cached_tokens, or -1 */
    char *id;              /* owned, or NULL */
    char *first_text;      /* choices[0].text or .message.content (owned), or NULL */
};
/* 0, or -1 when the answer is not a JSON object. Out-of-range numbers are ignored. */
int rw_absorb_prefill(const char *json, size_t len, struct rw_prefill_answer *out);
void rw_prefill_answer_free(struct rw_prefill_answer *a);
/* A decode event's usage: prompt_tokens_details.cached_tokens set to the prefill's (cached >= 0), or the
 * details removed (cached < 0: the truth is unknown). 1 when o changed. */
int rw_patch_usage(cJSON *o, long cached_tokens);
/* choices[0].text, or choices[0].delta.content, or NULL. */
const char *rw_event_text(const cJSON *o);

#endif
