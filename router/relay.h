/* SPDX-License-Identifier: Apache-2.0 */
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
    const char *resp_id;    /* prefill mode, continuation: the id every event carries, or NULL */
    int track_text;         /* report each delivered event's text and the first id (decode migration) */
    int continuation;       /* a migrated stream's continuation: no second role chunk, the first leg's id,
                             * usage counted as one engine would have (delivered) */
    long delivered;         /* continuation: tokens the client had before it (usage counted as one engine) */
    /* progress, kept between events */
    int role_sent;          /* chat: the role chunk already went to the client */
    int first_dropped;      /* prefill mode: the decode's first content event was replaced */
    int done_seen;          /* data: [DONE] arrived */
    int preempted;          /* the engine gave the request up (stop_reason "recomputed"): nothing more goes out */
};

enum relay_action { RELAY_FORWARD = 0, RELAY_REWRITE, RELAY_DROP };

struct relay_out {
    int action;    /* enum relay_action */
    cJSON *json;   /* RELAY_REWRITE: the event to send instead (the caller frees it) */
    int content;   /* the decode produced a token (its load falls by one; repeat-mode clones may start) */
    int token_out; /* a token reaches the client (counted, inter-token latency) */
    int mismatch;  /* prefill mode: the decode's first token differs from the prefill's */
    int done;      /* this was data: [DONE] */
    int preempt;   /* this event says the engine preempted the request (stop_reason "recomputed") */
    const char *text; /* track_text: the text this delivered event carries, text_len bytes (never empty), or
                       * NULL; it points into the event's data (no escape in it) or at text_buf */
    size_t text_len;
    char *text_buf;   /* the text unescaped or copied out of a parse (the caller frees it), or NULL */
    char *id;      /* track_text, no resp_id yet: the event's id (the caller frees it), or NULL */
};

/* The keys relay_event looks for in an event's text (data, NUL-terminated, no NUL within len), as a substring
 * search would find them: tests/fuzz/fuzz_relay.c checks it against strstr. */
struct relay_keys {
    const char *choices; /* the first "choices", or NULL */
    int empty_choices;   /* "choices":[] or "choices": [] somewhere (an event without a token) */
    int usage_object;    /* a "usage" key with an object after its colon */
    int recomputed;      /* "recomputed" (a preemption may be said) */
    int role;            /* "role" */
    int text;            /* "text" */
};
void relay_scan(const char *data, size_t len, struct relay_keys *k);

/* One event's payload (data, NUL-terminated, len bytes, "data: " and the blank line removed). */
void relay_event(struct relay_state *st, const char *data, size_t len, struct relay_out *out);

#endif
