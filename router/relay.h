/* relay.h - what the router does with each SSE event of a decode's stream, as a pure function (no I/O, no
 * router state): forward the engine's bytes, forward a rewritten JSON event, or drop it. stream.c does the
 * writing, counting and placement side effects; tests/fuzz/fuzz_relay.c fuzzes this decision directly. */
#ifndef XPYD_RELAY_H
#define XPYD_RELAY_H

#include <cjson/cJSON.h>
#include <stddef.h>

struct relay_state {
    /* this request's settings */
    int prefill_mode;       /* the client already has the prefill's token (--first-token prefill, streamed) */
    int prefill_answered;   /* a prefill answered: usage's cached_tokens becomes cached_tokens */
    long cached_tokens;     /* the prefill's usage.prompt_tokens_details.cached_tokens, -1 unknown */
    const char *first_text; /* prefill mode: the prefill's token, or NULL */
    const char *resp_id;    /* prefill mode: the id every event carries, or NULL */
    /* progress, kept between events */
    int role_sent;          /* chat: the role chunk already went to the client */
    int first_dropped;      /* prefill mode: the decode's first content event was replaced */
    int done_seen;          /* data: [DONE] arrived */
};

enum relay_action { RELAY_FORWARD = 0, RELAY_REWRITE, RELAY_DROP };

struct relay_out {
    int action;    /* enum relay_action */
    cJSON *json;   /* RELAY_REWRITE: the event to send instead (the caller frees it) */
    int content;   /* the decode produced a token (its load falls by one; repeat-mode clones may start) */
    int token_out; /* a token reaches the client (counted, inter-token latency) */
    int mismatch;  /* prefill mode: the decode's first token differs from the prefill's */
    int done;      /* this was data: [DONE] */
};

/* One event's payload (data, NUL-terminated, len bytes, "data: " and the blank line removed). */
void relay_event(struct relay_state *st, const char *data, size_t len, struct relay_out *out);

#endif
