/* SPDX-License-Identifier: Apache-2.0 */
/* stream.h - what the client of a generate request receives (stream.c): a JSON answer, or an SSE stream relayed
 * event by event from the decode. */
#ifndef XPYD_STREAM_H
#define XPYD_STREAM_H

#include "request_state.h"

#include <stddef.h>

void client_answer_json(struct request *r, int status, const char *body, size_t len);
/* An error in OpenAI's shape: an answer before the first byte, else an error event and [DONE]. */
void client_error(struct request *r, int status, const char *msg);
void client_stream_start(struct request *r);
void client_stream_end(struct request *r);
/* The decode's body bytes of a streamed answer, relayed event by event; -1 when the stream is broken. */
int client_relay(struct request *r, const char *data, size_t len);
/* The decode's socket read is relayed (r->in_read ends): what it queued goes out in one write. */
void client_read_done(struct request *r);
/* First token from the prefill: the client's first event(s), built from the prefill's answer. */
void client_prefill_first_token(struct request *r);
/* The decode's non-streamed answer, usage patched; -1 when it is not JSON. */
int client_finish_json(struct request *r);
void client_stream_free(struct request *r);
/* An answer completed before its request ended is written only then (req_end): a client that has read its answer
 * finds the request counted, its load released, its body freed. */
void client_finish_held(struct request *r);

#endif
